"""Views in memory: a chain of view ops (trait VIEW) as an offset and one stride per dim into
the value the chain starts from, so that a kernel reads the chain through strides instead of
copying it (the attention kernel reads the head-splitting views of one qkv buffer). `fuse` and
code generation both ask, so this lives in the core, below both.

Every op with the VIEW trait has its rule in `STRIDE_RULES` (test/test_registry.py checks): how
its result's strides and offset follow from its operand's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tgc.ir import Operation, Value
from tgc.opdef import VIEW
from tgc.types import contiguous_strides

# (op, result, operand shape, operand strides) -> (result strides, added element offset), or
# None where no strides express the result.
StrideRule = Callable[[Operation, Value, list[int], list[int]], "tuple[list[int], int] | None"]


def _transpose(op: Operation, result: Value, shape: list[int], strides: list[int]):
    return [strides[p] for p in op.attr("perm")], 0


def _slice(op: Operation, result: Value, shape: list[int], strides: list[int]):
    starts, steps = op.attr("start"), op.attr("step")
    offset = sum(lo * s for lo, s in zip(starts, strides))
    return [s * st for s, st in zip(strides, steps)], offset


def _split(op: Operation, result: Value, shape: list[int], strides: list[int]):
    axis = op.attr("axis") % len(shape)
    index = list(op.results).index(result)
    return list(strides), sum(op.attr("sizes")[:index]) * strides[axis]


def _broadcast(op: Operation, result: Value, shape: list[int], strides: list[int]):
    out_shape = result.type.shape
    pad = len(out_shape) - len(shape)
    new = [0] * pad
    for d, (n, s) in enumerate(zip(shape, strides)):
        new.append(0 if n == 1 and out_shape[pad + d] != 1 else s)
    return new, 0


def _reshape(op: Operation, result: Value, shape: list[int], strides: list[int]):
    reshaped = reshape_strides(shape, strides, result.type.shape)
    return None if reshaped is None else (reshaped, 0)


STRIDE_RULES: dict[str, StrideRule] = {
    "atomic.transpose": _transpose,
    "atomic.slice": _slice,
    "atomic.split": _split,
    "atomic.broadcast": _broadcast,
    "atomic.reshape": _reshape,
}


def reshape_strides(old_shape, old_strides, new_shape) -> list[int] | None:
    """Strides of a reshape of a strided view without a copy (numpy's rule), or None."""
    old = [(d, s) for d, s in zip(old_shape, old_strides) if d != 1]
    new_dims = list(new_shape)
    if math.prod(old_shape) != math.prod(new_dims):
        return None
    if math.prod(new_dims) == 0:
        return list(contiguous_strides(new_dims))
    out = [0] * len(new_dims)
    nonunit = [i for i, d in enumerate(new_dims) if d != 1]
    oi = ni = 0
    while oi < len(old) and ni < len(nonunit):
        op_, np_ = old[oi][0], new_dims[nonunit[ni]]
        oj, nj = oi + 1, ni + 1
        while op_ != np_:
            if op_ < np_:
                if oj >= len(old):
                    return None
                op_ *= old[oj][0]
                oj += 1
            else:
                if nj >= len(nonunit):
                    return None
                np_ *= new_dims[nonunit[nj]]
                nj += 1
        for k in range(oi, oj - 1):  # the old group must be one contiguous run
            if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                return None
        stride = old[oj - 1][1]
        for k in range(nj - 1, ni - 1, -1):
            out[nonunit[k]] = stride
            stride *= new_dims[nonunit[k]]
        oi, ni = oj, nj
    return out


def strided_layout(v: Value, stop: Callable[[Operation], bool] | None = None):
    """(root, offset, strides) when `v` is a chain of views of `root` (every dim an affine
    function of v's coordinates), else None. The walk stops at a value that no view defines, or
    where `stop(op)` is true."""
    chain = []
    x = v
    while True:
        op = x.defining_op
        if op is None or not op.has_trait(VIEW) or (stop is not None and stop(op)):
            break
        chain.append((op, x))
        x = op.operands[0]
    root = x
    shape = list(root.type.shape)
    strides = list(contiguous_strides(shape))
    offset = 0
    for op, result in reversed(chain):
        layout = STRIDE_RULES[op.name](op, result, shape, strides)
        if layout is None:
            return None
        strides, added = layout
        offset += added
        shape = list(result.type.shape)
    if offset < 0:
        return None
    return root, offset, strides


def is_unit_reshape(op: Operation) -> bool:
    """A reshape that only inserts or removes unit dims (coordinates map one to one)."""
    if op.name != "atomic.reshape":
        return False
    before = [d for d in op.operands[0].type.shape if d != 1]
    after = [d for d in op.results[0].type.shape if d != 1]
    return before == after


def head_grouped_layout(v: Value, stop: Callable[[Operation], bool] | None = None):
    """(root, offset, strides, divisors) when `v` is a strided view (divisors all 1), or when
    it repeats each head of a strided view for a group of heads, as grouped-query attention's
    repeat_kv and enable_gqa write it: `reshape(broadcast(x))` with x [..., h, 1, s, d],
    broadcast to [..., h, g, s, d], reshaped to [..., h * g, s, d]. Then dim -3 of `v` reads
    x's head `i // g`: its stride is x's head stride and its divisor g, so a kernel reads the
    un-expanded heads by index instead of a copy. Else None."""
    found = strided_layout(v, stop)
    if found is not None:
        return (*found, [1] * v.type.rank)
    reshape = v.defining_op
    if reshape is None or reshape.name != "atomic.reshape" or v.type.rank < 3:
        return None
    wide = reshape.operands[0]
    bcast = wide.defining_op
    if bcast is None or bcast.name != "atomic.broadcast" or (stop is not None and stop(bcast)):
        return None
    x = bcast.operands[0]
    if wide.type.rank != v.type.rank + 1:
        return None
    *lead, heads, group, seq, dim = wide.type.shape
    if list(x.type.shape) != [*lead, heads, 1, seq, dim]:
        return None
    if list(v.type.shape) != [*lead, heads * group, seq, dim]:
        return None
    inner = strided_layout(x, stop)
    if inner is None:
        return None
    root, offset, strides = inner
    divisors = [1] * v.type.rank
    divisors[-3] = group
    return root, offset, [*strides[:-4], strides[-4], strides[-2], strides[-1]], divisors


__all__ = [
    "STRIDE_RULES",
    "head_grouped_layout",
    "is_unit_reshape",
    "reshape_strides",
    "strided_layout",
]

"""What the CUDA kernels can run as they are: facts the `place-on-device` pass decides with and
that code generation relies on (codegen imports them from here).

- `attention_supported(op)`: the fused attention kernel (template `attention`) runs this
  `hl.attention` (f32/bf16/f16, head dims <= 128, no empty dim);
- `strided_layout(v)`: `v` as an offset and one stride per dim into the value a chain of views
  starts from, so that the attention kernel reads head-splitting views through strides;
- `cublas_can_run(op)`: cuBLAS runs this `atomic.matmul` (each operand batched like the result
  or unbatched; float element types);
- `contiguous_slice_offset(op)`: where this `atomic.slice` is one contiguous range of its
  row-major operand, the range's first element, so that the plan makes it a view (a pointer
  into the operand's buffer) rather than a copy kernel.
"""

from __future__ import annotations

import math

from tgc.ir import Operation, Value
from tgc.types import contiguous_strides

ATTENTION_TYPES = ("f32", "bf16", "f16")
MAX_HEAD_DIM = 128
GEMM_TYPES = ("f32", "f64", "f16", "bf16")
VIEW_NAMES = (
    "atomic.reshape",
    "atomic.transpose",
    "atomic.slice",
    "atomic.broadcast",
    "atomic.split",
)


def attention_supported(op: Operation) -> bool:
    """Can the fused kernel run this `hl.attention`? f32/bf16/f16, head dims <= 128."""
    q, k, v = (x.type for x in op.operands[:3])
    if q.element_type not in ATTENTION_TYPES:
        return False
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return False
    if min(q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]) < 1:
        return False
    return op.results[0].type.num_elements > 0


def _reshape_strides(old_shape, old_strides, new_shape) -> list[int] | None:
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


def strided_layout(v: Value, stop=None):
    """(root, offset, strides) when `v` is a chain of views of `root` (every dim an affine
    function of v's coordinates), else None. The walk stops at a value that no view defines, or
    where `stop(op)` is true."""
    chain = []
    x = v
    while True:
        op = x.defining_op
        if op is None or op.name not in VIEW_NAMES or (stop is not None and stop(op)):
            break
        chain.append((op, x))
        x = op.operands[0]
    root = x
    shape = list(root.type.shape)
    strides = list(contiguous_strides(shape))
    offset = 0
    for op, result in reversed(chain):
        out_shape = list(result.type.shape)
        if op.name == "atomic.transpose":
            perm = list(op.attr("perm"))
            strides = [strides[p] for p in perm]
        elif op.name == "atomic.slice":
            for d, (lo, st) in enumerate(zip(op.attr("start"), op.attr("step"))):
                offset += lo * strides[d]
                strides[d] *= st
        elif op.name == "atomic.split":
            axis = op.attr("axis") % len(shape)
            index = list(op.results).index(result)
            offset += sum(op.attr("sizes")[:index]) * strides[axis]
        elif op.name == "atomic.broadcast":
            pad = len(out_shape) - len(shape)
            new = [0] * pad
            for d, (n, s) in enumerate(zip(shape, strides)):
                new.append(0 if n == 1 and out_shape[pad + d] != 1 else s)
            strides = new
        elif op.name == "atomic.reshape":
            reshaped = _reshape_strides(shape, strides, out_shape)
            if reshaped is None:
                return None
            strides = reshaped
        shape = out_shape
    if offset < 0:
        return None
    return root, offset, strides


def cublas_can_run(op: Operation) -> bool:
    """cuBLAS runs a matmul whose operands are each either batched like the result or unbatched."""
    out = op.results[0].type
    if out.element_type not in GEMM_TYPES:
        return False
    batch = out.shape[:-2]
    for x in op.operands:
        xb = x.type.shape[:-2]
        if tuple(xb) != tuple(batch) and any(d != 1 for d in xb):
            return False
    return True


def contiguous_slice_offset(op: Operation) -> int | None:
    """The element offset of the range an `atomic.slice` takes, where that range is contiguous
    in its row-major operand: unit steps, some axis `a` before which the slice is one index
    wide, and after which it takes every index. None otherwise."""
    if op.name != "atomic.slice":
        return None
    shape = op.operands[0].type.shape
    start, stop, step = op.attr("start"), op.attr("stop"), op.attr("step")
    if any(s != 1 for s in step):
        return None
    wide = [i for i in range(len(shape)) if stop[i] - start[i] != 1]
    first = wide[0] if wide else len(shape)
    if any(start[i] != 0 or stop[i] != shape[i] for i in range(first + 1, len(shape))):
        return None
    strides = contiguous_strides(shape)
    return sum(start[i] * strides[i] for i in range(len(shape)))


__all__ = ["attention_supported", "contiguous_slice_offset", "cublas_can_run", "strided_layout"]

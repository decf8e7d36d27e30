"""The converter of TopK: the k largest (or smallest) elements along an axis and their
positions, in the atomic ops (which cannot sort).

k rounds of selection: each round takes the maximum of the elements not taken yet and, among
the free positions holding it, the lowest (ONNX: of equal values, the lower index comes
first), then marks that position taken. So k is known at import (it sets the result shapes),
the outputs come sorted whatever `sorted` says (ONNX leaves the order free then), and the graph
grows by a handful of ops per round: fine for a beam or a top-k sampler, heavy for a full sort.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.ir import Value
from tgc.types import TensorType

from .context import NodeContext
from .registry import converter


def _sentinel(x: Value, largest: bool):
    """A value no element beats: what a taken position holds while the others are compared."""
    if x.type.is_float:
        return -math.inf if largest else math.inf
    info = np.iinfo(x.type.dtype)
    return int(info.min if largest else info.max)


@converter("TopK")
def top_k(ctx: NodeContext):
    x = ctx.input(0)
    k_values = ctx.require_static(1, "'K'").reshape(-1)
    if k_values.size != 1:
        raise ctx.error(f"K must have one element, got {k_values.size}")
    k = int(k_values[0])
    rank = x.type.rank
    axis = ctx.attr("axis", -1)
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    largest = bool(ctx.attr("largest", 1))
    ctx.ignore_attr("sorted")  # the rounds give sorted outputs, which "unsorted" allows
    size = x.type.shape[axis]
    if not 0 <= k <= size:
        raise ctx.error(f"K {k} is out of range for dim {axis} of size {size}")
    if x.type.element_type == "i1":
        raise ctx.error(f"needs numbers, got {x.type}")
    if k == 0:
        empty = x.type.with_shape(x.type.shape[:axis] + (0,) + x.type.shape[axis + 1 :])
        zeros = np.zeros(empty.shape, empty.dtype)
        return [zeros, np.zeros(empty.shape, np.int64)]
    return _select(ctx, x, k, axis, largest)


def _select(ctx: NodeContext, x: Value, k: int, axis: int, largest: bool) -> list[Value]:
    b = ctx.b
    shape = x.type.shape
    positions = b.atomic.iota(axis=axis, result_type=TensorType.get(shape, "i64"))
    sentinel = ctx.scalar(_sentinel(x, largest), like=x)
    beyond = ctx.constant(np.int64(shape[axis]))  # no position: loses every minimum
    no = ctx.constant(np.bool_(False))
    reduce = b.atomic.reduce_max if largest else b.atomic.reduce_min
    taken = None
    values, indices = [], []
    for _ in range(k):
        free = x if taken is None else b.atomic.where(taken, sentinel, x)
        best = reduce(free, axes=[axis], keepdims=True)
        holds = b.atomic.cmp(free, best, pred="eq")
        if taken is not None:
            holds = b.atomic.where(taken, no, holds)
        first = b.atomic.reduce_min(
            b.atomic.where(holds, positions, beyond), axes=[axis], keepdims=True
        )
        chosen = b.atomic.cmp(positions, first, pred="eq")
        taken = chosen if taken is None else b.atomic.where(chosen, chosen, taken)
        values.append(best)
        indices.append(first)
    if k == 1:
        return [values[0], indices[0]]
    return [b.atomic.concat(*values, axis=axis), b.atomic.concat(*indices, axis=axis)]

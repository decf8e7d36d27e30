"""Converters of ScatterElements and ScatterND: writes at positions known only when the model
runs, in the atomic ops (whose one scatter, write_rows, writes rows without a reduction).

Both become one "scatter of rows": the data is viewed as R rows of S elements (ScatterND: the
rows are what an index tuple addresses; ScatterElements: every element is a row of one), each of
the U updates has a target row t[u]. Then
- reduction "none": `atomic.write_rows`, each update written to its row (ONNX writes the updates
  in order, so with repeated indices the last one stays, as write_rows does);
- the others find which update lands where with a mask M[u, r] = (t[u] == r) built from an iota:
- "add", "max", "min": the rows hit combine with the sum, maximum or minimum of their updates;
- "mul": with their product, reduced over u as a tree of pairwise products (atomic has no
  product reduction).
The mask is U x R and the partial results U x R x S: fine for the updates of a model (a
one-hot) and the ONNX tests, heavy for huge scatters with a reduction.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.ir import Value

from .context import NodeContext
from .ops_shape import iota, reshape_to, take_along_axis, tuple_index, wrap_negative
from .registry import converter

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _extreme(x: Value, lowest: bool):
    """The value no element exceeds (lowest) or undercuts: the identity of max (min)."""
    if x.type.is_float:
        return -math.inf if lowest else math.inf
    info = np.iinfo(x.type.dtype)
    return int(info.min if lowest else info.max)


def _product_over_first_axis(ctx: NodeContext, factors: Value) -> Value:
    """prod(factors, axis 0) as a tree of pairwise products of the two halves."""
    while factors.type.shape[0] > 1:
        count = factors.type.shape[0]
        half = count // 2
        rest = list(factors.type.shape[1:])
        rank = factors.type.rank
        start, stop = [0] * rank, [half, *rest]
        first = ctx.b.atomic.slice(factors, start=start, stop=stop, step=[1] * rank)
        second = ctx.b.atomic.slice(
            factors, start=[half] + [0] * (rank - 1), stop=[2 * half, *rest], step=[1] * rank
        )
        paired = ctx.b.atomic.mul(first, second)
        if count % 2:  # the odd one out joins the next level
            last = ctx.b.atomic.slice(
                factors, start=[count - 1] + [0] * (rank - 1), stop=[count, *rest], step=[1] * rank
            )
            paired = ctx.b.atomic.concat(paired, last, axis=0)
        factors = paired
    return reshape_to(ctx, factors, factors.type.shape[1:])


def scatter_rows(
    ctx: NodeContext, rows: Value, targets: Value, updates: Value, reduction: str
) -> Value:
    """`rows` [R, S] with update u [U, S] written to row targets[u] ([U] i64, in [0, R))."""
    count, size = updates.type.shape
    nrows = rows.type.shape[0]
    if count == 0:
        return rows
    if reduction == "none":
        return ctx.b.atomic.write_rows(rows, targets, updates, axis=0)
    hits = ctx.b.atomic.cmp(
        reshape_to(ctx, targets, (count, 1)), iota(ctx, 1, (count, nrows)), pred="eq"
    )  # [U, R]
    last = ctx.b.atomic.reduce_max(
        ctx.b.atomic.where(hits, iota(ctx, 0, (count, nrows)), ctx.constant(np.int64(-1))),
        axes=[0],
    )  # [R]: the last update of each row, -1 for none
    written = ctx.b.atomic.cmp(last, ctx.constant(np.int64(0)), pred="ge")
    written = reshape_to(ctx, written, (nrows, 1))
    mask = reshape_to(ctx, hits, (count, nrows, 1))
    spread = reshape_to(ctx, updates, (count, 1, size))
    if reduction == "add":
        zero = ctx.scalar(0, like=rows)
        combined = ctx.b.atomic.reduce_sum(ctx.b.atomic.where(mask, spread, zero), axes=[0])
        result = ctx.b.atomic.add(rows, combined)
    elif reduction == "mul":
        one = ctx.scalar(1, like=rows)
        factors = ctx.b.atomic.where(mask, spread, one)
        result = ctx.b.atomic.mul(rows, _product_over_first_axis(ctx, factors))
    else:
        take_max = reduction == "max"
        neutral = ctx.scalar(_extreme(rows, lowest=take_max), like=rows)
        candidates = ctx.b.atomic.where(mask, spread, neutral)
        if take_max:
            result = ctx.b.atomic.max(rows, ctx.b.atomic.reduce_max(candidates, axes=[0]))
        else:
            result = ctx.b.atomic.min(rows, ctx.b.atomic.reduce_min(candidates, axes=[0]))
    return ctx.b.atomic.where(written, result, rows)


def _reduction(ctx: NodeContext, data: Value) -> str:
    reduction = ctx.attr("reduction", "none")
    if reduction not in REDUCTIONS:
        raise ctx.error(f"reduction '{reduction}' is not supported ({', '.join(REDUCTIONS)})")
    if reduction != "none" and data.type.element_type == "i1":
        raise ctx.error(f"reduction '{reduction}' is not supported on booleans")
    return reduction


@converter("ScatterElements")
def scatter_elements(ctx: NodeContext):
    """data with updates[i] written (or combined) at i with i[axis] replaced by indices[i]."""
    data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    reduction = _reduction(ctx, data)
    shape, rank = data.type.shape, data.type.rank
    axis = ctx.attr("axis", 0)
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    ishape = indices.type.shape
    if updates.type.shape != ishape or indices.type.rank != rank:
        raise ctx.error(
            f"indices {indices.type} and updates {updates.type} must have one shape, of the "
            f"rank of data {data.type}"
        )
    if any(i > d for k, (i, d) in enumerate(zip(ishape, shape)) if k != axis):
        raise ctx.error(f"indices {indices.type} do not fit data {data.type} along axis {axis}")
    strides = [math.prod(shape[k + 1 :]) for k in range(rank)]
    along = wrap_negative(ctx, indices, shape[axis])
    if along.type.element_type != "i64":
        along = ctx.b.atomic.cast(along, result_type=along.type.with_element_type("i64"))
    terms = [
        ctx.b.atomic.mul(
            along if k == axis else iota(ctx, k, ishape),
            ctx.constant(np.int64(strides[k])),
        )
        for k in range(rank)
    ]
    position = terms[0]
    for term in terms[1:]:
        position = ctx.b.atomic.add(position, term)
    count = math.prod(ishape)
    rows = reshape_to(ctx, data, (math.prod(shape), 1))
    targets = reshape_to(ctx, position, (count,))
    written = scatter_rows(ctx, rows, targets, reshape_to(ctx, updates, (count, 1)), reduction)
    return reshape_to(ctx, written, shape)


@converter("ScatterND")
def scatter_nd(ctx: NodeContext):
    """data with each updates slice written (or combined) at the index tuple indices[..., :]
    addresses (the first k dims of data, k = indices.shape[-1])."""
    data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    reduction = _reduction(ctx, data)
    shape, ishape = data.type.shape, indices.type.shape
    depth = ishape[-1] if ishape else 0
    if not ishape or depth > len(shape) or updates.type.shape != ishape[:-1] + shape[depth:]:
        raise ctx.error(
            f"indices {indices.type} and updates {updates.type} do not address data {data.type}"
        )
    addressed = shape[:depth]
    count = math.prod(ishape[:-1])
    size = math.prod(shape[depth:])
    linear = tuple_index(ctx, indices, addressed)
    rows = reshape_to(ctx, data, (math.prod(addressed), size))
    targets = reshape_to(ctx, linear, (count,))
    written = scatter_rows(ctx, rows, targets, reshape_to(ctx, updates, (count, size)), reduction)
    return reshape_to(ctx, written, shape)


@converter("TensorScatter")
def tensor_scatter(ctx: NodeContext):
    """A cache write: update [B, ..., L, ...] goes to past_cache [B, ..., S, ...] at positions
    write_indices[b] .. + L along `axis` (per batch; "circular" wraps modulo S). Built as a
    select: position p of batch b takes update[p - w[b]] when that lies in [0, L)."""
    cache, update = ctx.input(0), ctx.input(1)
    write = ctx.optional_input(2)
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.error(f"mode '{mode}' is not supported (linear, circular)")
    shape, rank = cache.type.shape, cache.type.rank
    axis = ctx.attr("axis", -2)
    if rank < 2 or not -rank <= axis < rank or axis % rank == 0:
        raise ctx.error(f"axis {axis} must be a non-batch axis of {cache.type}")
    axis %= rank
    length, size = update.type.shape[axis], shape[axis]
    fits = update.type.rank == rank and all(
        u == c for d, (u, c) in enumerate(zip(update.type.shape, shape)) if d != axis
    )
    if not fits or length > size:
        raise ctx.error(f"update {update.type} does not fit past_cache {cache.type} on axis {axis}")
    if length == 0:
        return cache
    batch_shape = (shape[0],) + (1,) * (rank - 1)
    if write is None:
        start = ctx.constant(np.zeros(batch_shape, np.int64))
    else:
        if write.type.shape != (shape[0],):
            raise ctx.error(f"write_indices {write.type} must be [{shape[0]}]")
        start = reshape_to(ctx, write, batch_shape)
        if start.type.element_type != "i64":
            start = ctx.b.atomic.cast(start, result_type=start.type.with_element_type("i64"))
    at = [1] * rank
    at[axis] = size
    offset = ctx.b.atomic.sub(iota(ctx, axis, at), start)  # p - w[b]: [B, 1.., S, 1..]
    if mode == "circular":
        negative = ctx.b.atomic.cmp(offset, ctx.constant(np.int64(0)), pred="lt")
        wrapped = ctx.b.atomic.add(offset, ctx.constant(np.int64(size)))
        offset = ctx.b.atomic.where(negative, wrapped, offset)
    inside = ctx.b.atomic.where(
        ctx.b.atomic.cmp(offset, ctx.constant(np.int64(0)), pred="ge"),
        ctx.b.atomic.cmp(offset, ctx.constant(np.int64(length)), pred="lt"),
        ctx.constant(np.bool_(False)),
    )
    clamped = ctx.b.atomic.min(
        ctx.b.atomic.max(offset, ctx.constant(np.int64(0))), ctx.constant(np.int64(length - 1))
    )
    full = cache.type.with_shape(shape).with_element_type("i64")
    picked = take_along_axis(ctx, update, ctx.b.atomic.broadcast(clamped, result_type=full), axis)
    return ctx.b.atomic.where(
        ctx.b.atomic.broadcast(inside, result_type=full.with_element_type("i1")), picked, cache
    )

"""Lowerings of aten ops that move data: views (view, reshape, permute, transpose, expand,
squeeze, unsqueeze), slicing and selecting, cat and split, gathers (embedding, index_select,
index, gather), and the ops that return their operand (clone, detach, alias, contiguous).

The `*_copy` forms (the edge dialect's view_copy, permute_copy, ...) lower as their views."""

from __future__ import annotations

import math

import torch

from tgc.importers.torch._context import Cx, Static
from tgc.importers.torch._registry import IDENTITY_OPS, lowering
from tgc.ir import Value


def _with_copies(*names: str) -> tuple[str, ...]:
    return names + tuple(f"{name}_copy" for name in names)


@lowering(*IDENTITY_OPS)
def identity(cx: Cx) -> Value:
    return cx.value("self")


@lowering(*_with_copies("view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "flatten"))
def reshape(cx: Cx) -> Value:
    """Every reshaping view: the result's shape is the one PyTorch computed (-1 resolved)."""
    return cx.reshape(cx.value("self"), cx.out.shape)


@lowering("unflatten", "_reshape_alias")
def reshape_more(cx: Cx) -> Value:
    return cx.reshape(cx.value("self"), cx.out.shape)


def _transpose(cx: Cx, x: Value, perm: list[int]) -> Value:
    if perm == list(range(x.type.rank)):
        return x
    return cx.b.atomic.transpose(x, perm=perm)


@lowering(*_with_copies("permute"))
def permute(cx: Cx) -> Value:
    x = cx.value("self")
    return _transpose(cx, x, [cx.axis(d, x.type.rank) for d in cx.arg("dims")])


@lowering(*_with_copies("transpose"))
def transpose(cx: Cx) -> Value:
    x = cx.value("self")
    rank = x.type.rank
    perm = list(range(rank))
    if rank:
        a, b = cx.axis(cx.arg("dim0"), rank), cx.axis(cx.arg("dim1"), rank)
        perm[a], perm[b] = perm[b], perm[a]
    return _transpose(cx, x, perm)


@lowering(*_with_copies("t"), "numpy_T")
def t(cx: Cx) -> Value:
    x = cx.value("self")
    return _transpose(cx, x, list(reversed(range(x.type.rank))))


@lowering(*_with_copies("expand"))
def expand(cx: Cx) -> Value:
    return cx.broadcast(cx.value("self"), cx.out.shape)


# -- slicing --------------------------------------------------------------------------------------


def _slice(cx: Cx, x: Value, axis: int, start: int, stop: int, step: int) -> Value:
    shape = x.type.shape
    if (start, stop, step) == (0, shape[axis], 1):
        return x
    starts = [0] * len(shape)
    stops = list(shape)
    steps = [1] * len(shape)
    starts[axis], stops[axis], steps[axis] = start, max(start, stop), step
    return cx.b.atomic.slice(x, start=starts, stop=stops, step=steps)


@lowering(*_with_copies("slice"))
def slice_(cx: Cx) -> Value:
    x = cx.value("self")
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    step = cx.arg("step")
    if step < 1:
        raise cx.error(f"step {step} (PyTorch slices with positive steps only)")
    start, stop, _ = slice(cx.arg("start"), cx.arg("end"), step).indices(x.type.shape[axis])
    return _slice(cx, x, axis, start, stop, step)


@lowering(*_with_copies("select"))
def select(cx: Cx) -> Value:
    x = cx.value("self")
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    size = x.type.shape[axis]
    index = cx.arg("index")
    if not -size <= index < size:
        raise cx.error(f"index {index} is out of range for dim {axis} of size {size}")
    index %= size
    return cx.reshape(_slice(cx, x, axis, index, index + 1, 1), cx.out.shape)


# -- cat and split --------------------------------------------------------------------------------


@lowering("cat")
def cat(cx: Cx) -> Value:
    elem = cx.out.element_type
    parts = [cx.value(t, elem) for t in cx.arg("tensors")]
    # PyTorch skips 1-d empty tensors whatever the rank of the others (legacy behaviour).
    kept = [p for p in parts if p.type.shape != (0,)] or parts[:1]
    if len(kept) == 1:
        return cx.reshape(kept[0], cx.out.shape)
    return cx.b.atomic.concat(*kept, axis=cx.axis(cx.arg("dim"), kept[0].type.rank))


def _split(cx: Cx, x: Value, axis: int, sizes: list[int]) -> tuple[Value, ...]:
    if sum(sizes) != x.type.shape[axis]:
        raise cx.error(f"split sizes {sizes} do not add up to {x.type.shape[axis]}")
    if len(sizes) == 1:
        return (x,)
    pieces = cx.b.atomic.split(x, axis=axis, sizes=sizes)
    return pieces if isinstance(pieces, tuple) else (pieces,)


@lowering(*_with_copies("split", "split_with_sizes"))
def split(cx: Cx) -> tuple[Value, ...]:
    x = cx.value("self")
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    # The result types are the pieces PyTorch made (split_size, or the list of sizes).
    sizes = [t.shape[axis] for t in cx.outs]
    return _split(cx, x, axis, sizes)


@lowering("chunk")
def chunk(cx: Cx) -> tuple[Value, ...]:
    x = cx.value("self")
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    return _split(cx, x, axis, [t.shape[axis] for t in cx.outs])


@lowering(*_with_copies("unbind"))
def unbind(cx: Cx) -> tuple[Value, ...]:
    x = cx.value("self")
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    pieces = _split(cx, x, axis, [1] * x.type.shape[axis])
    return tuple(cx.reshape(p, t.shape) for p, t in zip(pieces, cx.outs))


# -- gathers --------------------------------------------------------------------------------------


@lowering("embedding")
def embedding(cx: Cx) -> Value:
    """weight[indices]: padding_idx and the gradient options do not change the forward value."""
    return cx.b.atomic.gather(cx.value("weight"), _indices(cx, cx.arg("indices")), axis=0)


@lowering("index_select")
def index_select(cx: Cx) -> Value:
    x = cx.value("self")
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    return cx.b.atomic.gather(x, _indices(cx, cx.arg("index")), axis=axis)


@lowering("index")
def index(cx: Cx) -> Value:
    """x[..., i0, i1, ..., ...] with integer index tensors on adjacent dims (x[:, idx],
    mask[batch, position]): the result has the index tensors' broadcast shape in their place,
    as in PyTorch. Negative indices count from the end. Several index tensors gather once, from
    x with their dims merged into one, at the flat position i0 * size1 + i1 (and so on)."""
    x = cx.value("self")
    given = [(axis, i) for axis, i in enumerate(cx.arg("indices")) if i is not None]
    axes = [axis for axis, _ in given]
    if not given or axes != list(range(axes[0], axes[0] + len(axes))):
        raise cx.error(
            "indexing with index tensors on dims that are not adjacent (PyTorch moves their "
            "dims first; tgc gathers in place)"
        )
    if any(not isinstance(i, Static) and cx.dtype_of(i) == torch.bool for _, i in given):
        raise cx.error("indexing with a boolean mask has a data-dependent shape")
    if len(given) == 1:
        (axis, indices), size = given[0], x.type.shape[given[0][0]]
        if isinstance(indices, Static):
            indices = Static(indices.node, indices.tensor % max(size, 1))
            return cx.b.atomic.gather(x, _indices(cx, indices), axis=axis)
        return cx.b.atomic.gather(x, _wrapped(cx, _indices(cx, indices), size), axis=axis)
    first, sizes = axes[0], [x.type.shape[a] for a in axes]
    merged = cx.reshape(
        x, (*x.type.shape[:first], math.prod(sizes), *x.type.shape[first + len(axes) :])
    )
    shape = cx.outs[0].shape[first : first + len(cx.outs[0].shape) - x.type.rank + len(axes)]
    flat = None
    for (_, indices), size, stride in zip(given, sizes, _strides(sizes)):
        idx = _wrapped(cx, _indices(cx, indices), size)
        elem = idx.type.element_type
        if tuple(idx.type.shape) != tuple(shape):
            idx = cx.b.atomic.broadcast(idx, result_type=idx.type.with_shape(tuple(shape)))
        term = cx.b.atomic.mul(idx, cx.scalar(stride, elem)) if stride != 1 else idx
        flat = term if flat is None else cx.b.atomic.add(flat, term)
    return cx.b.atomic.gather(merged, flat, axis=first)


def _wrapped(cx: Cx, idx: Value, size: int) -> Value:
    """`idx` with its negative entries counted from the end of a dim of `size`."""
    elem = idx.type.element_type
    negative = cx.b.atomic.cmp(idx, cx.scalar(0, elem), pred="lt")
    return cx.b.atomic.where(negative, cx.b.atomic.add(idx, cx.scalar(size, elem)), idx)


def _strides(sizes: list[int]) -> list[int]:
    """Row-major strides of a tensor of `sizes`."""
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    return strides


def _indices(cx: Cx, indices) -> Value:
    value = cx.value(indices)
    if value.type.element_type not in ("i8", "i32", "i64"):
        raise cx.error(f"indices of type {value.type} (tgc gathers with integer indices)")
    return value


@lowering("gather")
def take_along_dim(cx: Cx) -> Value:
    """torch.gather: out[i][j][k] = x[i][index[i][j][k]][k] (dim 1), index no larger than x
    outside dim. As one atomic.gather on x flattened: the flat position of each element is
    index * stride(dim) + the sum over the other dims of its coordinate (an iota) * stride."""
    x = cx.value("self")
    idx = _indices(cx, cx.arg("index"))
    rank = x.type.rank
    if idx.type.rank != rank:
        raise cx.error(f"index of rank {idx.type.rank} for a tensor of rank {rank}")
    axis = cx.axis(cx.arg("dim"), rank)
    strides = [1] * rank
    for d in range(rank - 2, -1, -1):
        strides[d] = strides[d + 1] * x.type.shape[d + 1]
    flat = cx.b.atomic.mul(idx, cx.scalar(strides[axis], idx.type.element_type))
    for d in range(rank):
        if d != axis and idx.type.shape[d] > 1:
            coordinate = cx.b.atomic.iota(axis=d, result_type=idx.type)
            offset = cx.b.atomic.mul(coordinate, cx.scalar(strides[d], idx.type.element_type))
            flat = cx.b.atomic.add(flat, offset)
    # An index outside dim would land in a neighbouring row: make it -1, which the gather
    # refuses when it runs (PyTorch raises there too), rather than read a wrong element.
    elem = idx.type.element_type
    below = cx.b.atomic.cmp(idx, cx.scalar(0, elem), pred="lt")
    above = cx.b.atomic.cmp(idx, cx.scalar(x.type.shape[axis], elem), pred="ge")
    outside = cx.b.atomic.where(below, cx.scalar(True, "i1"), above)
    flat = cx.b.atomic.where(outside, cx.scalar(-1, elem), flat)
    table = cx.reshape(x, (x.type.num_elements,))
    return cx.b.atomic.gather(table, flat, axis=0)


# -- scatters -------------------------------------------------------------------------------------


def _write_rows(cx: Cx, x: Value, axis: int, indices, values) -> Value:
    """x with x[..., idx[j], ...] = values[..., j, ...] along `axis` (idx one integer vector,
    negative entries counting from the end, values broadcasting to x's shape with `axis` of
    size len(idx)): what index_put and index_copy compute, `atomic.write_rows` (where an index
    repeats, the last row given wins; PyTorch leaves that undefined). A KV cache's update: the
    torch.compile backend donates the cache (tgc/dynamo/lowering.py), so the rows are written
    into it, not into a copy (tgc/donation.py)."""
    if cx.dtype_of(indices) == torch.bool:
        raise cx.error("writing through a boolean mask (tgc writes rows at integer indices)")
    idx = _indices(cx, indices)
    if idx.type.rank == 0:
        idx = cx.reshape(idx, (1,))
    if idx.type.rank != 1:
        raise cx.error(f"writing at indices of rank {idx.type.rank} (tgc writes at a vector)")
    rank, size, n = x.type.rank, x.type.shape[axis], idx.type.shape[0]
    target = list(x.type.shape)
    target[axis] = n
    values = cx.value(values, x.type.element_type)
    if values.type.rank == rank - 1 and n == 1:  # a rank-0 index: the axis is not in values
        values = cx.reshape(values, values.type.shape[:axis] + (1,) + values.type.shape[axis:])
    values = cx.broadcast(values, target)
    return cx.b.atomic.write_rows(x, _wrapped(cx, idx, size), values, axis=axis)


@lowering("index_put")
def index_put(cx: Cx) -> Value:
    """x[..., idx, ...] = values with one integer index tensor (accumulate=False): the
    functional form PyTorch's functionalisation makes of `index_put_`, `x[:, :, idx] = v` and
    `index_copy_` (core aten decomposes index_copy into it)."""
    x = cx.value("self")
    if cx.arg("accumulate"):
        raise cx.error("index_put with accumulate=True (tgc writes rows, it does not add)")
    given = [(axis, i) for axis, i in enumerate(cx.arg("indices")) if i is not None]
    if len(given) != 1:
        raise cx.error(f"writing with {len(given)} index tensors (tgc writes along one dim)")
    axis, indices = given[0]
    return _write_rows(cx, x, axis, indices, cx.arg("values"))


@lowering("index_copy")
def index_copy(cx: Cx) -> Value:
    x = cx.value("self")
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    return _write_rows(cx, x, axis, cx.arg("index"), cx.arg("source"))

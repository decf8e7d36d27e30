"""Converters of the ops that move data: Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
Concat, Split, Slice, Gather, GatherElements, GatherND, Expand, Tile, Pad, CenterCropPad,
DepthToSpace, SpaceToDepth, Trilu. (Shape arithmetic, folded at import: ops_known.py.)

tgc tensors have static shapes, so every input that carries a shape, axes, bounds or repeats
must be known at import time (`ctx.require_static`) and becomes an attribute or a result type.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.ir import Value
from tgc.types import TensorType

from .context import NodeContext
from .registry import converter

# -- helpers ----------------------------------------------------------------------------------------


def _ints(array: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _axis(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    """A possibly negative axis in [-rank, rank) as an index in [0, rank)."""
    if not -rank <= axis < rank:
        raise ctx.error(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def _axes(ctx: NodeContext, axes: list[int], rank: int, what: str = "axes") -> list[int]:
    found = [_axis(ctx, a, rank, what) for a in axes]
    if len(set(found)) != len(found):
        raise ctx.error(f"{what} {axes} repeat an axis")
    return found


def reshape_to(ctx: NodeContext, x: Value, shape) -> Value:
    shape = tuple(int(d) for d in shape)
    if shape == x.type.shape:
        return x
    return ctx.b.atomic.reshape(x, result_type=x.type.with_shape(shape))


def _broadcast(ctx: NodeContext, x: Value, shape) -> Value:
    shape = tuple(int(d) for d in shape)
    if shape == x.type.shape:
        return x
    return ctx.b.atomic.broadcast(x, result_type=x.type.with_shape(shape))


def _transpose(ctx: NodeContext, x: Value, perm) -> Value:
    perm = [int(p) for p in perm]
    if perm == list(range(len(perm))):
        return x
    return ctx.b.atomic.transpose(x, perm=perm)


# -- reshapes -------------------------------------------------------------------------------------


@converter("Reshape")
def reshape(ctx: NodeContext):
    """0 copies the input's dim at that position (unless allowzero=1: then it is a 0); one -1
    is inferred from the element count."""
    x = ctx.input(0)
    requested = _ints(ctx.require_static(1, "'shape'"))
    allowzero = ctx.attr("allowzero", 0)
    in_shape = x.type.shape
    if allowzero and 0 in requested and -1 in requested:
        raise ctx.error(f"shape {requested} has both 0 and -1, which allowzero=1 forbids")
    dims: list[int | None] = []
    for i, d in enumerate(requested):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                raise ctx.error(f"shape {requested} copies dim {i}, but the input is {x.type}")
            dims.append(in_shape[i])
        elif d == -1:
            dims.append(None)
        elif d < 0:
            raise ctx.error(f"shape {requested} has the invalid dim {d}")
        else:
            dims.append(d)
    return reshape_to(ctx, x, _infer_dim(ctx, dims, x, requested))


def _infer_dim(ctx: NodeContext, dims: list, x: Value, requested: list[int]) -> list[int]:
    unknown = [i for i, d in enumerate(dims) if d is None]
    if len(unknown) > 1:
        raise ctx.error(f"shape {requested} has more than one -1")
    known = math.prod(d for d in dims if d is not None)
    total = x.type.num_elements
    if unknown:
        if known == 0 or total % known:
            raise ctx.error(f"cannot reshape {x.type} to {requested}: no size for the -1 fits")
        dims[unknown[0]] = total // known
    elif known != total:
        raise ctx.error(f"cannot reshape {x.type} ({total} elements) to {requested}")
    return dims


@converter("Flatten")
def flatten(ctx: NodeContext):
    """To 2-D: the dims before `axis` make the rows, the rest the columns."""
    x = ctx.input(0)
    rank = x.type.rank
    axis = ctx.attr("axis", 1)
    if not -rank <= axis <= rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    shape = x.type.shape
    return reshape_to(ctx, x, (math.prod(shape[:axis]), math.prod(shape[axis:])))


@converter("Squeeze")
def squeeze(ctx: NodeContext):
    """Remove the dims `axes` (each of size 1), or every dim of size 1 when none are given."""
    x = ctx.input(0)
    shape = x.type.shape
    axes = _ints(ctx.require_static(1, "'axes'")) if ctx.has_input(1) else None
    if axes is None:
        drop = [i for i, d in enumerate(shape) if d == 1]
    else:
        drop = _axes(ctx, axes, x.type.rank)
        for a in drop:
            if shape[a] != 1:
                raise ctx.error(f"cannot squeeze dim {a} of {x.type}: its size is not 1")
    return reshape_to(ctx, x, [d for i, d in enumerate(shape) if i not in drop])


@converter("Unsqueeze")
def unsqueeze(ctx: NodeContext):
    """Insert dims of size 1 at `axes`, which index the result (negative from its end)."""
    x = ctx.input(0)
    axes = _ints(ctx.require_static(1, "'axes'"))
    rank = x.type.rank + len(axes)
    inserted = set(_axes(ctx, axes, rank))
    rest = iter(x.type.shape)
    return reshape_to(ctx, x, [1 if i in inserted else next(rest) for i in range(rank)])


# -- permutations, concatenation, split ---------------------------------------------------------


@converter("Transpose")
def transpose(ctx: NodeContext):
    """`perm` defaults to reversing the dims."""
    x = ctx.input(0)
    rank = x.type.rank
    perm = ctx.attr("perm", list(reversed(range(rank))))
    if sorted(_axis(ctx, p, rank, "perm entry") for p in perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of the {rank} dims")
    return _transpose(ctx, x, [p % rank for p in perm])


@converter("Concat")
def concat(ctx: NodeContext):
    xs = ctx.inputs()
    axis = _axis(ctx, ctx.attr("axis"), xs[0].type.rank)
    if len(xs) == 1:
        return xs[0]
    return ctx.b.atomic.concat(*xs, axis=axis)


@converter("Split")
def split(ctx: NodeContext):
    """Sizes from the `split` input (or attribute), else `num_outputs` pieces (opset 18: the
    last may be smaller), else as many equal pieces as the node has outputs."""
    x = ctx.input(0)
    axis = _axis(ctx, ctx.attr("axis", 0), x.type.rank)
    dim = x.type.shape[axis]
    sizes = _split_sizes(ctx, dim)
    if len(sizes) != ctx.num_outputs:
        raise ctx.error(f"{len(sizes)} split sizes {sizes} for {ctx.num_outputs} outputs")
    if any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise ctx.error(f"split sizes {sizes} do not add up to dim {axis} of {x.type} ({dim})")
    if len(sizes) == 1:
        return [x]
    return list(ctx.b.atomic.split(x, axis=axis, sizes=sizes))


def _split_sizes(ctx: NodeContext, dim: int) -> list[int]:
    if ctx.has_input(1):
        return _ints(ctx.require_static(1, "'split'"))
    count = ctx.attr("num_outputs", None)
    if count is not None:
        if count < 1:
            raise ctx.error(f"num_outputs {count} must be positive")
        chunk = -(-dim // count)  # ceil: every piece as large as the first, the last smaller
        return [chunk] * (count - 1) + [dim - chunk * (count - 1)]
    count = ctx.num_outputs
    if dim % count:
        raise ctx.error(f"dim of size {dim} does not split into {count} equal parts")
    return [dim // count] * count


# -- slicing and gathering ----------------------------------------------------------------------


@converter("Slice")
def slice_(ctx: NodeContext):
    """x[starts:ends:steps] on `axes` (default all, in order), bounds clamped as ONNX says.
    Positive steps become one atomic.slice; a negative step on an axis becomes a gather of the
    indices it walks (atomic.slice steps forward only)."""
    x = ctx.input(0)
    shape = x.type.shape
    starts = _ints(ctx.require_static(1, "'starts'"))
    ends = _ints(ctx.require_static(2, "'ends'"))
    axes = _ints(ctx.require_static(3, "'axes'")) if ctx.has_input(3) else None
    steps = _ints(ctx.require_static(4, "'steps'")) if ctx.has_input(4) else [1] * len(starts)
    axes = list(range(len(starts))) if axes is None else axes
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error("starts, ends, axes and steps must have the same length")
    axes = _axes(ctx, axes, x.type.rank)
    start, stop, step = [0] * len(shape), list(shape), [1] * len(shape)
    backward: dict[int, range] = {}
    for axis, lo, hi, st in zip(axes, starts, ends, steps):
        walk = _clamped_range(ctx, lo, hi, st, shape[axis])
        if st > 0:
            start[axis], stop[axis], step[axis] = walk.start, max(walk.stop, walk.start), st
        else:
            backward[axis] = walk
    y = x
    if (start, stop, step) != ([0] * len(shape), list(shape), [1] * len(shape)):
        y = ctx.b.atomic.slice(x, start=start, stop=stop, step=step)
    for axis, walk in backward.items():
        indices = ctx.constant(np.array(list(walk), np.int64))
        y = ctx.b.atomic.gather(y, indices, axis=axis)
    return y


def _clamped_range(ctx: NodeContext, start: int, end: int, step: int, dim: int) -> range:
    """The indices one axis of a Slice walks: negative bounds count from the end, then clamp
    to [0, dim] going forward, to [-1, dim - 1] going backward."""
    if step == 0:
        raise ctx.error("a step of 0 is not allowed")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), dim), min(max(end, 0), dim), step)
    return range(min(max(start, -1), dim - 1), min(max(end, -1), dim - 1), step)


@converter("Gather")
def gather(ctx: NodeContext):
    """np.take along `axis`; negative indices count from the end (known ones are wrapped at
    import, others where the model runs)."""
    table = ctx.input(0)
    axis = _axis(ctx, ctx.attr("axis", 0), table.type.rank)
    size = table.type.shape[axis]
    known = ctx.static(1)
    if known is not None:
        if np.any((known < -size) | (known >= size)):
            bad = known[(known < -size) | (known >= size)].reshape(-1)[0]
            raise ctx.error(f"index {int(bad)} is out of range for dim {axis} of size {size}")
        if size > np.iinfo(known.dtype).max:  # int8 indices into 200 rows: wrap in i64
            known = known.astype(np.int64)
        wrapped = ctx.constant(np.where(known < 0, known + size, known))
        return ctx.b.atomic.gather(table, wrapped, axis=axis)
    indices = wide_enough(ctx, ctx.input(1), size)
    negative = ctx.b.atomic.cmp(indices, ctx.scalar(0, like=indices), pred="lt")
    wrapped = ctx.b.atomic.add(indices, ctx.scalar(size, like=indices))
    return ctx.b.atomic.gather(table, ctx.b.atomic.where(negative, wrapped, indices), axis=axis)


def wide_enough(ctx: NodeContext, indices: Value, sizes) -> Value:
    """`indices` cast to i64 when their integer type cannot hold every size in `sizes` (int8
    indices into a table of 200 rows: i + 200 would not fit)."""
    limit = np.iinfo(indices.type.dtype).max
    if int(np.max(np.asarray(sizes), initial=0)) <= limit:
        return indices
    return ctx.b.atomic.cast(indices, result_type=indices.type.with_element_type("i64"))


def wrap_negative(ctx: NodeContext, indices: Value, sizes) -> Value:
    """Indices with the negative ones counted from the end: i + size where i < 0 (`sizes` a
    number or an array that broadcasts against the indices)."""
    indices = wide_enough(ctx, indices, sizes)
    size = ctx.constant(np.asarray(sizes, dtype=indices.type.dtype))
    negative = ctx.b.atomic.cmp(indices, ctx.scalar(0, like=indices), pred="lt")
    return ctx.b.atomic.where(negative, ctx.b.atomic.add(indices, size), indices)


def tuple_index(ctx: NodeContext, indices: Value, addressed) -> Value:
    """The i64 linear index into dims `addressed` (row-major) of each tuple on the last axis of
    `indices` (negative entries counted from the end): shape indices.shape[:-1]."""
    rows = indices.type.shape[:-1]
    if not addressed:
        return ctx.constant(np.zeros(rows, np.int64))
    wrapped = wrap_negative(ctx, indices, np.array(addressed, np.int64))
    if wrapped.type.element_type != "i64":
        wrapped = ctx.b.atomic.cast(wrapped, result_type=wrapped.type.with_element_type("i64"))
    if len(addressed) == 1:
        return reshape_to(ctx, wrapped, rows)
    weighted = ctx.b.atomic.mul(wrapped, ctx.constant(np.array(_strides(addressed), np.int64)))
    return ctx.b.atomic.reduce_sum(weighted, axes=[-1])


def _linear_index(ctx: NodeContext, parts: list[tuple[Value, int]], shape) -> Value:
    """sum(part * stride) over (part, stride) pairs, as i64 of `shape`."""
    total = None
    for part, stride in parts:
        if part.type.element_type != "i64":
            part = ctx.b.atomic.cast(part, result_type=part.type.with_element_type("i64"))
        if stride != 1:
            part = ctx.b.atomic.mul(part, ctx.constant(np.array(stride, np.int64)))
        total = part if total is None else ctx.b.atomic.add(total, part)
    if total is None:
        return ctx.constant(np.zeros(shape, np.int64))
    return _broadcast(ctx, total, shape)


def iota(ctx: NodeContext, axis: int, shape) -> Value:
    return ctx.b.atomic.iota(axis=axis, result_type=TensorType.get(tuple(shape), "i64"))


def _strides(shape) -> list[int]:
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


@converter("GatherElements")
def gather_elements(ctx: NodeContext):
    """np.take_along_axis: out[i] = data[i with i[axis] replaced by indices[i]]. Built as one
    gather on the flattened data at the linear index of each element (iota on the other axes)."""
    data, indices = ctx.input(0), ctx.input(1)
    rank = data.type.rank
    axis = _axis(ctx, ctx.attr("axis", 0), rank)
    out = indices.type.shape
    if indices.type.rank != rank or any(
        o > d for i, (o, d) in enumerate(zip(out, data.type.shape)) if i != axis
    ):
        raise ctx.error(f"indices {indices.type} do not fit data {data.type} along axis {axis}")
    return take_along_axis(ctx, data, wrap_negative(ctx, indices, data.type.shape[axis]), axis)


def take_along_axis(ctx: NodeContext, data: Value, indices: Value, axis: int) -> Value:
    """np.take_along_axis with indices in [0, size) (no dim of theirs longer than the data's
    but along `axis`): one gather on the flattened data at each element's linear index."""
    out = indices.type.shape
    strides = _strides(data.type.shape)
    parts = [(indices if d == axis else iota(ctx, d, out), strides[d]) for d in range(len(out))]
    flat = reshape_to(ctx, data, (data.type.num_elements,))
    return ctx.b.atomic.gather(flat, _linear_index(ctx, parts, out), axis=0)


@converter("GatherND")
def gather_nd(ctx: NodeContext):
    """Indices [..., k] address the first k dims after the `batch_dims` shared ones. Built as
    one gather on the data reshaped to [batch * addressed, rest...] at each tuple's linear
    index (sum of index * stride, plus the batch's offset)."""
    data, indices = ctx.input(0), ctx.input(1)
    batch = ctx.attr("batch_dims", 0)
    shape, ishape = data.type.shape, indices.type.shape
    depth = ishape[-1] if ishape else 0
    if not ishape or batch < 0 or batch + depth > len(shape) or ishape[:batch] != shape[:batch]:
        raise ctx.error(f"indices {indices.type} do not address data {data.type}")
    addressed = shape[batch : batch + depth]
    rows = ishape[:-1]
    inner = tuple_index(ctx, indices, addressed)
    block = math.prod(addressed)
    parts = [(inner, 1)]
    batch_strides = _strides(shape[:batch])
    parts += [(iota(ctx, d, rows), batch_strides[d] * block) for d in range(batch)]
    flat = reshape_to(ctx, data, (math.prod(shape[:batch]) * block, *shape[batch + depth :]))
    return ctx.b.atomic.gather(flat, _linear_index(ctx, parts, rows), axis=0)


# -- broadcasting and repetition ----------------------------------------------------------------


@converter("Expand")
def expand(ctx: NodeContext):
    """Broadcast x with `shape` both ways (numpy rules): a 1 in `shape` keeps x's dim."""
    x = ctx.input(0)
    requested = _ints(ctx.require_static(1, "'shape'"))
    try:
        shape = np.broadcast_shapes(x.type.shape, tuple(requested))
    except ValueError:
        raise ctx.error(f"cannot expand {x.type} to shape {requested}") from None
    return _broadcast(ctx, x, shape)


@converter("Tile")
def tile(ctx: NodeContext):
    """np.tile: each dim d repeated r times is (r, d) broadcast from (1, d), then merged."""
    x = ctx.input(0)
    repeats = _ints(ctx.require_static(1, "'repeats'"))
    shape = x.type.shape
    if len(repeats) != len(shape) or any(r < 0 for r in repeats):
        raise ctx.error(f"repeats {repeats} must be {len(shape)} non-negative counts")
    if all(r == 1 for r in repeats):
        return x
    spread = reshape_to(ctx, x, [n for d in shape for n in (1, d)])
    tiled = _broadcast(ctx, spread, [n for r, d in zip(repeats, shape) for n in (r, d)])
    return reshape_to(ctx, tiled, [r * d for r, d in zip(repeats, shape)])


@converter("Pad")
def pad(ctx: NodeContext):
    """Pads [begin..., end...] on `axes` (default all); negative pads crop. "constant" fills
    with the value input (default 0); "edge", "reflect" and "wrap" read the input at mirrored,
    clamped or wrapped positions: one gather of known indices per padded axis."""
    x = ctx.input(0)
    rank = x.type.rank
    pads = _ints(ctx.require_static(1, "'pads'"))
    axes = _ints(ctx.require_static(3, "'axes'")) if ctx.has_input(3) else list(range(rank))
    axes = _axes(ctx, axes, rank)
    mode = ctx.attr("mode", "constant")
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} must have 2 entries per padded axis ({len(axes)})")
    widths = {a: (pads[i], pads[i + len(axes)]) for i, a in enumerate(axes)}
    if mode == "constant":
        value = ctx.optional_input(2)
        return _pad_constant(ctx, x, widths, value)
    if mode not in ("edge", "reflect", "wrap"):
        raise ctx.error(f"mode '{mode}' is not supported (constant, edge, reflect, wrap)")
    y = x
    for axis, (before, after) in widths.items():
        if before or after:
            dim = y.type.shape[axis]
            if dim == 0:
                raise ctx.error(f"mode '{mode}' cannot pad dim {axis}, which has size 0")
            source = [_padded_source(mode, i, dim) for i in range(-before, dim + after)]
            y = ctx.b.atomic.gather(y, ctx.constant(np.array(source, np.int64)), axis=axis)
    return y


def _padded_source(mode: str, i: int, dim: int) -> int:
    """The input position that padded position `i` (0 = the input's first) reads."""
    if mode == "edge":
        return min(max(i, 0), dim - 1)
    if mode == "wrap":
        return i % dim
    if dim == 1:  # reflect: mirrored about the edges, without repeating them
        return 0
    period = 2 * (dim - 1)
    i %= period
    return i if i < dim else period - i


def _pad_constant(ctx: NodeContext, x: Value, widths: dict, value: Value | None) -> Value:
    if value is not None and (
        value.type.num_elements != 1 or value.type.element_type != x.type.element_type
    ):
        raise ctx.error(f"the pad value {value.type} must be one {x.type.element_type}")
    fill = None  # the rank-0 fill value, made when a block needs it
    y = x
    for axis, (before, after) in widths.items():
        dim = y.type.shape[axis]
        if before < 0 or after < 0:
            lo, hi = max(-before, 0), dim - max(-after, 0)
            if lo > hi:
                raise ctx.error(f"pads crop more than dim {axis} has ({dim})")
            start, stop = [0] * y.type.rank, list(y.type.shape)
            start[axis], stop[axis] = lo, hi
            y = ctx.b.atomic.slice(y, start=start, stop=stop, step=[1] * y.type.rank)
        pieces = []
        for width in (max(before, 0), None, max(after, 0)):
            if width is None:
                pieces.append(y)
            elif width:
                if fill is None:
                    fill = ctx.scalar(0, like=x) if value is None else reshape_to(ctx, value, ())
                block = list(y.type.shape)
                block[axis] = width
                pieces.append(_broadcast(ctx, fill, block))
        if len(pieces) > 1:
            y = ctx.b.atomic.concat(*pieces, axis=axis)
    return y


@converter("CenterCropPad")
def center_crop_pad(ctx: NodeContext):
    """Each axis of `axes` (default all) cropped or zero-padded to `shape`, centred (the extra
    element of an odd difference goes at the end)."""
    x = ctx.input(0)
    rank = x.type.rank
    target = _ints(ctx.require_static(1, "'shape'"))
    axes = _axes(ctx, ctx.attr("axes", list(range(rank))), rank)
    if len(target) != len(axes) or any(t < 0 for t in target):
        raise ctx.error(f"shape {target} must have one non-negative size per axis {axes}")
    start, stop = [0] * rank, list(x.type.shape)
    widths = {}
    for axis, size in zip(axes, target):
        dim = x.type.shape[axis]
        if size < dim:
            start[axis] = (dim - size) // 2
            stop[axis] = start[axis] + size
        elif size > dim:
            before = (size - dim) // 2
            widths[axis] = (before, size - dim - before)
    y = x
    if (start, stop) != ([0] * rank, list(x.type.shape)):
        y = ctx.b.atomic.slice(x, start=start, stop=stop, step=[1] * rank)
    return _pad_constant(ctx, y, widths, None)


@converter("DepthToSpace")
def depth_to_space(ctx: NodeContext):
    """[N, C, H, W] -> [N, C/b², H·b, W·b] in DCR (default) or CRD order."""
    x = ctx.input(0)
    block = ctx.attr("blocksize")
    mode = ctx.attr("mode", "DCR")
    if x.type.rank != 4 or block < 1 or x.type.shape[1] % (block * block):
        raise ctx.error(f"needs a 4-D input whose channels divide by {block}², got {x.type}")
    n, c, h, w = x.type.shape
    depth = c // (block * block)
    if mode == "DCR":
        spread = reshape_to(ctx, x, (n, block, block, depth, h, w))
        moved = _transpose(ctx, spread, (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        spread = reshape_to(ctx, x, (n, depth, block, block, h, w))
        moved = _transpose(ctx, spread, (0, 1, 4, 2, 5, 3))
    else:
        raise ctx.error(f"mode '{mode}' is not supported (DCR or CRD)")
    return reshape_to(ctx, moved, (n, depth, h * block, w * block))


@converter("SpaceToDepth")
def space_to_depth(ctx: NodeContext):
    """[N, C, H, W] -> [N, C·b², H/b, W/b] (the inverse of DepthToSpace's DCR)."""
    x = ctx.input(0)
    block = ctx.attr("blocksize")
    if x.type.rank != 4 or block < 1 or any(d % block for d in x.type.shape[2:]):
        raise ctx.error(f"needs a 4-D input whose H and W divide by {block}, got {x.type}")
    n, c, h, w = x.type.shape
    spread = reshape_to(ctx, x, (n, c, h // block, block, w // block, block))
    moved = _transpose(ctx, spread, (0, 3, 5, 1, 2, 4))
    return reshape_to(ctx, moved, (n, c * block * block, h // block, w // block))


@converter("Trilu")
def trilu(ctx: NodeContext):
    """The upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims, zeros
    elsewhere; k (input 1, default 0) may be known only when the model runs."""
    x = ctx.input(0)
    if x.type.rank < 2:
        raise ctx.error(f"needs rank >= 2, got {x.type}")
    upper = ctx.attr("upper", 1)
    rows, cols = x.type.shape[-2:]
    k = ctx.optional_input(1)
    k = ctx.constant(np.array(0, np.int64)) if k is None else reshape_to(ctx, k, ())
    if k.type.element_type != "i64":
        raise ctx.error(f"k must be int64, got {k.type}")
    diagonal = ctx.b.atomic.sub(iota(ctx, 1, (rows, cols)), iota(ctx, 0, (rows, cols)))
    keep = ctx.b.atomic.cmp(diagonal, k, pred="ge" if upper else "le")
    return ctx.b.atomic.where(keep, x, ctx.scalar(0, like=x))

"""Converters of image-layout ops that are fixed linear maps or scatters: AffineGrid (a matmul
with the grid of normalised coordinates), Col2Im (sums of patches: a gather of each pixel's
contributions, then a sum) and MaxUnpool (a scatter of the pooled values to their positions).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tgc.ir import Value

from .context import NodeContext
from .ops_scatter import scatter_rows
from .ops_shape import reshape_to
from .registry import converter


def _ints(array) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


# -- AffineGrid -----------------------------------------------------------------------------------


def base_grid(spatial: list[int], align_corners: bool) -> np.ndarray:
    """[prod(spatial), r + 1]: each point's normalised coordinates in [-1, 1], the last
    spatial dim first (x, then y, then z), and a 1 (homogeneous)."""

    def axis(n: int) -> np.ndarray:
        if align_corners:
            return np.linspace(-1.0, 1.0, n)
        return (2 * np.arange(n) + 1) / n - 1

    mesh = np.meshgrid(*(axis(n) for n in spatial), indexing="ij")
    columns = [m.reshape(-1) for m in reversed(mesh)]
    points = math.prod(spatial)
    return np.stack([*columns, np.ones(points)], axis=1)


@converter("AffineGrid")
def affine_grid(ctx: NodeContext):
    """grid[n, ..., :] = theta[n] @ (x, y[, z], 1) at each point of the output's spatial dims."""
    theta = ctx.input(0)
    size = _ints(ctx.require_static(1, "'size'"))
    align = bool(ctx.attr("align_corners", 0))
    spatial = size[2:]
    r = len(spatial)
    if r not in (2, 3) or theta.type.shape != (size[0], r, r + 1):
        raise ctx.error(
            f"theta {theta.type} must be [N, {r}, {r + 1}] for size {size} (2-D or 3-D)"
        )
    if not theta.type.is_float:
        raise ctx.error(f"theta must be a float tensor, got {theta.type}")
    base = ctx.constant(base_grid(spatial, align), theta.type.element_type)
    grid = ctx.b.atomic.matmul(base, theta, transpose_b=True)  # [N, points, r]
    return reshape_to(ctx, grid, (size[0], *spatial, r))


# -- Col2Im ---------------------------------------------------------------------------------------


def col2im_sources(image, block, dilations, pads, strides) -> tuple[np.ndarray, int]:
    """For each image pixel (row-major), the positions k * L + l of the columns (kernel offset
    k, block l) that add to it, padded with K * L (a zero column); and L, the block count."""
    r = len(image)
    counts = [
        (image[d] + pads[d] + pads[d + r] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
        for d in range(r)
    ]
    blocks = math.prod(counts)
    kernel = math.prod(block)
    sources: list[list[int]] = [[] for _ in range(math.prod(image))]
    for k, offset in enumerate(itertools.product(*(range(b) for b in block))):
        for j, where in enumerate(itertools.product(*(range(c) for c in counts))):
            pixel = [where[d] * strides[d] - pads[d] + offset[d] * dilations[d] for d in range(r)]
            if all(0 <= p < n for p, n in zip(pixel, image)):
                sources[int(np.ravel_multi_index(pixel, image))].append(k * blocks + j)
    width = max((len(s) for s in sources), default=0)
    table = np.full((len(sources), width), kernel * blocks, np.int64)
    for i, s in enumerate(sources):
        table[i, : len(s)] = s
    return table, blocks


@converter("Col2Im")
def col2im(ctx: NodeContext):
    """[N, C * prod(block), L] columns summed back into [N, C, *image] (torch's fold)."""
    x = ctx.input(0)
    image = _ints(ctx.require_static(1, "'image_shape'"))
    block = _ints(ctx.require_static(2, "'block_shape'"))
    r = len(image)
    dilations = ctx.attr("dilations", [1] * r)
    pads = ctx.attr("pads", [0] * 2 * r)
    strides = ctx.attr("strides", [1] * r)
    if len(block) != r or len(dilations) != r or len(strides) != r or len(pads) != 2 * r:
        raise ctx.error("image_shape, block_shape, dilations, strides and pads disagree in rank")
    kernel = math.prod(block)
    n, rows, length = x.type.shape if x.type.rank == 3 else (None, None, None)
    if n is None or rows % kernel:
        raise ctx.error(f"input {x.type} must be [N, C * {kernel}, L]")
    table, blocks = col2im_sources(image, block, dilations, pads, strides)
    if blocks != length:
        raise ctx.error(f"the image has {blocks} blocks, but the input has L = {length}")
    channels = rows // kernel
    columns = reshape_to(ctx, x, (n, channels, kernel * length))
    zero = ctx.b.atomic.broadcast(
        ctx.scalar(0, like=x), result_type=x.type.with_shape((n, channels, 1))
    )
    padded = ctx.b.atomic.concat(columns, zero, axis=2)
    if table.shape[1] == 0:
        image_flat = ctx.b.atomic.broadcast(
            ctx.scalar(0, like=x), result_type=x.type.with_shape((n, channels, math.prod(image)))
        )
    else:
        gathered = ctx.b.atomic.gather(padded, ctx.constant(table), axis=2)
        image_flat = ctx.b.atomic.reduce_sum(gathered, axes=[3])
    return reshape_to(ctx, image_flat, (n, channels, *image))


# -- MaxUnpool ------------------------------------------------------------------------------------


@converter("MaxUnpool")
def max_unpool(ctx: NodeContext):
    """Zeros of the unpooled shape with X written at its indices (flat positions in that
    shape), then placed at the start of `output_shape` when it is given."""
    x, indices = ctx.input(0), ctx.input(1)
    kernel = ctx.attr("kernel_shape")
    r = len(kernel)
    pads = ctx.attr("pads", [0] * 2 * r)
    strides = ctx.attr("strides", [1] * r)
    if x.type.rank != r + 2 or indices.type.shape != x.type.shape:
        raise ctx.error(f"X {x.type} and indices {indices.type} must be [N, C, {r} dims]")
    n, c, *spatial = x.type.shape
    inferred = [(spatial[d] - 1) * strides[d] - pads[d] - pads[d + r] + kernel[d] for d in range(r)]
    shape = [n, c, *inferred]
    target = _ints(ctx.require_static(2, "'output_shape'")) if ctx.has_input(2) else shape
    if len(target) != len(shape) or any(t < s for t, s in zip(target, shape)):
        raise ctx.error(f"output_shape {target} is smaller than the unpooled shape {shape}")
    total = math.prod(shape)
    count = x.type.num_elements
    rows = ctx.b.atomic.broadcast(ctx.scalar(0, like=x), result_type=x.type.with_shape((total, 1)))
    positions = indices
    if positions.type.element_type != "i64":
        positions = ctx.b.atomic.cast(positions, result_type=indices.type.with_element_type("i64"))
    written = scatter_rows(
        ctx, rows, reshape_to(ctx, positions, (count,)), reshape_to(ctx, x, (count, 1)), "none"
    )
    y = reshape_to(ctx, written, shape)
    return _pad_end(ctx, y, target)


def _pad_end(ctx: NodeContext, y: Value, target: list[int]) -> Value:
    for axis, (have, want) in enumerate(zip(y.type.shape, target)):
        if want > have:
            block = list(y.type.shape)
            block[axis] = want - have
            zeros = ctx.b.atomic.broadcast(
                ctx.scalar(0, like=y), result_type=y.type.with_shape(tuple(block))
            )
            y = ctx.b.atomic.concat(y, zeros, axis=axis)
    return y

"""The converter of Resize (opset 13 and later): nearest, linear and cubic interpolation, every
coordinate transformation, antialiasing, exclude_outside, keep_aspect_ratio_policy, axes.

Where hl.resize says what the node says (nearest or linear interpolation of the spatial dims of
a float [N, C, ...] with half_pixel, align_corners or asymmetric coordinates, no antialiasing,
scales equal to the size ratios: what PyTorch's exporter writes for nn.Upsample) the node is one
hl.resize, whose kernels (F.interpolate) the planner can pick. Otherwise:

Resize is separable and, along one axis, linear in its input: output[o] = sum_i W[o, i] *
input[i] with W known at import (it depends only on the sizes and attributes). So each resized
axis becomes one op: a gather of the chosen rows for "nearest" (exact for any element type),
else an `atomic.matmul` with W. tf_crop_and_resize's positions outside the input are then set
to `extrapolation_value` with an `atomic.where`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tgc.ir import Value

from .context import NodeContext
from .registry import converter

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class AxisResize:
    """How one axis is resized: sizes, the scale the coordinates use, its region of interest."""

    size_in: int
    size_out: int
    scale: float
    roi: tuple[float, float] = (0.0, 1.0)


@dataclass(frozen=True)
class Options:
    mode: str
    transform: str
    nearest_mode: str
    cubic_a: float
    antialias: bool
    exclude_outside: bool


# -- the 1-D weights ------------------------------------------------------------------------------


def source_positions(axis: AxisResize, transform: str) -> np.ndarray:
    """The input coordinate each output position samples (float64). As the ONNX reference
    does, the output length in the formulas is scale * input length (not rounded), except
    in the half_pixel_symmetric correction, which is there for the rounding."""
    out = np.arange(axis.size_out, dtype=np.float64)
    n_in, scale = axis.size_in, axis.scale
    length = scale * n_in
    if transform == "asymmetric":
        return out / scale
    if transform == "align_corners":
        return np.zeros_like(out) if length == 1 else out * (n_in - 1) / (length - 1)
    if transform == "pytorch_half_pixel" and length == 1:
        return np.full_like(out, -0.5)
    if transform == "tf_crop_and_resize":
        lo, hi = axis.roi
        if length == 1:
            return np.full_like(out, (hi - lo) * (n_in - 1) / 2 + lo * (n_in - 1))
        return lo * (n_in - 1) + out * (hi - lo) * (n_in - 1) / (length - 1)
    if transform == "half_pixel_symmetric":
        # The output canvas is centred on the input's when rounding made it smaller. Summed in
        # the spec's order: an exact .5 that "nearest" rounds must come out the same.
        offset = n_in / 2 * (1 - axis.size_out / length)
        return offset + (out + 0.5) / scale - 0.5
    return (out + 0.5) / scale - 0.5  # half_pixel, pytorch_half_pixel


def nearest_rows(x: np.ndarray, n_in: int, nearest_mode: str) -> np.ndarray:
    """The input row each output takes in "nearest" mode (clamped to the input); the rounding
    looks at the fraction x - floor(x), so that a tie is exactly 0.5."""
    below = np.floor(x)
    fraction = x - below
    if nearest_mode == "round_prefer_floor":
        up = fraction > 0.5
    elif nearest_mode == "round_prefer_ceil":
        up = fraction >= 0.5
    elif nearest_mode == "floor":
        up = np.zeros_like(fraction, dtype=bool)
    else:
        up = fraction > 0
    rows = below + up
    return np.clip(rows, 0, n_in - 1).astype(np.int64)


def _linear_kernel(d: np.ndarray, a: float) -> np.ndarray:
    return np.clip(1 - np.abs(d), 0, None)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient a (support 2)."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def interpolation_weights(x: np.ndarray, n_in: int, scale: float, options: Options):
    """W (outputs x inputs) for linear or cubic interpolation at positions `x`. Taps outside
    the input read its edge (their weight goes to row 0 or n_in - 1), or with exclude_outside
    are dropped and the rest renormalised. With antialias, a downscale (scale < 1) widens the
    kernel by 1/scale and the weights are normalised to sum 1."""
    kernel, support = (_linear_kernel, 1.0) if options.mode == "linear" else (_cubic_kernel, 2.0)
    stretch = min(scale, 1.0) if options.antialias else 1.0
    reach = math.ceil(support / stretch) + 1
    weights = np.zeros((len(x), n_in))
    for o, position in enumerate(x):
        base = math.floor(position)
        taps = np.arange(base - reach, base + reach + 1)
        w = kernel((taps - position) * stretch, options.cubic_a)
        if options.exclude_outside:
            w = np.where((taps < 0) | (taps >= n_in), 0.0, w)
        total = w.sum()
        if (options.antialias or options.exclude_outside) and total != 0:
            w = w / total
        np.add.at(weights[o], np.clip(taps, 0, n_in - 1), w)
    return weights


def outside_roi(x: np.ndarray, n_in: int) -> np.ndarray:
    """tf_crop_and_resize: the outputs whose position lies outside the input."""
    return (x < 0) | (x > n_in - 1)


# -- the converter --------------------------------------------------------------------------------


@converter("Resize")
def resize(ctx: NodeContext):
    x = ctx.input(0)
    options = _options(ctx)
    extrapolation = ctx.attr("extrapolation_value", 0.0)
    plan = _plan(ctx, x)
    if options.mode != "nearest" and not x.type.is_float:
        raise ctx.error(f"mode '{options.mode}' needs a float input, got {x.type}")
    if _is_hl_resize(x, plan, options):
        shape = list(x.type.shape)
        for axis, resize_axis in plan.items():
            shape[axis] = resize_axis.size_out
        attributes = {"mode": options.mode, "coordinate": options.transform}
        if options.mode == "nearest":
            attributes["nearest"] = options.nearest_mode
        return ctx.b.hl.resize(x, result_type=x.type.with_shape(shape), **attributes)
    y = x
    for axis, resize_axis in plan.items():
        positions = source_positions(resize_axis, options.transform)
        y = _resize_axis(ctx, y, axis, resize_axis, positions, options)
        if options.transform == "tf_crop_and_resize":
            y = _extrapolate(
                ctx, y, axis, outside_roi(positions, resize_axis.size_in), extrapolation
            )
    return y


def _is_hl_resize(x: Value, plan: dict[int, AxisResize], options: Options) -> bool:
    """Whether hl.resize says what the node says: a float [N, C, ...] resized in its spatial dims
    by nearest or (bi)linear interpolation without antialiasing, with a coordinate mapping
    hl.resize has, and scales equal to the size ratios (hl.resize maps coordinates by those).
    Linear: hl.resize clamps the source coordinate into the input, ONNX the two neighbours;
    the same value (up to rounding at the border)."""
    if not x.type.is_float or x.type.rank < 3 or not plan or options.antialias:
        return False
    if options.mode not in ("nearest", "linear"):
        return False
    if options.transform not in ("half_pixel", "align_corners", "asymmetric"):
        return False
    return all(
        axis >= 2 and math.isclose(r.scale, r.size_out / r.size_in, rel_tol=1e-12)
        for axis, r in plan.items()
    )


def _options(ctx: NodeContext) -> Options:
    mode = ctx.attr("mode", "nearest")
    transform = ctx.attr("coordinate_transformation_mode", "half_pixel")
    nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
    for value, allowed, what in (
        (mode, MODES, "mode"),
        (transform, TRANSFORMS, "coordinate_transformation_mode"),
        (nearest_mode, NEAREST_MODES, "nearest_mode"),
    ):
        if value not in allowed:
            raise ctx.error(f"{what} '{value}' is not supported ({', '.join(allowed)})")
    antialias = bool(ctx.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise ctx.error("antialias is not supported with mode 'nearest' (ONNX defines none)")
    return Options(
        mode=mode,
        transform=transform,
        nearest_mode=nearest_mode,
        cubic_a=ctx.attr("cubic_coeff_a", -0.75),
        antialias=antialias,
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
    )


def _known(ctx: NodeContext, i: int, what: str) -> np.ndarray | None:
    """Input i as a known array, None when absent or empty (ONNX's way to skip it)."""
    if not ctx.has_input(i):
        return None
    found = ctx.require_static(i, what)
    return None if found.size == 0 else found


def _plan(ctx: NodeContext, x: Value) -> dict[int, AxisResize]:
    """The axes to resize, each with its sizes, scale and region of interest."""
    rank = x.type.rank
    axes = ctx.attr("axes", None)
    axes = list(range(rank)) if axes is None else [_axis(ctx, a, rank) for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.error(f"axes {axes} repeat an axis")
    roi = _known(ctx, 1, "'roi'")
    scales = _known(ctx, 2, "'scales'")
    sizes = _known(ctx, 3, "'sizes'")
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in POLICIES:
        raise ctx.error(f"keep_aspect_ratio_policy '{policy}' is not supported")
    if (scales is None) == (sizes is None):
        raise ctx.error("exactly one of 'scales' and 'sizes' must be given")
    given = scales if scales is not None else sizes
    if given.size != len(axes):
        raise ctx.error(f"{given.size} scales or sizes for {len(axes)} axes")
    shape = x.type.shape
    if scales is not None:
        factors = [float(s) for s in scales]
        if any(f <= 0 for f in factors):
            raise ctx.error(f"scales {factors} must be positive")
        outs = [int(math.floor(f * shape[a])) for f, a in zip(factors, axes)]
    else:
        outs = [int(s) for s in sizes]
        if any(s < 0 for s in outs) or any(shape[a] == 0 for a in axes):
            raise ctx.error(f"sizes {outs} must be non-negative and the resized dims non-empty")
        factors = [s / shape[a] for s, a in zip(outs, axes)]
        if policy != "stretch":
            common = min(factors) if policy == "not_larger" else max(factors)
            factors = [common] * len(axes)
            outs = [int(common * shape[a] + 0.5) for a in axes]
    rois = _rois(ctx, roi, len(axes))
    plan = {}
    for axis, factor, out, box in zip(axes, factors, outs, rois):
        if out == shape[axis] and math.isclose(factor, 1.0) and box == (0.0, 1.0):
            continue  # nothing to do on this axis
        if shape[axis] == 0:
            raise ctx.error(f"cannot resize dim {axis} of {x.type}, which has size 0")
        plan[axis] = AxisResize(shape[axis], out, factor, box)
    return plan


def _rois(ctx: NodeContext, roi: np.ndarray | None, count: int) -> list[tuple[float, float]]:
    transform = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if roi is None or transform != "tf_crop_and_resize":
        return [(0.0, 1.0)] * count
    values = [float(v) for v in roi.reshape(-1)]
    if len(values) != 2 * count:
        raise ctx.error(f"roi has {len(values)} values, expected {2 * count} (starts, ends)")
    return list(zip(values[:count], values[count:]))


def _axis(ctx: NodeContext, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _resize_axis(
    ctx: NodeContext, x: Value, axis: int, resize_axis: AxisResize, positions, options: Options
) -> Value:
    n_in = resize_axis.size_in
    if options.mode == "nearest":
        rows = nearest_rows(positions, n_in, options.nearest_mode)
        return ctx.b.atomic.gather(x, ctx.constant(rows), axis=axis)
    weights = interpolation_weights(positions, n_in, resize_axis.scale, options)
    shape = x.type.shape
    before, after = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    grouped = ctx.b.atomic.reshape(x, result_type=x.type.with_shape((before, n_in, after)))
    w = ctx.constant(weights, x.type.element_type)
    mixed = ctx.b.atomic.matmul(w, grouped)  # (m, n) @ (before, n, after): W broadcasts
    out_shape = shape[:axis] + (resize_axis.size_out,) + shape[axis + 1 :]
    return ctx.b.atomic.reshape(mixed, result_type=x.type.with_shape(out_shape))


def _extrapolate(ctx: NodeContext, y: Value, axis: int, outside: np.ndarray, value: float):
    if not outside.any():
        return y
    mask_shape = [1] * y.type.rank
    mask_shape[axis] = len(outside)
    mask = ctx.constant(outside.reshape(mask_shape))
    return ctx.b.atomic.where(mask, ctx.scalar(value, like=y), y)

"""Converters of ONNX reductions, arg-reductions, softmax and the normalisations.

Reductions (ReduceSum ... ReduceSumSquare) take their axes as an attribute (before opset 18,
13 for ReduceSum) or as a constant input; `noop_with_empty_axes` with no axes applies the
reduction's elementwise part alone (ReduceSumSquare gives x*x, ReduceL1 |x|), as the ONNX
reference does. A reduction over no elements (an axis of size 0) is a constant: the reduction's
value on the empty set (0 for sums, 1 for the product, -inf for the maximum and log-sums).

Softmax, LogSoftmax, LayerNormalization and RMSNormalization become the hl op of that name where
it expresses the node, BatchNormalization (inference) hl.batch_norm and GroupNormalization
hl.group_norm (where the statistics are in the input's type); LayerNormalization's Mean and
InvStdDev outputs, parameters that broadcast over more than the normalised dims, training-mode
BatchNormalization, InstanceNormalization and MeanVarianceNormalization are built from atomic
ops and hl.mean. Attention is in ops_attention.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tgc.ir import Value
from tgc.types import TensorType

from .context import NodeContext
from .dtypes import element_type, onnx_type_name
from .registry import converter

# -- helpers --------------------------------------------------------------------------------------


def _reshape(ctx: NodeContext, x: Value, shape) -> Value:
    shape = tuple(int(d) for d in shape)
    if x.type.shape == shape:
        return x
    return ctx.b.atomic.reshape(x, result_type=x.type.with_shape(shape))


def _cast(ctx: NodeContext, x: Value, elem: str) -> Value:
    if x.type.element_type == elem:
        return x
    return ctx.b.atomic.cast(x, result_type=x.type.with_element_type(elem))


def _axis(ctx: NodeContext, axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank) as a non-negative index, else the node's error."""
    if not -rank <= axis < rank:
        raise ctx.error(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def _require_float(ctx: NodeContext, x: Value, what: str = "input") -> None:
    if not x.type.is_float:
        raise ctx.error(f"{what} must be a float tensor, got {x.type}")


def _stash_type(ctx: NodeContext) -> str:
    """The element type of `stash_type` (the precision of a normalisation's statistics)."""
    stash = ctx.attr("stash_type", 1)
    elem = element_type(stash)
    if elem is None or elem not in ("f16", "bf16", "f32", "f64"):
        raise ctx.error(f"stash_type {onnx_type_name(stash)} is not a float type tgc supports")
    return elem


def _broadcasts_into(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """numpy broadcasting of `shape` to `target` leaves `target` unchanged."""
    if len(shape) > len(target):
        return False
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def _param_for(ctx: NodeContext, p: Value, x: Value, axis: int, what: str) -> Value | None:
    """A scale or bias shaped for an hl norm over dims axis..end (leading 1s dropped), or None
    when it broadcasts over the leading dims of `x` too (ONNX allows it; hl does not)."""
    target = x.type.shape
    if not _broadcasts_into(p.type.shape, target):
        raise ctx.error(f"{what} {p.type} does not broadcast to the input {x.type}")
    norm_rank = len(target) - axis
    extra = p.type.shape[: max(0, p.type.rank - norm_rank)]
    if any(d != 1 for d in extra):
        return None
    return _reshape(ctx, p, p.type.shape[len(extra) :])


# -- reductions -----------------------------------------------------------------------------------


def _reduction_axes(ctx: NodeContext, rank: int) -> tuple[int, ...] | None:
    """The axes to reduce, sorted and non-negative; None when nothing is reduced (no axes and
    noop_with_empty_axes)."""
    noop = ctx.attr("noop_with_empty_axes", 0)
    if ctx.has_input(1):
        axes = ctx.require_static(1, "axes").reshape(-1).tolist()
    else:
        axes = ctx.attr("axes", [])
    if not axes:
        return None if noop else tuple(range(rank))
    out = [_axis(ctx, int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    return tuple(sorted(out))


def _reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _keep(keepdims: bool) -> dict:
    """The keepdims attribute of an atomic reduction (left at its default when false)."""
    return {"keepdims": True} if keepdims else {}


def _sum(ctx, x, axes, keepdims):
    return ctx.b.atomic.reduce_sum(x, axes=list(axes), **_keep(keepdims))


def _sum_abs(ctx, x, axes, keepdims):
    return _sum(ctx, ctx.b.atomic.abs(x), axes, keepdims)


def _sum_square(ctx, x, axes, keepdims):
    return _sum(ctx, ctx.b.atomic.mul(x, x), axes, keepdims)


def _l2(ctx, x, axes, keepdims):
    return ctx.b.atomic.sqrt(_sum_square(ctx, x, axes, keepdims))


def _log_sum(ctx, x, axes, keepdims):
    return ctx.b.atomic.log(_sum(ctx, x, axes, keepdims))


def _log_sum_exp(ctx, x, axes, keepdims):
    """m + log(sum(exp(x - m))) with m the maximum (every exponent <= 0); an infinite maximum
    is not subtracted (inf - inf would be NaN where the answer is +-inf)."""
    b = ctx.b
    m = b.atomic.reduce_max(x, axes=list(axes), keepdims=True)
    infinite = b.atomic.cmp(b.atomic.abs(m), ctx.scalar(math.inf, m), pred="eq")
    shift = b.atomic.where(infinite, ctx.scalar(0.0, m), m)
    total = _sum(ctx, b.atomic.exp(b.atomic.sub(x, shift)), axes, True)
    result = b.atomic.add(b.atomic.log(total), shift)
    return _reshape(ctx, result, _reduced_shape(x.type.shape, axes, keepdims))


def _max(ctx, x, axes, keepdims):
    return ctx.b.atomic.reduce_max(x, axes=list(axes), **_keep(keepdims))


def _min(ctx, x, axes, keepdims):
    return ctx.b.atomic.reduce_min(x, axes=list(axes), **_keep(keepdims))


def _mean(ctx, x, axes, keepdims):
    if x.type.is_float:
        return ctx.b.hl.mean(x, axes=list(axes), **_keep(keepdims))
    count = math.prod(x.type.shape[a] for a in axes)  # integers: the quotient rounds to zero
    return ctx.b.atomic.div(_sum(ctx, x, axes, keepdims), ctx.scalar(count, x))


def _slice_axis(ctx: NodeContext, x: Value, axis: int, start: int, stop: int) -> Value:
    shape = x.type.shape
    begin = [start if i == axis else 0 for i in range(len(shape))]
    end = [stop if i == axis else d for i, d in enumerate(shape)]
    return ctx.b.atomic.slice(x, start=begin, stop=end, step=[1] * len(shape))


def _prod(ctx, x, axes, keepdims):
    """No atomic product: along each axis, multiply the two halves until one element is left
    (log2(n) rounds; an odd element out joins the next round by a concat)."""
    b = ctx.b
    for axis in axes:
        while (n := x.type.shape[axis]) > 1:
            half = n // 2
            y = b.atomic.mul(
                _slice_axis(ctx, x, axis, 0, half), _slice_axis(ctx, x, axis, half, 2 * half)
            )
            if n % 2:
                y = b.atomic.concat(y, _slice_axis(ctx, x, axis, n - 1, n), axis=axis)
            x = y
    return _reshape(ctx, x, _reduced_shape(x.type.shape, axes, keepdims))


# op type -> (builder, value over no elements, whether it computes in floats only)
_REDUCTIONS: dict[str, tuple[Callable, float, bool]] = {
    "ReduceSum": (_sum, 0.0, False),
    "ReduceMean": (_mean, math.nan, False),
    "ReduceMax": (_max, -math.inf, False),
    "ReduceMin": (_min, math.inf, False),
    "ReduceProd": (_prod, 1.0, False),
    "ReduceL1": (_sum_abs, 0.0, False),
    "ReduceL2": (_l2, 0.0, True),
    "ReduceLogSum": (_log_sum, -math.inf, True),
    "ReduceLogSumExp": (_log_sum_exp, -math.inf, True),
    "ReduceSumSquare": (_sum_square, 0.0, False),
}

# What a reduction over no axes (noop_with_empty_axes) leaves: its elementwise part.
_NO_AXES: dict[str, Callable] = {
    "ReduceL1": lambda ctx, x: ctx.b.atomic.abs(x),
    "ReduceL2": lambda ctx, x: ctx.b.atomic.abs(x),
    "ReduceLogSum": lambda ctx, x: ctx.b.atomic.log(x),
    "ReduceSumSquare": lambda ctx, x: ctx.b.atomic.mul(x, x),
}


def _empty_value(ctx: NodeContext, op_type: str, t: TensorType, value: float) -> Value:
    """The reduction over no elements, as a constant of the result type `t`."""
    if not t.is_float:
        if t.element_type == "i1":
            value = op_type == "ReduceMin"  # all() of nothing is true, any() false
        elif math.isinf(value):
            info = np.iinfo(t.dtype)
            value = info.min if value < 0 else info.max
        elif math.isnan(value):
            raise ctx.error(f"the mean of no elements is undefined for {t.element_type}")
    return ctx.constant(np.full(t.shape, value, dtype=t.dtype), t.element_type)


@converter(*_REDUCTIONS)
def reduction(ctx: NodeContext):
    x = ctx.input(0)
    build, empty, float_only = _REDUCTIONS[ctx.op_type]
    keepdims = bool(ctx.attr("keepdims", 1))
    axes = _reduction_axes(ctx, x.type.rank)
    elem = x.type.element_type
    if elem == "i1" and ctx.op_type not in ("ReduceMax", "ReduceMin"):
        raise ctx.error(f"{ctx.op_type} of a bool tensor is not supported")
    if axes is None:
        part = _NO_AXES.get(ctx.op_type)
        return x if part is None else part(ctx, x)
    out_type = x.type.with_shape(_reduced_shape(x.type.shape, axes, keepdims))
    if any(x.type.shape[a] == 0 for a in axes):
        return _empty_value(ctx, ctx.op_type, out_type, empty)
    # bool max/min as integers; float-only reductions of integers in f64 (the reference's
    # numpy computes them in float64 and casts back)
    work = "i8" if elem == "i1" else "f64" if float_only and not x.type.is_float else elem
    result = build(ctx, _cast(ctx, x, work), axes, keepdims)
    return _cast(ctx, result, elem)


# -- arg-reductions -------------------------------------------------------------------------------


def _arg_extreme(
    ctx: NodeContext, x: Value, axis: int, last: bool, largest: bool, keepdims: bool = True
) -> Value:
    """The first (or last) position of the maximum (or minimum) along `axis` (i64): positions
    where x equals the extreme (or where x is NaN: a NaN extreme is no element's value), the
    others replaced by a sentinel, then the least (greatest) position."""
    b = ctx.b
    n = x.type.shape[axis]
    if n == 0:
        raise ctx.error(f"axis {axis} has size 0: there is no position to return")
    if x.type.element_type == "i1":
        x = _cast(ctx, x, "i8")
    extreme = (b.atomic.reduce_max if largest else b.atomic.reduce_min)(
        x, axes=[axis], keepdims=True
    )
    hit = b.atomic.cmp(x, extreme, pred="eq")
    if x.type.is_float:
        is_nan = b.atomic.cmp(x, x, pred="ne")
        hit = b.atomic.where(is_nan, is_nan, hit)
    positions = b.atomic.iota(axis=axis, result_type=x.type.with_element_type("i64"))
    candidates = b.atomic.where(hit, positions, ctx.scalar(-1 if last else n, positions))
    pick = b.atomic.reduce_max if last else b.atomic.reduce_min
    return pick(candidates, axes=[axis], **_keep(keepdims))


@converter("ArgMax", "ArgMin")
def arg_reduction(ctx: NodeContext):
    x = ctx.input(0)
    axis = _axis(ctx, ctx.attr("axis", 0), x.type.rank)
    keepdims = bool(ctx.attr("keepdims", 1))
    last = bool(ctx.attr("select_last_index", 0))
    return _arg_extreme(ctx, x, axis, last, ctx.op_type == "ArgMax", keepdims)


@converter("Hardmax")
def hardmax(ctx: NodeContext):
    """1 at the first position of the maximum along `axis`, 0 elsewhere (opset 13)."""
    b = ctx.b
    x = ctx.input(0)
    _require_float(ctx, x)
    axis = _axis(ctx, ctx.attr("axis", -1), x.type.rank)
    if x.type.num_elements == 0:
        return x
    first = _arg_extreme(ctx, x, axis, last=False, largest=True)
    positions = b.atomic.iota(axis=axis, result_type=x.type.with_element_type("i64"))
    one_hot = b.atomic.cmp(positions, first, pred="eq")
    return b.atomic.where(one_hot, ctx.scalar(1.0, x), ctx.scalar(0.0, x))


# -- softmax --------------------------------------------------------------------------------------


@converter("Softmax", "LogSoftmax")
def softmax(ctx: NodeContext):
    """opset 13 semantics: along `axis` alone (older opsets flattened the dims from axis on)."""
    x = ctx.input(0)
    _require_float(ctx, x)
    axis = _axis(ctx, ctx.attr("axis", -1), x.type.rank)
    if x.type.num_elements == 0:
        return x  # nothing to normalise (the hl ops refuse a reduction over no elements)
    op = ctx.b.hl.softmax if ctx.op_type == "Softmax" else ctx.b.hl.log_softmax
    return op(x, axis=axis)


# -- normalisations -------------------------------------------------------------------------------


def _moments(ctx: NodeContext, x: Value, axes: list[int], eps: float) -> tuple[Value, Value, Value]:
    """(mean, x - mean, 1/sqrt(var + eps)) over `axes`, kept as size-1 dims (two-pass variance,
    never negative)."""
    b = ctx.b
    mean = b.hl.mean(x, axes=axes, keepdims=True)
    centred = b.atomic.sub(x, mean)
    var = b.hl.mean(b.atomic.mul(centred, centred), axes=axes, keepdims=True)
    inv_std = b.atomic.rsqrt(b.atomic.add(var, ctx.scalar(eps, var)))
    return mean, centred, inv_std


def _norm_inputs(ctx: NodeContext, with_bias: bool):
    x = ctx.input(0)
    _require_float(ctx, x)
    scale = ctx.input(1)
    bias = ctx.optional_input(2) if with_bias else None
    for what, p in (("scale", scale), ("bias", bias)):
        if p is not None and p.type.element_type != x.type.element_type:
            raise ctx.error(f"{what} {p.type} and the input {x.type} differ in element type")
    axis = _axis(ctx, ctx.attr("axis", -1), x.type.rank)
    eps = ctx.attr("epsilon", 1e-5)
    if any(d == 0 for d in x.type.shape[axis:]):
        raise ctx.error(f"the normalised dims of {x.type} (from axis {axis}) hold no elements")
    return x, scale, bias, axis, eps, _stash_type(ctx)


@converter("LayerNormalization")
def layer_normalization(ctx: NodeContext):
    """hl.layernorm when only Y is wanted and the parameters span the normalised dims; else the
    atomic form, whose mean and inverse standard deviation are the Mean and InvStdDev outputs
    (in the stash type)."""
    b = ctx.b
    x, scale, bias, axis, eps, stash = _norm_inputs(ctx, with_bias=True)
    elem = x.type.element_type
    wants_stats = ctx.has_output(1) or ctx.has_output(2)
    gamma = _param_for(ctx, scale, x, axis, "scale")
    beta = ctx.scalar(0.0, x) if bias is None else _param_for(ctx, bias, x, axis, "bias")
    if not wants_stats and gamma is not None and beta is not None:
        y = b.hl.layernorm(
            _cast(ctx, x, stash),
            _cast(ctx, gamma, stash),
            _cast(ctx, beta, stash),
            axis=axis,
            eps=eps,
        )
        return _cast(ctx, y, elem)
    axes = list(range(axis, x.type.rank))
    mean, centred, inv_std = _moments(ctx, _cast(ctx, x, stash), axes, eps)
    normalized = _cast(ctx, b.atomic.mul(centred, inv_std), elem)
    y = b.atomic.mul(normalized, scale)
    if bias is not None:
        y = b.atomic.add(y, bias)
    return [y, mean if ctx.has_output(1) else None, inv_std if ctx.has_output(2) else None]


@converter("RMSNormalization")
def rms_normalization(ctx: NodeContext):
    """hl.rmsnorm (computed in the stash type) when the scale spans the normalised dims; else
    x * rsqrt(mean(x**2) + eps) * scale."""
    b = ctx.b
    x, scale, _, axis, eps, stash = _norm_inputs(ctx, with_bias=False)
    elem = x.type.element_type
    gamma = _param_for(ctx, scale, x, axis, "scale")
    if gamma is not None:
        y = b.hl.rmsnorm(_cast(ctx, x, stash), _cast(ctx, gamma, stash), axis=axis, eps=eps)
        return _cast(ctx, y, elem)
    xs = _cast(ctx, x, stash)
    ms = b.hl.mean(b.atomic.mul(xs, xs), axes=list(range(axis, x.type.rank)), keepdims=True)
    inv_rms = b.atomic.rsqrt(b.atomic.add(ms, ctx.scalar(eps, ms)))
    return b.atomic.mul(_cast(ctx, b.atomic.mul(xs, inv_rms), elem), scale)


@converter("MeanVarianceNormalization")
def mean_variance_normalization(ctx: NodeContext):
    """(x - mean) / (sqrt(var) + 1e-9) over `axes` (ONNX's function body; the variance taken
    two-pass, as mean((x - mean)**2), which cannot go negative)."""
    b = ctx.b
    x = ctx.input(0)
    _require_float(ctx, x)
    axes = [_axis(ctx, a, x.type.rank) for a in ctx.attr("axes", [0, 2, 3])]
    if len(set(axes)) != len(axes) or not axes:
        raise ctx.error(f"axes {axes} must be distinct and not empty")
    if any(x.type.shape[a] == 0 for a in axes):
        raise ctx.error(f"the normalised dims of {x.type} hold no elements")
    centred = b.atomic.sub(x, b.hl.mean(x, axes=axes, keepdims=True))
    std = b.atomic.sqrt(b.hl.mean(b.atomic.mul(centred, centred), axes=axes, keepdims=True))
    return b.atomic.div(centred, b.atomic.add(std, ctx.scalar(1e-9, std)))


def _channel_param(ctx: NodeContext, p: Value, x: Value, what: str) -> Value:
    """A [C] parameter of an [N, C, ...] input, checked."""
    channels = x.type.shape[1]
    if p.type.shape != (channels,):
        raise ctx.error(f"{what} must have shape [{channels}] (the channels), got {p.type}")
    if p.type.element_type != x.type.element_type:
        raise ctx.error(f"{what} {p.type} and the input {x.type} differ in element type")
    return p


def _per_channel(ctx: NodeContext, p: Value, x: Value, what: str) -> Value:
    """A [C] parameter of an [N, C, ...] input, reshaped to [C, 1, ...] so it broadcasts."""
    p = _channel_param(ctx, p, x, what)
    return _reshape(ctx, p, (x.type.shape[1],) + (1,) * (x.type.rank - 2))


def _channels_input(ctx: NodeContext, min_rank: int) -> Value:
    x = ctx.input(0)
    _require_float(ctx, x)
    if x.type.rank < min_rank:
        raise ctx.error(f"the input must be [N, C, ...] of rank >= {min_rank}, got {x.type}")
    return x


@converter("InstanceNormalization")
def instance_normalization(ctx: NodeContext):
    """hl.layernorm over the spatial dims (axis 2 on) without parameters, then the per-channel
    scale and bias."""
    b = ctx.b
    x = _channels_input(ctx, 3)
    scale = _per_channel(ctx, ctx.input(1), x, "scale")
    bias = _per_channel(ctx, ctx.input(2), x, "bias")
    eps = ctx.attr("epsilon", 1e-5)
    if any(d == 0 for d in x.type.shape[2:]):
        raise ctx.error(f"the spatial dims of {x.type} hold no elements")
    one, zero = ctx.scalar(1.0, x), ctx.scalar(0.0, x)
    normalized = b.hl.layernorm(x, one, zero, axis=2, eps=eps)
    return b.atomic.add(b.atomic.mul(normalized, scale), bias)


@converter("BatchNormalization")
def batch_normalization(ctx: NodeContext):
    """Inference: (x - mean) * (scale / sqrt(var + eps)) + bias per channel. training_mode: the
    batch's own statistics (biased variance over every dim but the channels) normalise x, and the
    running statistics come out blended with `momentum`."""
    b = ctx.b
    x = _channels_input(ctx, 2)
    names = ("scale", "bias", "input_mean", "input_var")
    params = [_channel_param(ctx, ctx.input(i), x, what) for i, what in enumerate(names, 1)]
    eps = ctx.attr("epsilon", 1e-5)
    momentum = ctx.attr("momentum", 0.9)
    training = bool(ctx.attr("training_mode", 0))
    if not training:
        if ctx.has_output(1) or ctx.has_output(2):
            raise ctx.error("running_mean and running_var are outputs of training_mode=1 only")
        return b.hl.batch_norm(x, *params, eps=eps)
    column = (x.type.shape[1],) + (1,) * (x.type.rank - 2)
    scale, bias, mean, var = (_reshape(ctx, p, column) for p in params)
    axes = [a for a in range(x.type.rank) if a != 1]
    if any(x.type.shape[a] == 0 for a in axes):
        raise ctx.error(f"the batch {x.type} holds no elements to take statistics over")
    batch_mean, centred, inv_std = _moments(ctx, x, axes, eps)
    y = b.atomic.add(b.atomic.mul(b.atomic.mul(centred, inv_std), scale), bias)
    outputs: list[Value | None] = [y, None, None]
    if ctx.has_output(1) or ctx.has_output(2):
        batch_var = b.hl.mean(b.atomic.mul(centred, centred), axes=axes, keepdims=True)
        keep, take = ctx.scalar(momentum, x), ctx.scalar(1.0 - momentum, x)
        channels = (x.type.shape[1],)
        for i, running, current in ((1, mean, batch_mean), (2, var, batch_var)):
            if ctx.has_output(i):
                blended = b.atomic.add(b.atomic.mul(running, keep), b.atomic.mul(current, take))
                outputs[i] = _reshape(ctx, blended, channels)
    return outputs


@converter("GroupNormalization")
def group_normalization(ctx: NodeContext):
    """hl.group_norm where the stash type is the input's; otherwise x [N, C, ...] as
    [N, G, C/G * rest]: hl.layernorm over the last dim without parameters (in the stash type),
    back to x's shape, then the per-channel scale and bias (opset 21: the ONNX checker refuses
    18's per-group parameters as deprecated)."""
    b = ctx.b
    x = _channels_input(ctx, 3)
    groups = ctx.attr("num_groups")
    eps = ctx.attr("epsilon", 1e-5)
    stash = _stash_type(ctx)
    n, c = x.type.shape[:2]
    if groups <= 0 or c % groups:
        raise ctx.error(f"num_groups {groups} does not divide the {c} channels")
    per_group = math.prod(x.type.shape[1:]) // groups
    if per_group == 0:
        raise ctx.error(f"the groups of {x.type} hold no elements")
    scale = _channel_param(ctx, ctx.input(1), x, "scale")
    bias = _channel_param(ctx, ctx.input(2), x, "bias")
    if stash == x.type.element_type:  # the statistics in x's own type: hl.group_norm's
        return b.hl.group_norm(x, scale, bias, groups=groups, eps=eps)
    scale, bias = (_per_channel(ctx, p, x, what) for p, what in ((scale, "scale"), (bias, "bias")))
    grouped = _cast(ctx, _reshape(ctx, x, (n, groups, per_group)), stash)
    one, zero = ctx.scalar(1.0, grouped), ctx.scalar(0.0, grouped)
    normalized = b.hl.layernorm(grouped, one, zero, axis=2, eps=eps)
    normalized = _cast(ctx, _reshape(ctx, normalized, x.type.shape), x.type.element_type)
    return b.atomic.add(b.atomic.mul(normalized, scale), bias)


@converter("LpNormalization")
def lp_normalization(ctx: NodeContext):
    """x / ||x||_p along `axis` (p = 1: the sum of |x|; 2: the Euclidean norm); 0 where the
    norm is 0 (as the reference, rather than 0/0)."""
    b = ctx.b
    x = ctx.input(0)
    _require_float(ctx, x)
    axis = _axis(ctx, ctx.attr("axis", -1), x.type.rank)
    p = ctx.attr("p", 2)
    if p not in (1, 2):
        raise ctx.error(f"p = {p} is not supported (1 or 2)")
    norm = (_sum_abs if p == 1 else _l2)(ctx, x, (axis,), True)
    zero = ctx.scalar(0.0, x)
    is_zero = b.atomic.cmp(norm, zero, pred="eq")
    return b.atomic.where(is_zero, zero, b.atomic.div(x, norm))

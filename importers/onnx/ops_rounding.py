"""Converters of rounding and remainders (Floor, Ceil, Round, Mod), Dropout at inference, the
hyperbolic functions Sinh and Cosh, Swish, and the running sums and products CumSum and CumProd.

Floor, Ceil, Round and Mod are atomic ops of their own. Sinh and Cosh are written with exp in a
form that neither cancels near 0 nor overflows before the function does. CumSum and CumProd are
log-step scans of shifted copies (below).
"""

from __future__ import annotations

import numpy as np
from tgc.attributes import DenseAttr
from tgc.ir import Value
from tgc.types import TensorType

from .context import NodeContext
from .registry import converter

ROUNDING = {"Floor": "floor", "Ceil": "ceil", "Round": "round"}


def _float_input(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    if not x.type.is_float:
        raise ctx.error(
            f"{ctx.op_type} of a {x.type.element_type} tensor is not supported "
            "(ONNX defines it on floats)"
        )
    return x


def _splat(ctx: NodeContext, value, shape, element_type: str) -> Value:
    t = TensorType.get(tuple(shape), element_type)
    return ctx.b.atomic.constant(value=DenseAttr.splat(value, t), result_type=t)


@converter(*ROUNDING)
def rounding(ctx: NodeContext):
    """Round takes halves to the even neighbour, as ONNX's Round does."""
    x = _float_input(ctx)
    return ctx.b.create(f"atomic.{ROUNDING[ctx.op_type]}", [x]).results[0]


@converter("Mod")
def mod(ctx: NodeContext):
    """fmod = 0: the remainder has the divisor's sign (integers only, as ONNX requires);
    fmod = 1: the dividend's. An integer remainder by 0 is 0 (tgc's rule, numpy's value)."""
    a, b = ctx.input(0), ctx.input(1)
    fmod = ctx.attr("fmod", 0)
    if fmod not in (0, 1):
        raise ctx.error(f"fmod = {fmod} is not supported (only 0 and 1)")
    if a.type.is_float and not fmod:
        raise ctx.error(
            f"fmod = 0 on {a.type.element_type} inputs is not supported "
            "(ONNX requires fmod = 1 for floating-point types)"
        )
    return ctx.b.atomic.mod(a, b, fmod=bool(fmod))


# -- Dropout --------------------------------------------------------------------------------------


def _flag(ctx: NodeContext, i: int, what: str) -> bool:
    value = ctx.static(i)
    if value is None:
        raise ctx.error(
            f"{what} ('{ctx.input_name(i)}') must be a constant: a dropout decided when the "
            "model runs is not supported"
        )
    if value.size != 1:
        raise ctx.error(f"{what} must hold one value, got shape {list(value.shape)}")
    return bool(value.reshape(-1)[0])


@converter("Dropout")
def dropout(ctx: NodeContext):
    """Inference: the output is the input and the mask is all true. In training mode only a
    ratio of 0 means the same; any other ratio draws a random mask, which tgc does not."""
    x = ctx.input(0)
    ctx.ignore_attr("seed")  # only a random mask would read it
    training = ctx.has_input(2) and _flag(ctx, 2, "training_mode")
    if training:
        ratio = 0.5  # the schema's default
        if ctx.has_input(1):
            found = ctx.static(1)
            if found is None:
                raise ctx.error(
                    f"ratio ('{ctx.input_name(1)}') must be a constant when training_mode is true"
                )
            ratio = float(np.asarray(found).reshape(-1)[0])
        if ratio != 0:
            raise ctx.error(
                f"training_mode = true with ratio {ratio:g} is not supported (a random mask; "
                "tgc imports inference graphs: export with training_mode false or absent)"
            )
    elif ctx.has_input(1):
        ctx.input_type(1)  # at inference the ratio does not change the result
    mask = _splat(ctx, True, x.type.shape, "i1") if ctx.has_output(1) else None
    return [x, mask] if ctx.num_outputs > 1 else x


# -- hyperbolic functions and Swish ---------------------------------------------------------------

# sinh(x) = sum_k x^(2k+1) / (2k+1)! for |x| < 1 (terms to x^17: the next is < 1e-17 relative),
# where (e^|x| - e^-|x|) / 2 would cancel; the exp form at |x| >= 1 loses at most coth(1) ~ 1.3
# roundings.
_SINH_TERMS = 9


def _half_exps(ctx: NodeContext, a: Value) -> tuple[Value, Value]:
    """(e^a / 2, e^-a / 2) for a >= 0 as (e/2)*e and (1/(2e))/e with e = e^(a/2): e^a itself
    overflows up to ln 2 before e^a / 2 does (88.7 against 89.4 in f32)."""
    b = ctx.b.atomic
    half = ctx.scalar(0.5, a)
    e = b.exp(b.mul(a, half))
    return b.mul(b.mul(e, half), e), b.div(b.div(half, e), e)


def _sinh_series(ctx: NodeContext, x: Value) -> Value:
    """x * (1 + x^2/3! + x^4/5! + ...) by Horner's rule in x^2."""
    b = ctx.b.atomic
    x2 = b.mul(x, x)
    factorials = [1.0]
    for k in range(1, _SINH_TERMS):
        factorials.append(factorials[-1] * (2 * k) * (2 * k + 1))
    acc = ctx.scalar(1.0 / factorials[-1], x)
    for f in reversed(factorials[:-1]):
        acc = b.add(b.mul(acc, x2), ctx.scalar(1.0 / f, x))
    return b.mul(x, acc)


@converter("Sinh")
def sinh(ctx: NodeContext):
    x = _float_input(ctx)
    b = ctx.b.atomic
    a = b.abs(x)
    up, down = _half_exps(ctx, a)
    large = b.sub(up, down)
    large = b.where(b.cmp(x, ctx.scalar(0.0, x), pred="lt"), b.neg(large), large)
    small = b.cmp(a, ctx.scalar(1.0, x), pred="lt")  # false for NaN: the exp form keeps it
    return b.where(small, _sinh_series(ctx, x), large)


@converter("Cosh")
def cosh(ctx: NodeContext):
    x = _float_input(ctx)
    up, down = _half_exps(ctx, ctx.b.atomic.abs(x))
    return ctx.b.atomic.add(up, down)


@converter("Swish")
def swish(ctx: NodeContext):
    """x * sigmoid(alpha * x); alpha = 1 is hl.silu."""
    x = _float_input(ctx)
    alpha = ctx.attr("alpha", 1.0)
    if alpha == 1.0:
        return ctx.b.hl.silu(x)
    scaled = ctx.b.atomic.mul(x, ctx.scalar(alpha, x))
    return ctx.b.atomic.mul(x, ctx.b.hl.sigmoid(scaled))


# -- running sums and products --------------------------------------------------------------------

# A scan by doubling (Hillis-Steele): after step j every element holds the combination of the
# 2^j elements ending at it, so ceil(log2 n) steps of "combine with a copy shifted by 2^j, the
# identity shifted in" give the running total along an axis of size n. It takes
# O(n log n) work in elementwise ops, slices and concats only, so it is exact for integers, works
# for products as for sums, and fuses on every backend; a matmul with a triangular 0/1 matrix
# would be float-only, sums only and O(n^2).
_SCANS = {"CumSum": ("add", 0), "CumProd": ("mul", 1)}


class _Scan:
    """Shifts of `x`'s type along `axis` toward the scan's direction, filled with `identity`."""

    def __init__(self, ctx: NodeContext, like: Value, axis: int, reverse: bool, identity) -> None:
        self.ctx, self.type, self.axis = ctx, like.type, axis
        self.reverse, self.identity = reverse, identity
        self.n = like.type.shape[axis]

    def fill(self, k: int) -> Value:
        shape = list(self.type.shape)
        shape[self.axis] = k
        return _splat(self.ctx, self.identity, shape, self.type.element_type)

    def shifted(self, x: Value, k: int) -> Value:
        """y[i] = x[i - k] (x[i + k] in reverse), the identity where that is outside."""
        if k >= self.n:
            return self.fill(self.n)
        rank = self.type.rank
        start, stop = [0] * rank, list(self.type.shape)
        if self.reverse:
            start[self.axis] = k
        else:
            stop[self.axis] = self.n - k
        kept = self.ctx.b.atomic.slice(x, start=start, stop=stop, step=[1] * rank)
        pieces = [kept, self.fill(k)] if self.reverse else [self.fill(k), kept]
        return self.ctx.b.atomic.concat(*pieces, axis=self.axis)


@converter(*_SCANS)
def cumulative(ctx: NodeContext):
    x = ctx.input(0)
    axis_value = ctx.require_static(1, "'axis'")
    exclusive, reverse = ctx.attr("exclusive", 0), ctx.attr("reverse", 0)
    if x.type.element_type == "i1":
        raise ctx.error(f"{ctx.op_type} of a bool tensor is not supported")
    if axis_value.size != 1:
        raise ctx.error(f"'axis' must hold one integer, got shape {list(axis_value.shape)}")
    axis, rank = int(axis_value.reshape(-1)[0]), x.type.rank
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    combine, identity = _SCANS[ctx.op_type]
    scan = _Scan(ctx, x, axis % rank, bool(reverse), identity)
    if exclusive:
        x = scan.shifted(x, 1)
    k = 1
    while k < scan.n:
        x = ctx.b.create(f"atomic.{combine}", [x, scan.shifted(x, k)]).results[0]
        k *= 2
    return x

"""Converters of elementwise math and comparisons, Where, Cast, Constant, Identity, the variadic
Max/Min/Sum/Mean, MatMul and Gemm.

Activations that tgc has no op for are written as their formulas in atomic ops, in a form that
stays finite where the function is (Softplus never takes exp of a large positive number).
"""

from __future__ import annotations

import math

import numpy as np
from tgc.ir import Value

from .context import NodeContext
from .dtypes import SUPPORTED_WORDS, element_type, onnx_type_name
from .registry import converter

# -- elementwise arithmetic -----------------------------------------------------------------------

# ONNX op -> atomic op; both sides broadcast (ONNX's multidirectional rule is numpy's).
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
UNARY_ATOMIC = {
    "Neg": "neg",
    "Abs": "abs",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Reciprocal": "recip",
    "Erf": "erf",
    "Sin": "sin",
    "Cos": "cos",
}
UNARY_HL = {"Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu"}
COMPARISONS = {
    "Equal": "eq",
    "Less": "lt",
    "LessOrEqual": "le",
    "Greater": "gt",
    "GreaterOrEqual": "ge",
}


def _atomic(ctx: NodeContext, op: str, *operands: Value, **attributes) -> Value:
    return ctx.b.create(f"atomic.{op}", list(operands), attributes).results[0]


@converter(*BINARY)
def binary(ctx: NodeContext):
    return _atomic(ctx, BINARY[ctx.op_type], ctx.input(0), ctx.input(1))


@converter(*UNARY_ATOMIC)
def unary_atomic(ctx: NodeContext):
    return _atomic(ctx, UNARY_ATOMIC[ctx.op_type], ctx.input(0))


@converter(*UNARY_HL)
def unary_hl(ctx: NodeContext):
    return ctx.b.create(f"hl.{UNARY_HL[ctx.op_type]}", [ctx.input(0)]).results[0]


@converter("Gelu")
def gelu(ctx: NodeContext):
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"approximate = '{approximate}' is not supported (only 'none', 'tanh')")
    return ctx.b.hl.gelu(ctx.input(0), approximate=approximate)


@converter("Pow")
def pow_(ctx: NodeContext):
    """x ** y; the exponent may have another element type than the base (it is cast to the
    base's). An integer base is computed in f64 and cast back, as numpy's integer power is exact
    for results an f64 holds exactly."""
    x, y = ctx.input(0), ctx.input(1)
    if y.type.element_type != x.type.element_type:
        y = _cast(ctx, y, x.type.element_type)
    if x.type.is_float:
        return ctx.b.atomic.pow(x, y)
    wide = ctx.b.atomic.pow(_cast(ctx, x, "f64"), _cast(ctx, y, "f64"))
    return _cast(ctx, wide, x.type.element_type)


@converter("Sign")
def sign(ctx: NodeContext):
    x = ctx.input(0)
    zero, one = ctx.scalar(0, x), ctx.scalar(1, x)
    positive = ctx.b.atomic.cmp(x, zero, pred="gt")
    negative = ctx.b.atomic.cmp(x, zero, pred="lt")
    minus_one = ctx.b.atomic.neg(one)
    y = ctx.b.atomic.where(positive, one, ctx.b.atomic.where(negative, minus_one, zero))
    if x.type.is_float:  # NaN stays NaN
        y = ctx.b.atomic.where(ctx.b.atomic.cmp(x, x, pred="ne"), x, y)
    return y


@converter("Tan")
def tan(ctx: NodeContext):
    x = ctx.input(0)
    return ctx.b.atomic.div(ctx.b.atomic.sin(x), ctx.b.atomic.cos(x))


# -- activations as formulas ------------------------------------------------------------------------


def _float_input(ctx: NodeContext, i: int = 0) -> Value:
    x = ctx.input(i)
    if not x.type.is_float:
        raise ctx.error(f"input #{i} must have a float element type, got {x.type}")
    return x


@converter("LeakyRelu")
def leaky_relu(ctx: NodeContext):
    x = _float_input(ctx)
    alpha = ctx.attr("alpha", 0.01)
    negative = ctx.b.atomic.cmp(x, ctx.scalar(0.0, x), pred="lt")
    return ctx.b.atomic.where(negative, ctx.b.atomic.mul(x, ctx.scalar(alpha, x)), x)


@converter("PRelu")
def prelu(ctx: NodeContext):
    """x where x >= 0, slope * x elsewhere; slope broadcasts to x (unidirectionally)."""
    x, slope = ctx.input(0), ctx.input(1)
    negative = ctx.b.atomic.cmp(x, ctx.scalar(0, x), pred="lt")
    y = ctx.b.atomic.where(negative, ctx.b.atomic.mul(x, slope), x)
    if y.type.shape != x.type.shape:
        raise ctx.error(f"slope {slope.type} does not broadcast to the input {x.type}")
    return y


def _elu_negative(ctx: NodeContext, x: Value, alpha: float, scale: float = 1.0) -> Value:
    """alpha * (exp(min(x, 0)) - 1): exp of a non-positive number, so it never overflows."""
    clipped = ctx.b.atomic.min(x, ctx.scalar(0.0, x))
    expm1 = ctx.b.atomic.sub(ctx.b.atomic.exp(clipped), ctx.scalar(1.0, x))
    return ctx.b.atomic.mul(expm1, ctx.scalar(alpha * scale, x))


@converter("Elu")
def elu(ctx: NodeContext):
    x = _float_input(ctx)
    alpha = ctx.attr("alpha", 1.0)
    negative = ctx.b.atomic.cmp(x, ctx.scalar(0.0, x), pred="lt")
    return ctx.b.atomic.where(negative, _elu_negative(ctx, x, alpha), x)


@converter("Celu")
def celu(ctx: NodeContext):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = _float_input(ctx)
    alpha = ctx.attr("alpha", 1.0)
    if alpha == 0:
        raise ctx.error("alpha = 0 is not supported (it divides by alpha)")
    scaled = ctx.b.atomic.mul(x, ctx.scalar(1.0 / alpha, x))
    negative_part = _elu_negative(ctx, scaled, alpha)
    positive_part = ctx.b.atomic.max(x, ctx.scalar(0.0, x))
    return ctx.b.atomic.add(positive_part, negative_part)


@converter("Selu")
def selu(ctx: NodeContext):
    x = _float_input(ctx)
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    negative = ctx.b.atomic.cmp(x, ctx.scalar(0.0, x), pred="le")
    positive = ctx.b.atomic.mul(x, ctx.scalar(gamma, x))
    return ctx.b.atomic.where(negative, _elu_negative(ctx, x, alpha, gamma), positive)


@converter("ThresholdedRelu")
def thresholded_relu(ctx: NodeContext):
    x = _float_input(ctx)
    alpha = ctx.attr("alpha", 1.0)
    above = ctx.b.atomic.cmp(x, ctx.scalar(alpha, x), pred="gt")
    return ctx.b.atomic.where(above, x, ctx.scalar(0.0, x))


def _clamp01(ctx: NodeContext, x: Value) -> Value:
    return ctx.b.atomic.min(ctx.b.atomic.max(x, ctx.scalar(0.0, x)), ctx.scalar(1.0, x))


@converter("HardSigmoid")
def hard_sigmoid(ctx: NodeContext):
    """max(0, min(1, alpha * x + beta))."""
    x = _float_input(ctx)
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    linear = ctx.b.atomic.add(ctx.b.atomic.mul(x, ctx.scalar(alpha, x)), ctx.scalar(beta, x))
    return _clamp01(ctx, linear)


@converter("HardSwish")
def hard_swish(ctx: NodeContext):
    """x * max(0, min(1, x / 6 + 1/2))."""
    x = _float_input(ctx)
    linear = ctx.b.atomic.add(ctx.b.atomic.mul(x, ctx.scalar(1 / 6, x)), ctx.scalar(0.5, x))
    return ctx.b.atomic.mul(x, _clamp01(ctx, linear))


def _softplus(ctx: NodeContext, x: Value) -> Value:
    """log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): exp never overflows."""
    tail = ctx.b.atomic.exp(ctx.b.atomic.neg(ctx.b.atomic.abs(x)))
    log1p = ctx.b.atomic.log(ctx.b.atomic.add(ctx.scalar(1.0, x), tail))
    return ctx.b.atomic.add(ctx.b.atomic.max(x, ctx.scalar(0.0, x)), log1p)


@converter("Softplus")
def softplus(ctx: NodeContext):
    return _softplus(ctx, _float_input(ctx))


@converter("Mish")
def mish(ctx: NodeContext):
    x = _float_input(ctx)
    return ctx.b.atomic.mul(x, ctx.b.hl.tanh(_softplus(ctx, x)))


@converter("Softsign")
def softsign(ctx: NodeContext):
    x = _float_input(ctx)
    return ctx.b.atomic.div(x, ctx.b.atomic.add(ctx.scalar(1.0, x), ctx.b.atomic.abs(x)))


@converter("Clip")
def clip(ctx: NodeContext):
    """min(max(x, lo), hi) with optional rank-0 bounds (opset 11 and later: inputs)."""
    x = ctx.input(0)
    for i, op in ((1, "max"), (2, "min")):
        bound = ctx.optional_input(i)
        if bound is None:
            continue
        if bound.type.num_elements != 1:
            raise ctx.error(f"input #{i} must be a scalar, got {bound.type}")
        if bound.type.rank != 0:  # a one-element tensor: as a scalar, so x keeps its shape
            bound = ctx.b.atomic.reshape(bound, result_type=bound.type.with_shape(()))
        x = _atomic(ctx, op, x, bound)
    return x


# -- comparisons and logic --------------------------------------------------------------------------


@converter(*COMPARISONS)
def compare(ctx: NodeContext):
    return ctx.b.atomic.cmp(ctx.input(0), ctx.input(1), pred=COMPARISONS[ctx.op_type])


def _bool_input(ctx: NodeContext, i: int) -> Value:
    x = ctx.input(i)
    if x.type.element_type != "i1":
        raise ctx.error(f"input #{i} must be bool, got {x.type}")
    return x


@converter("Not")
def not_(ctx: NodeContext):
    x = _bool_input(ctx, 0)
    return ctx.b.atomic.cmp(x, ctx.scalar(False, x), pred="eq")


@converter("And", "Or", "Xor")
def logical(ctx: NodeContext):
    a, b = _bool_input(ctx, 0), _bool_input(ctx, 1)
    if ctx.op_type == "Xor":
        return ctx.b.atomic.cmp(a, b, pred="ne")
    if ctx.op_type == "And":  # a ? b : false
        return ctx.b.atomic.where(a, b, ctx.scalar(False, a))
    return ctx.b.atomic.where(a, ctx.scalar(True, a), b)  # a ? true : b


@converter("IsNaN")
def is_nan(ctx: NodeContext):
    x = _float_input(ctx)
    return ctx.b.atomic.cmp(x, x, pred="ne")


@converter("IsInf")
def is_inf(ctx: NodeContext):
    x = _float_input(ctx)
    positive, negative = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if positive and negative:
        return ctx.b.atomic.cmp(ctx.b.atomic.abs(x), ctx.scalar(math.inf, x), pred="eq")
    if positive or negative:
        return ctx.b.atomic.cmp(x, ctx.scalar(math.inf if positive else -math.inf, x), pred="eq")
    # Neither: false everywhere (|x| < -1 holds for no x, NaN included).
    return ctx.b.atomic.cmp(ctx.b.atomic.abs(x), ctx.scalar(-1.0, x), pred="lt")


@converter("Where")
def where(ctx: NodeContext):
    return ctx.b.atomic.where(_bool_input(ctx, 0), ctx.input(1), ctx.input(2))


# -- types and constants ----------------------------------------------------------------------------


def _cast(ctx: NodeContext, x: Value, elem: str) -> Value:
    if x.type.element_type == elem:
        return x
    return ctx.b.atomic.cast(x, result_type=x.type.with_element_type(elem))


def _target_element_type(ctx: NodeContext, data_type: int) -> str:
    elem = element_type(data_type)
    if elem is None:
        raise ctx.error(
            f"casting to {onnx_type_name(data_type)} is not supported (tgc's element types: "
            f"{SUPPORTED_WORDS})"
        )
    return elem


@converter("Cast")
def cast(ctx: NodeContext):
    # saturate and round_mode only concern float8 targets, which are refused anyway.
    ctx.ignore_attr("saturate", "round_mode")
    return _cast(ctx, ctx.input(0), _target_element_type(ctx, ctx.attr("to")))


@converter("CastLike")
def cast_like(ctx: NodeContext):
    ctx.ignore_attr("saturate", "round_mode")
    return _cast(ctx, ctx.input(0), ctx.input_type(1).element_type)


# Constant's value attributes and the numpy dtype each gives.
_CONSTANT_LISTS = {
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}


@converter("Constant")
def constant(ctx: NodeContext):
    """A value known at import time (it becomes an atomic.constant where an op reads it)."""
    for unsupported in ("value_string", "value_strings", "sparse_value"):
        if ctx.has_attr(unsupported):
            ctx.attr(unsupported, None)
            raise ctx.error(f"attribute '{unsupported}' is not supported (no such tgc tensor)")
    if ctx.has_attr("value"):
        return np.asarray(ctx.attr("value"))
    for key, dtype in _CONSTANT_LISTS.items():
        if ctx.has_attr(key):
            return np.asarray(ctx.attr(key), dtype=dtype)
    raise ctx.error("it has no value attribute")


@converter("Identity")
def identity(ctx: NodeContext):
    known = ctx.static(0)
    return known if known is not None else ctx.input(0)


# -- variadic ---------------------------------------------------------------------------------------

VARIADIC = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}


@converter(*VARIADIC)
def variadic(ctx: NodeContext):
    """A left fold of the inputs (numpy broadcasting); Mean divides the sum by their number."""
    operands = ctx.inputs()
    if not operands:
        raise ctx.error("it needs at least one input")
    y = operands[0]
    for x in operands[1:]:
        y = _atomic(ctx, VARIADIC[ctx.op_type], y, x)
    if ctx.op_type == "Mean" and len(operands) > 1:
        y = ctx.b.atomic.div(y, ctx.scalar(len(operands), y))
    return y


# -- matrix products --------------------------------------------------------------------------------


@converter("MatMul")
def matmul(ctx: NodeContext):
    """np.matmul: a 1-D operand is a row (left) or a column (right), that dim removed after."""
    a, b = ctx.input(0), ctx.input(1)
    if a.type.rank == 0 or b.type.rank == 0:
        raise ctx.error(f"operands must have rank >= 1, got {a.type} and {b.type}")
    a_vector, b_vector = a.type.rank == 1, b.type.rank == 1
    if a_vector:
        a = ctx.b.atomic.reshape(a, result_type=a.type.with_shape((1, a.type.shape[0])))
    if b_vector:
        b = ctx.b.atomic.reshape(b, result_type=b.type.with_shape((b.type.shape[0], 1)))
    y = ctx.b.atomic.matmul(a, b)
    if not (a_vector or b_vector):
        return y
    shape = list(y.type.shape)
    if b_vector:
        del shape[-1]  # the column of width 1
    if a_vector:
        del shape[-1 if b_vector else -2]  # the row of height 1
    return ctx.b.atomic.reshape(y, result_type=y.type.with_shape(shape))


@converter("Gemm")
def gemm(ctx: NodeContext):
    """alpha * A' @ B' + beta * C, A' = A or A^T (transA), B' likewise; C broadcasts to [M, N]."""
    a, b = ctx.input(0), ctx.input(1)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    trans_a, trans_b = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    if a.type.rank != 2 or b.type.rank != 2:
        raise ctx.error(f"A and B must have rank 2, got {a.type} and {b.type}")
    # A false flag is left out (None), so the op prints as written by hand.
    y = ctx.b.atomic.matmul(a, b, transpose_a=trans_a or None, transpose_b=trans_b or None)
    if alpha != 1.0:
        y = ctx.b.atomic.mul(y, _coefficient(ctx, alpha, y, "alpha"))
    c = ctx.optional_input(2)
    if c is None:
        return y
    if beta != 1.0:
        c = ctx.b.atomic.mul(c, _coefficient(ctx, beta, c, "beta"))
    out = ctx.b.atomic.add(y, c)
    if out.type.shape != y.type.shape:
        raise ctx.error(
            f"C {c.type} does not broadcast to the product's shape {list(y.type.shape)}"
        )
    return out


def _coefficient(ctx: NodeContext, value: float, like: Value, name: str) -> Value:
    if not like.type.is_float and value != int(value):
        raise ctx.error(f"{name} = {value} on integers is not supported")
    return ctx.scalar(value, like)

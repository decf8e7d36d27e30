"""Lowerings of the rounding aten ops: floor, ceil, round (and round with decimals), trunc,
remainder, fmod, and the rounding modes of division (floor_divide, div with rounding_mode).

Each follows PyTorch's CPU kernel step by step, so the result is PyTorch's to the bit:
- floor, ceil, round and trunc of an integer tensor are the tensor itself;
- float16 and bfloat16 are computed where the kernels compute them: round with decimals and
  remainder in float32 (PyTorch's "opmath" type), rounded once at the end; floor and trunc
  division in the tensor's own type, every step rounded (float16 arithmetic), except by a
  one-element divisor, which the kernels take in float32 from its value before the cast to the
  result's type (floor of a float16 quotient is not floor of the float32 one);
- floor division of floats is not floor(a / b): PyTorch follows Python's float `//`
  ((a - fmod(a, b)) / b, then corrections), which keeps a == (a // b) * b + a % b
  (1.0 // 0.1 is 9.0, while floor(1.0 / 0.1) is 10.0);
- an integer divisor of 0, for which PyTorch raises ZeroDivisionError, gives 0: tgc's rule for
  integer division and remainder (docs/ir.md).
"""

from __future__ import annotations

import numpy as np

from tgc.importers.torch._context import Cx, Static
from tgc.importers.torch._registry import lowering
from tgc.ir import Value
from tgc.types import NUMPY_DTYPES

_REDUCED_FLOATS = ("f16", "bf16")


def _opmath(elem: str) -> str:
    """The element type PyTorch's CPU kernels compute `elem` in."""
    return "f32" if elem in _REDUCED_FLOATS else elem


# -- one operand ----------------------------------------------------------------------------------


def trunc(cx: Cx, x: Value) -> Value:
    """Round toward zero: ceil below 0, floor elsewhere (NaN, +-inf and -0.0 stay)."""
    negative = cx.b.atomic.cmp(x, cx.scalar(0, x.type.element_type), pred="lt")
    return cx.b.atomic.where(negative, cx.b.atomic.ceil(x), cx.b.atomic.floor(x))


@lowering("floor", "ceil", "round", "trunc", "fix")
def rounding(cx: Cx) -> Value:
    op = cx.node.target._opname
    x = cx.value("self")
    if not x.type.is_float:
        if op == "round" and cx.args.get("decimals", 0):
            raise cx.error(
                f"round with decimals={cx.arg('decimals')} of an {x.type.element_type} tensor "
                "(PyTorch has no kernel for it)"
            )
        return x  # an integer is already integral (PyTorch returns a copy)
    if op == "round" and cx.args.get("decimals", 0):
        return _round_decimals(cx, x, cx.arg("decimals"))
    if op in ("trunc", "fix"):
        return trunc(cx, x)
    return getattr(cx.b.atomic, op)(x)  # atomic.floor, ceil, round (halves to even)


def _round_decimals(cx: Cx, x: Value, decimals: int) -> Value:
    """PyTorch's kernel: nearbyint(x * 10**d) / 10**d, or nearbyint(x / 10**-d) * 10**-d for a
    negative d, in opmath, with 10**|d| computed in double and rounded to opmath (inf where it
    overflows, as there)."""
    elem = x.type.element_type
    op_elem = _opmath(elem)
    with np.errstate(over="ignore"):
        power = np.power(np.float64(10.0), abs(decimals)).astype(NUMPY_DTYPES[op_elem])
    ten = cx.scalar(power.item(), op_elem)
    y = cx.cast(x, op_elem)
    if decimals > 0:
        y = cx.b.atomic.div(cx.b.atomic.round(cx.b.atomic.mul(y, ten)), ten)
    else:
        y = cx.b.atomic.mul(cx.b.atomic.round(cx.b.atomic.div(y, ten)), ten)
    return cx.cast(y, elem)


# -- two operands ---------------------------------------------------------------------------------


def _operands_in(cx: Cx, elem: str) -> tuple[Value, Value]:
    if elem == "i1":
        raise cx.error(
            f"aten.{cx.node.target._opname} of bool tensors (tgc's remainders and rounded "
            "quotients are of numbers)"
        )
    return cx.value("self", elem), cx.value("other", elem)


@lowering("remainder", "fmod")
def remainder(cx: Cx) -> Value:
    """remainder: the sign of the divisor (Python's %, np.mod); fmod: the sign of the dividend
    (C's fmod). Both overloads (Tensor, Scalar) and remainder(Scalar, Tensor)."""
    elem = cx.out.element_type
    # Operands in the result's type, the arithmetic in opmath (float16: float32), one rounding.
    a, b = (cx.cast(v, _opmath(elem)) for v in _operands_in(cx, elem))
    fmod = cx.node.target._opname == "fmod"
    return cx.cast(cx.b.atomic.mod(a, b, fmod=fmod), elem)


@lowering("floor_divide")
def floor_divide(cx: Cx) -> Value:
    """a // b: floored division (the decomposition makes it div(rounding_mode='floor'))."""
    return divide_rounded(cx, "floor")


def divide_rounded(cx: Cx, mode: str) -> Value:
    """div(self, other, rounding_mode=mode) for 'floor' and 'trunc', in the result's type."""
    elem = cx.out.element_type
    if elem in _REDUCED_FLOATS and _num_elements(cx.arg("other")) == 1:
        # PyTorch's CPU kernels divide by a one-element divisor in float32, taking its value
        # from before the cast to the result's type, and round once at the end.
        a = cx.cast(cx.value("self", elem), "f32")
        b = cx.value("other", "f32")
        rounded = trunc(cx, cx.b.atomic.div(a, b)) if mode == "trunc" else _floor_float(cx, a, b)
        return cx.cast(rounded, elem)
    a, b = _operands_in(cx, elem)
    if not a.type.is_float:
        quotient = cx.b.atomic.div(a, b)  # rounds toward zero
        if mode == "trunc":
            return quotient
        return _floor_integer(cx, a, b, quotient)
    if mode == "trunc":
        return trunc(cx, cx.b.atomic.div(a, b))
    return _floor_float(cx, a, b)


def _num_elements(x) -> int:
    if isinstance(x, Value):
        return x.type.num_elements
    if isinstance(x, Static):
        return x.tensor.numel()
    return 1  # a Python number


def _rounds_down(cx: Cx, rem: Value, b: Value) -> Value:
    """Where floored division is one below truncated division: the truncated remainder is not 0
    and its sign is not the divisor's."""
    zero = cx.scalar(0, rem.type.element_type)
    nonzero = cx.b.atomic.cmp(rem, zero, pred="ne")
    rem_negative = cx.b.atomic.cmp(rem, zero, pred="lt")
    b_negative = cx.b.atomic.cmp(b, zero, pred="lt")
    signs_differ = cx.b.atomic.cmp(rem_negative, b_negative, pred="ne")
    return cx.b.atomic.where(nonzero, signs_differ, cx.scalar(False, "i1"))


def _floor_integer(cx: Cx, a: Value, b: Value, quotient: Value) -> Value:
    """c10::div_floor_integer: the truncated quotient, less one where the remainder is not 0
    and the signs differ (never overflows where the floored quotient exists)."""
    rem = cx.b.atomic.mod(a, b, fmod=True)
    elem = quotient.type.element_type
    lower = cx.b.atomic.sub(quotient, cx.scalar(1, elem))
    return cx.b.atomic.where(_rounds_down(cx, rem, b), lower, quotient)


def _floor_float(cx: Cx, a: Value, b: Value) -> Value:
    """c10::div_floor_floating (Python's float //):
    b == 0: a / b; else mod = fmod(a, b), div = (a - mod) / b, less 1 where the signs differ;
    floor(div), plus 1 where div - floor(div) > 0.5; a zero quotient takes the sign of a / b."""
    elem = a.type.element_type
    atomic = cx.b.atomic
    zero, one = cx.scalar(0, elem), cx.scalar(1, elem)
    basic = atomic.div(a, b)
    mod = atomic.mod(a, b, fmod=True)
    div = atomic.div(atomic.sub(a, mod), b)
    div = atomic.where(_rounds_down(cx, mod, b), atomic.sub(div, one), div)
    floored = atomic.floor(div)
    past_half = atomic.cmp(atomic.sub(div, floored), cx.scalar(0.5, elem), pred="gt")
    floored = atomic.where(past_half, atomic.add(floored, one), floored)
    # copysign(0, a / b): a / b is finite here, so 0 * (a / b) is the zero of its sign.
    signed_zero = atomic.mul(zero, basic)
    floored = atomic.where(atomic.cmp(div, zero, pred="eq"), signed_zero, floored)
    return atomic.where(atomic.cmp(b, zero, pred="eq"), basic, floored)

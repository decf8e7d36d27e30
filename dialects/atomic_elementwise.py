"""The elementwise ops of the `atomic` dialect: one-operand (`UnaryOp`) and two-operand
(`BinaryOp`, numpy broadcasting) arithmetic, comparison, select and cast.

Each op is one class: signature, traits, type inference, verifier and numpy meaning; most only
set a name and a numpy function. Registered when `tgc.dialects.atomic` is imported.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.diagnostics import VerifyError
from tgc.dialects._shapes import broadcast_shapes, same_element_type, same_encoding
from tgc.ir import Operation
from tgc.opdef import (
    ASSOCIATIVE,
    BOOL,
    BROADCASTING,
    COMMUTATIVE,
    ELEMENTWISE,
    PURE,
    Attr,
    Operand,
    attrs,
    enum,
    register,
)
from tgc.types import TensorType


class UnaryOp(Operation):
    """Base of one-operand elementwise ops: the result has the operand's type."""

    operand_defs = (Operand("x"),)
    traits = frozenset({PURE, ELEMENTWISE})
    float_only = True

    @staticmethod
    def fn(x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def infer(self):
        (x,) = self.operands
        if self.float_only and not x.type.is_float:
            raise VerifyError(f"operand must have a float element type, got {x.type}")
        return [x.type]

    def reference(self, x):
        return self.fn(x)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype, copy=False)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return 1 / np.sqrt(x)


def _recip(x: np.ndarray) -> np.ndarray:
    return 1 / x


@register
class NegOp(UnaryOp):
    """-x. `%y = atomic.neg %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.neg"
    float_only = False
    fn = staticmethod(np.negative)


@register
class ExpOp(UnaryOp):
    """e**x. `%y = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.exp"
    fn = staticmethod(np.exp)


@register
class LogOp(UnaryOp):
    """Natural logarithm. `%y = atomic.log %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.log"
    fn = staticmethod(np.log)


@register
class SqrtOp(UnaryOp):
    """Square root. `%y = atomic.sqrt %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.sqrt"
    fn = staticmethod(np.sqrt)


@register
class RsqrtOp(UnaryOp):
    """1/sqrt(x). `%y = atomic.rsqrt %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.rsqrt"
    fn = staticmethod(_rsqrt)


@register
class RecipOp(UnaryOp):
    """1/x. `%y = atomic.recip %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.recip"
    fn = staticmethod(_recip)


@register
class AbsOp(UnaryOp):
    """|x|. `%y = atomic.abs %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.abs"
    float_only = False
    fn = staticmethod(np.abs)


@register
class ErfOp(UnaryOp):
    """The error function. `%y = atomic.erf %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.erf"
    fn = staticmethod(_erf)


@register
class SinOp(UnaryOp):
    """Sine. `%y = atomic.sin %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.sin"
    fn = staticmethod(np.sin)


@register
class CosOp(UnaryOp):
    """Cosine. `%y = atomic.cos %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.cos"
    fn = staticmethod(np.cos)


@register
class FloorOp(UnaryOp):
    """Round toward -inf (floats; NaN and +-inf stay).
    `%y = atomic.floor %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.floor"
    fn = staticmethod(np.floor)


@register
class CeilOp(UnaryOp):
    """Round toward +inf (floats; NaN and +-inf stay).
    `%y = atomic.ceil %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.ceil"
    fn = staticmethod(np.ceil)


@register
class RoundOp(UnaryOp):
    """Round to the nearest integral value, halves to even as np.round (2.5 -> 2, -0.5 -> -0).
    `%y = atomic.round %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.round"
    fn = staticmethod(np.rint)


class BinaryOp(Operation):
    """Base of two-operand elementwise ops with numpy broadcasting."""

    operand_defs = (Operand("a"), Operand("b"))
    traits = frozenset({PURE, ELEMENTWISE, BROADCASTING})

    @staticmethod
    def fn(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def result_element_type(self, operand_element_type: str) -> str:
        return operand_element_type

    def infer(self):
        types = [v.type for v in self.operands]
        elem = same_element_type(types)
        enc = same_encoding(types)
        shape = broadcast_shapes(types[0].shape, types[1].shape)
        return [TensorType.get(shape, self.result_element_type(elem), enc)]

    def reference(self, a, b):
        return self.fn(a, b)


@register
class AddOp(BinaryOp):
    """a + b. `%c = atomic.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.add"
    traits = BinaryOp.traits | {COMMUTATIVE, ASSOCIATIVE}
    fn = staticmethod(np.add)


@register
class SubOp(BinaryOp):
    """a - b. `%c = atomic.sub %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.sub"
    fn = staticmethod(np.subtract)


@register
class MulOp(BinaryOp):
    """a * b. `%c = atomic.mul %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.mul"
    traits = BinaryOp.traits | {COMMUTATIVE, ASSOCIATIVE}
    fn = staticmethod(np.multiply)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not np.issubdtype(a.dtype, np.integer):
        return np.divide(a, b)
    # C semantics: the quotient rounds toward zero (numpy's // rounds down); x / 0 is 0 here
    # rather than undefined behaviour.
    with np.errstate(divide="ignore"):
        magnitude = np.floor_divide(np.abs(a), np.abs(b))
    return np.where(b == 0, 0, np.sign(a) * np.sign(b) * magnitude).astype(a.dtype)


@register
class DivOp(BinaryOp):
    """a / b (integers round toward zero).
    `%c = atomic.div %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.div"
    fn = staticmethod(_divide)


@register
class PowOp(BinaryOp):
    """a ** b on floats. `%c = atomic.pow %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.pow"
    fn = staticmethod(np.power)

    def verify_(self):
        if not self.operands[0].type.is_float:
            raise VerifyError(
                f"operands must have a float element type, got {self.operands[0].type}"
            )


def _remainder(a: np.ndarray, b: np.ndarray, truncated: bool) -> np.ndarray:
    fn = np.fmod if truncated else np.mod
    if not np.issubdtype(a.dtype, np.integer):
        return fn(a, b)  # IEEE: x mod 0 and inf mod y are NaN
    # An integer remainder by zero is 0, as tgc's integer division by zero (docs/ir.md).
    nonzero = np.where(b == 0, np.ones_like(b), b)
    return np.where(b == 0, np.zeros_like(a), fn(a, nonzero)).astype(a.dtype)


@register
class ModOp(BinaryOp):
    """The remainder of a / b, numbers of any element type but i1. fmod = false: np.mod, the
    sign of the divisor (floored division); fmod = true: C's fmod / %, the sign of the dividend
    (truncated division). Integers: a remainder by 0 is 0; floats: NaN.
    `%c = atomic.mod %a, %b {fmod = true} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>`"""

    name = "atomic.mod"
    attr_defs = attrs(Attr("fmod", BOOL, default=False))

    def verify_(self):
        if self.operands[0].type.element_type == "i1":
            raise VerifyError(
                f"operands must have a numeric element type, got {self.operands[0].type}"
            )

    def reference(self, a, b):
        return _remainder(a, b, self.attr("fmod"))


@register
class MaxOp(BinaryOp):
    """Elementwise maximum (NaN propagates).
    `%c = atomic.max %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.max"
    traits = BinaryOp.traits | {COMMUTATIVE, ASSOCIATIVE}
    fn = staticmethod(np.maximum)


@register
class MinOp(BinaryOp):
    """Elementwise minimum (NaN propagates).
    `%c = atomic.min %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

    name = "atomic.min"
    traits = BinaryOp.traits | {COMMUTATIVE, ASSOCIATIVE}
    fn = staticmethod(np.minimum)


_PREDICATES = {
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
}


@register
class CmpOp(BinaryOp):
    """Elementwise comparison; the result is i1.
    `%m = atomic.cmp %a, %b {pred = "lt"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>`"""

    name = "atomic.cmp"
    attr_defs = attrs(Attr("pred", enum(*_PREDICATES)))

    def result_element_type(self, operand_element_type: str) -> str:
        return "i1"

    def reference(self, a, b):
        return _PREDICATES[self.attr("pred")](a, b)


@register
class WhereOp(Operation):
    """np.where(cond, a, b) with broadcasting; cond is i1.
    `%r = atomic.where %c, %a, %b : (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`
    """

    name = "atomic.where"
    operand_defs = (Operand("cond"), Operand("a"), Operand("b"))
    traits = frozenset({PURE, ELEMENTWISE, BROADCASTING})

    def infer(self):
        cond, a, b = (v.type for v in self.operands)
        if cond.element_type != "i1":
            raise VerifyError(f"condition must have element type i1, got {cond}")
        elem = same_element_type([a, b])
        enc = same_encoding([cond, a, b])
        return [TensorType.get(broadcast_shapes(cond.shape, a.shape, b.shape), elem, enc)]

    def reference(self, cond, a, b):
        return np.where(cond, a, b)


@register
class CastOp(Operation):
    """Convert to the result's element type (shape unchanged).
    `%y = atomic.cast %x : (tensor<4xf32>) -> tensor<4xbf16>`"""

    name = "atomic.cast"
    operand_defs = (Operand("x"),)
    traits = frozenset({PURE, ELEMENTWISE})

    def verify_(self):
        (x,) = self.operands
        out = self.results[0].type
        if x.type.shape != out.shape:
            raise VerifyError(f"cannot change the shape: {x.type} to {out}")

    def reference(self, x):
        return x.astype(self.results[0].type.dtype)

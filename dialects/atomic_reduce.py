"""The reductions and the contraction of the `atomic` dialect: `ReduceOp` (sum, max, min over
axes) and `MatmulOp`.

Each op is one class: signature, traits, type inference, verifier and numpy meaning. Registered
when `tgc.dialects.atomic` is imported.
"""

from __future__ import annotations

import numpy as np

from tgc.diagnostics import VerifyError
from tgc.dialects._shapes import (
    matmul_shape,
    normalize_axes,
    reduced_shape,
    require_elements,
    same_element_type,
    same_encoding,
)
from tgc.ir import Operation
from tgc.opdef import BOOL, INTS, PURE, REDUCTION, Attr, Operand, attrs, register
from tgc.types import TensorType

# -- reductions -----------------------------------------------------------------------------------


class ReduceOp(Operation):
    """Base of reductions over `axes` (negative axes count from the end).

    A reduction without an identity (max, min) has no value over no elements: its verifier
    rejects an axis of size 0. A sum over no elements is 0.
    """

    operand_defs = (Operand("x"),)
    attr_defs = attrs(Attr("axes", INTS), Attr("keepdims", BOOL, default=False))
    traits = frozenset({PURE, REDUCTION})
    # What the reduction is called in messages when it has no identity; None: it has one.
    needs_elements: str | None = None

    @staticmethod
    def fn(x: np.ndarray, axis, keepdims: bool) -> np.ndarray:
        raise NotImplementedError

    def axes(self) -> tuple[int, ...]:
        return normalize_axes(self.attr("axes"), self.operands[0].type.rank)

    def infer(self):
        x = self.operands[0].type
        axes = self.axes()
        if not axes:
            raise VerifyError("needs at least one axis")
        return [x.with_shape(reduced_shape(x.shape, axes, self.attr("keepdims")))]

    def verify_(self):
        if self.needs_elements is not None:
            require_elements(self.operands[0].type, self.axes(), self.needs_elements)

    def reference(self, x):
        return self.fn(x, axis=self.axes(), keepdims=self.attr("keepdims"))


@register
class ReduceSumOp(ReduceOp):
    """Sum over axes. `%s = atomic.reduce_sum %x {axes = [1]} : (tensor<4x8xf32>) -> tensor<4xf32>`"""

    name = "atomic.reduce_sum"
    fn = staticmethod(np.sum)


@register
class ReduceMaxOp(ReduceOp):
    """Max over axes. `%s = atomic.reduce_max %x {axes = [1]} : (tensor<4x8xf32>) -> tensor<4xf32>`"""

    name = "atomic.reduce_max"
    fn = staticmethod(np.max)
    needs_elements = "the maximum"


@register
class ReduceMinOp(ReduceOp):
    """Min over axes. `%s = atomic.reduce_min %x {axes = [1]} : (tensor<4x8xf32>) -> tensor<4xf32>`"""

    name = "atomic.reduce_min"
    fn = staticmethod(np.min)
    needs_elements = "the minimum"


# -- contraction ----------------------------------------------------------------------------------


@register
class MatmulOp(Operation):
    """np.matmul on the (optionally transposed) last two dims; batch dims broadcast.
    `%c = atomic.matmul %a, %b : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>`"""

    name = "atomic.matmul"
    operand_defs = (Operand("a"), Operand("b"))
    attr_defs = attrs(
        Attr("transpose_a", BOOL, default=False), Attr("transpose_b", BOOL, default=False)
    )
    traits = frozenset({PURE})

    def infer(self):
        a, b = (v.type for v in self.operands)
        elem = same_element_type([a, b])
        enc = same_encoding([a, b])
        shape = matmul_shape(a.shape, b.shape, self.attr("transpose_a"), self.attr("transpose_b"))
        return [TensorType.get(shape, elem, enc)]

    def reference(self, a, b):
        if self.attr("transpose_a"):
            a = np.swapaxes(a, -1, -2)
        if self.attr("transpose_b"):
            b = np.swapaxes(b, -1, -2)
        return np.matmul(a, b).astype(a.dtype, copy=False)  # ml_dtypes bf16 gives f32

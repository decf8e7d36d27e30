"""The `atomic` dialect: the primitives every model decomposes into.

Each op is one class: signature, traits, type inference, verifier and numpy meaning. Op families
share a base (`UnaryOp`, `BinaryOp`, `ReduceOp`); most ops only set a name and a numpy function.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.attributes import DenseAttr
from tgc.diagnostics import TgcError, VerifyError
from tgc.dialects._shapes import (
    broadcast_shapes,
    matmul_shape,
    normalize_axes,
    normalize_axis,
    reduced_shape,
    require_elements,
    same_element_type,
    same_encoding,
)
from tgc.ir import Operation, Value
from tgc.opdef import (
    ASSOCIATIVE,
    BOOL,
    BROADCASTING,
    COMMUTATIVE,
    DENSE,
    ELEMENTWISE,
    FREE,
    INT,
    INTS,
    MOVE,
    PURE,
    REDUCTION,
    VIEW,
    Attr,
    Operand,
    VariadicOperand,
    attrs,
    enum,
    register,
)
from tgc.types import TensorType

# -- elementwise ----------------------------------------------------------------------------------


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


# -- linear algebra and data movement --------------------------------------------------------------


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


@register
class TransposeOp(Operation):
    """Permute dims. `%y = atomic.transpose %x {perm = [1, 0]} : (tensor<4x8xf32>) -> tensor<8x4xf32>`"""

    name = "atomic.transpose"
    operand_defs = (Operand("x"),)
    attr_defs = attrs(Attr("perm", INTS))
    traits = frozenset({PURE, VIEW, MOVE})

    def infer(self):
        x = self.operands[0].type
        perm = self.attr("perm")
        if sorted(perm) != list(range(x.rank)):
            raise VerifyError(f"perm {list(perm)} is not a permutation of the {x.rank} dims")
        return [x.with_shape(tuple(x.shape[p] for p in perm))]

    def reference(self, x):
        return np.transpose(x, self.attr("perm"))


@register
class ReshapeOp(Operation):
    """Reshape to the result type's shape (same element count).
    `%y = atomic.reshape %x : (tensor<4x8xf32>) -> tensor<32xf32>`"""

    name = "atomic.reshape"
    operand_defs = (Operand("x"),)
    traits = frozenset({PURE, VIEW, MOVE, FREE})

    def verify_(self):
        x, out = self.operands[0].type, self.results[0].type
        if x.num_elements != out.num_elements:
            raise VerifyError(
                f"cannot reshape {x} ({x.num_elements} elements) to {out} "
                f"({out.num_elements} elements)"
            )
        _same_element_and_encoding(x, out)

    def reference(self, x):
        return np.reshape(x, self.results[0].type.shape)


@register
class BroadcastOp(Operation):
    """Broadcast to the result type's shape (numpy rules).
    `%y = atomic.broadcast %x : (tensor<8xf32>) -> tensor<4x8xf32>`"""

    name = "atomic.broadcast"
    operand_defs = (Operand("x"),)
    traits = frozenset({PURE, VIEW, MOVE, FREE})

    def verify_(self):
        x, out = self.operands[0].type, self.results[0].type
        _same_element_and_encoding(x, out)
        try:
            compatible = broadcast_shapes(x.shape, out.shape) == out.shape
        except VerifyError:
            compatible = False
        if not compatible:
            raise VerifyError(f"cannot broadcast {x} to {out}")

    def reference(self, x):
        return np.broadcast_to(x, self.results[0].type.shape)


def _same_element_and_encoding(x: TensorType, out: TensorType) -> None:
    if x.element_type != out.element_type or x.encoding != out.encoding:
        raise VerifyError(f"element type and memory space must not change: {x} to {out}")


@register
class ConcatOp(Operation):
    """np.concatenate along `axis`.
    `%y = atomic.concat %a, %b {axis = 0} : (tensor<2x8xf32>, tensor<3x8xf32>) -> tensor<5x8xf32>`
    """

    name = "atomic.concat"
    operand_defs = (VariadicOperand("xs"),)
    attr_defs = attrs(Attr("axis", INT))
    traits = frozenset({PURE, MOVE})

    def infer(self):
        types = [v.type for v in self.operands]
        if not types:
            raise VerifyError("needs at least one operand")
        elem = same_element_type(types)
        enc = same_encoding(types)
        ranks = {t.rank for t in types}
        if len(ranks) != 1:
            raise VerifyError("operands must have the same rank")
        axis = normalize_axis(self.attr("axis"), types[0].rank)
        base = types[0].shape
        for t in types[1:]:
            if any(d != e for i, (d, e) in enumerate(zip(base, t.shape)) if i != axis):
                raise VerifyError(f"shapes {base} and {t.shape} differ outside axis {axis}")
        shape = tuple(
            sum(t.shape[axis] for t in types) if i == axis else d for i, d in enumerate(base)
        )
        return [TensorType.get(shape, elem, enc)]

    def reference(self, *xs):
        return np.concatenate(xs, axis=self.attr("axis"))


@register
class SplitOp(Operation):
    """Split along `axis` into pieces of `sizes`; one result per size.
    `%a, %b = atomic.split %x {axis = 0, sizes = [2, 3]} : (tensor<5x8xf32>) -> (tensor<2x8xf32>, tensor<3x8xf32>)`
    """

    name = "atomic.split"
    operand_defs = (Operand("x"),)
    attr_defs = attrs(Attr("axis", INT), Attr("sizes", INTS))
    traits = frozenset({PURE, VIEW, MOVE, FREE})
    num_results = None

    def infer(self):
        x = self.operands[0].type
        axis = normalize_axis(self.attr("axis"), x.rank)
        sizes = self.attr("sizes")
        if any(s < 0 for s in sizes) or sum(sizes) != x.shape[axis]:
            raise VerifyError(
                f"sizes {list(sizes)} do not add up to dim {axis} of {x} ({x.shape[axis]})"
            )
        return [x.with_shape(x.shape[:axis] + (s,) + x.shape[axis + 1 :]) for s in sizes]

    def reference(self, x):
        axis = self.attr("axis")
        bounds = np.cumsum(self.attr("sizes"))[:-1]
        return tuple(np.split(x, bounds, axis=axis))


@register
class SliceOp(Operation):
    """x[start:stop:step] with one entry per dim (step >= 1).
    `%y = atomic.slice %x {start = [0, 2], stop = [4, 8], step = [1, 2]} : (tensor<4x8xf32>) -> tensor<4x3xf32>`
    """

    name = "atomic.slice"
    operand_defs = (Operand("x"),)
    attr_defs = attrs(Attr("start", INTS), Attr("stop", INTS), Attr("step", INTS))
    traits = frozenset({PURE, VIEW, MOVE})

    def infer(self):
        x = self.operands[0].type
        start, stop, step = self.attr("start"), self.attr("stop"), self.attr("step")
        if not len(start) == len(stop) == len(step) == x.rank:
            raise VerifyError(f"start, stop and step need one entry per dim ({x.rank})")
        shape = []
        for dim, (lo, hi, st, size) in enumerate(zip(start, stop, step, x.shape)):
            if st < 1:
                raise VerifyError(f"step {st} of dim {dim} must be >= 1")
            if not 0 <= lo <= hi <= size:
                raise VerifyError(f"bounds [{lo}, {hi}) of dim {dim} are outside [0, {size}]")
            shape.append(len(range(lo, hi, st)))
        return [x.with_shape(shape)]

    def reference(self, x):
        index = tuple(
            slice(lo, hi, st)
            for lo, hi, st in zip(self.attr("start"), self.attr("stop"), self.attr("step"))
        )
        return x[index]


@register
class GatherOp(Operation):
    """np.take(table, indices, axis); indices are integers.
    `%y = atomic.gather %t, %i {axis = 0} : (tensor<100x16xf32>, tensor<8xi32>) -> tensor<8x16xf32>`
    """

    name = "atomic.gather"
    operand_defs = (Operand("table"), Operand("indices"))
    attr_defs = attrs(Attr("axis", INT, default=0))
    traits = frozenset({PURE, MOVE})

    def infer(self):
        table, indices = (v.type for v in self.operands)
        if indices.element_type not in ("i8", "i32", "i64"):
            raise VerifyError(f"indices must be integers, got {indices}")
        axis = normalize_axis(self.attr("axis"), table.rank)
        shape = table.shape[:axis] + indices.shape + table.shape[axis + 1 :]
        return [table.with_shape(shape)]

    def verify_(self):
        """Constant indices are checked here; others when the program runs (`reference`)."""
        table, indices = self.operands
        source = indices.defining_op
        if isinstance(source, ConstantOp):
            self.check_indices(source.attr("value").array, table.type)
        elif indices.type.num_elements and not self.axis_size(table.type):
            axis = self.attr("axis")
            raise VerifyError(f"axis {axis} of {table.type} has size 0: no index is in range")

    def axis_size(self, table: TensorType) -> int:
        return table.shape[self.attr("axis") % table.rank]

    def check_indices(self, indices: np.ndarray, table: TensorType) -> None:
        """Indices lie in [0, size of the axis): negative ones do not count from the end (the
        generated kernels read table[index] as it is)."""
        size = self.axis_size(table)
        bad = np.flatnonzero((indices < 0) | (indices >= size))
        if bad.size:
            at = tuple(int(k) for k in np.unravel_index(bad[0], indices.shape))
            raise VerifyError(
                f"index {int(indices[at])} (at {list(at)} of the indices) is out of range "
                f"[0, {size}) of axis {self.attr('axis')} of {table}"
            )

    def reference(self, table, indices):
        try:
            self.check_indices(indices, self.operands[0].type)
        except VerifyError as e:  # a value only known when the program runs
            raise TgcError(f"'{self.name}' op {e.message}", self.loc) from None
        return np.take(table, indices, axis=self.attr("axis"))


def gather_index_bound(indices: Value) -> int | None:
    """The smallest size of a table axis that `indices` indexes as the indices of an
    `atomic.gather` (values in [0, bound) are in range for every such gather), or None when no
    gather reads it. Random inputs and the standalone file's main() draw indices below it."""
    sizes = [
        op.axis_size(op.operands[0].type)
        for op, position in indices.uses
        if isinstance(op, GatherOp) and position == 1
    ]
    return min(sizes, default=None)


@register
class ConstantOp(Operation):
    """A constant tensor. `%c = atomic.constant {value = dense<0.5> : tensor<4xf32>} : () -> tensor<4xf32>`"""

    name = "atomic.constant"
    attr_defs = attrs(Attr("value", DENSE))
    traits = frozenset({PURE, FREE})

    def infer(self):
        value: DenseAttr = self.attr("value")
        return [value.type.with_encoding(self.results[0].type.encoding if self.results else None)]

    def reference(self):
        return np.array(self.attr("value").array)


@register
class IotaOp(Operation):
    """0, 1, 2, ... along `axis`, broadcast to the result type.
    `%i = atomic.iota {axis = 1} : () -> tensor<4x8xi32>`"""

    name = "atomic.iota"
    attr_defs = attrs(Attr("axis", INT))
    traits = frozenset({PURE, MOVE})

    def verify_(self):
        out = self.results[0].type
        normalize_axis(self.attr("axis"), out.rank)

    def reference(self):
        out = self.results[0].type
        axis = self.attr("axis") % out.rank
        ramp = np.arange(out.shape[axis]).reshape([-1 if i == axis else 1 for i in range(out.rank)])
        return np.broadcast_to(ramp, out.shape).astype(out.dtype)

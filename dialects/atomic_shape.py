"""The ops of the `atomic` dialect that move or make data rather than compute it: views
(transpose, reshape, broadcast, split, slice), concat, gather and write_rows, and the ops that
make a tensor from nothing (constant, iota).

Each op is one class: signature, traits, type inference, verifier and numpy meaning. Registered
when `tgc.dialects.atomic` is imported.
"""

from __future__ import annotations

import numpy as np

from tgc.attributes import DenseAttr
from tgc.diagnostics import TgcError, VerifyError
from tgc.dialects._shapes import broadcast_shapes, normalize_axis, same_element_type, same_encoding
from tgc.ir import Operation, Value
from tgc.opdef import (
    DENSE,
    FREE,
    INT,
    INTS,
    MOVE,
    PURE,
    VIEW,
    Attr,
    Operand,
    VariadicOperand,
    attrs,
    register,
)
from tgc.types import TensorType


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


@register
class WriteRowsOp(Operation):
    """`x` with its rows at `indices` along `axis` replaced by `values`' rows, in order:
    result[..., indices[j], ...] = values[..., j, ...], the other rows x's (indices a vector of
    integers in [0, size of the axis); values shaped as x but with len(indices) along `axis`).
    Where an index repeats, the last row given for it is written. A KV cache's update
    (`index_copy_`, `index_put_`): a kernel may write the rows into x's own memory when nothing
    else reads x (tgc/donation.py), instead of copying x whole.
    `%y = atomic.write_rows %x, %i, %v {axis = 0} : (tensor<16x4xf32>, tensor<2xi64>, tensor<2x4xf32>) -> tensor<16x4xf32>`
    """

    name = "atomic.write_rows"
    operand_defs = (Operand("x"), Operand("indices"), Operand("values"))
    attr_defs = attrs(Attr("axis", INT, default=0))
    traits = frozenset({PURE, MOVE})

    def infer(self):
        x, indices, values = (v.type for v in self.operands)
        if indices.element_type not in ("i8", "i32", "i64") or indices.rank != 1:
            raise VerifyError(f"indices must be a vector of integers, got {indices}")
        axis = normalize_axis(self.attr("axis"), x.rank)
        rows = x.shape[:axis] + indices.shape + x.shape[axis + 1 :]
        if values.shape != rows or values.element_type != x.element_type:
            raise VerifyError(
                f"values must be {x.with_shape(rows)} (x with a row per index along axis "
                f"{axis}), got {values}"
            )
        return [x]

    def reference(self, x, indices, values):
        return self.reference_in_place(np.array(x, copy=True), indices, values)

    def reference_in_place(self, x: np.ndarray, indices, values) -> np.ndarray:
        """The numpy meaning written into `x`'s own memory, `x` returned: what a kernel runs
        where nothing else reads x (tgc/donation.py)."""
        size = x.shape[self.attr("axis") % x.ndim]
        bad = np.flatnonzero((indices < 0) | (indices >= size))
        if bad.size:
            raise TgcError(
                f"'{self.name}' op index {int(indices[bad[0]])} (at [{int(bad[0])}] of the "
                f"indices) is out of range [0, {size}) of axis {self.attr('axis')} of "
                f"{self.operands[0].type}",
                self.loc,
            )
        # the last row given for each index: numpy's assignment leaves a repeated one's order open
        last = len(indices) - 1 - np.unique(indices[::-1], return_index=True)[1]
        axis = self.attr("axis") % x.ndim
        np.moveaxis(x, axis, 0)[indices[last]] = np.moveaxis(values, axis, 0)[last]
        return x


def gather_index_bound(indices: Value) -> int | None:
    """The smallest size of a table axis that `indices` indexes as the indices of an
    `atomic.gather` (values in [0, bound) are in range for every such gather), or None when no
    gather reads it. Random inputs and the standalone file's main() draw indices below it.
    The indices may reach the gather through views, which keep their values (a model's
    token-type ids broadcast to the batch, say)."""
    sizes = []
    todo, seen = [indices], set()
    while todo:
        value = todo.pop()
        for op, position in value.uses:
            if isinstance(op, GatherOp) and position == 1:
                sizes.append(op.axis_size(op.operands[0].type))
            elif position == 0 and op.has_trait(VIEW):
                todo.extend(r for r in op.results if r not in seen)
                seen.update(op.results)
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

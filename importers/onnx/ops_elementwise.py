"""Converters of elementwise math, comparisons, Where, Cast, Constant, Identity, MatMul, Gemm."""

from __future__ import annotations

from .context import NodeContext
from .registry import converter

# ONNX binary op -> atomic op (numpy broadcasting on both sides: ONNX's multidirectional rule).
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@converter(*BINARY)
def binary(ctx: NodeContext):
    a, b = ctx.input(0), ctx.input(1)
    return ctx.b.create(f"atomic.{BINARY[ctx.op_type]}", [a, b]).results[0]


@converter("Relu")
def relu(ctx: NodeContext):
    return ctx.b.hl.relu(ctx.input(0))


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

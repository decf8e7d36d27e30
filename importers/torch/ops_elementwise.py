"""Lowerings of elementwise aten ops: unary math and activations, binary arithmetic with PyTorch's
type promotion (operands cast to the type PyTorch computes in), comparisons, logic, where,
clamp and casts."""

from __future__ import annotations

from tgc.importers.torch._context import Cx
from tgc.importers.torch._registry import lowering
from tgc.importers.torch.ops_rounding import divide_rounded
from tgc.ir import Value

# aten op -> (dialect, op) of the one-operand op computing it, in the result's element type.
_UNARY = {
    "exp": ("atomic", "exp"),
    "log": ("atomic", "log"),
    "sqrt": ("atomic", "sqrt"),
    "rsqrt": ("atomic", "rsqrt"),
    "neg": ("atomic", "neg"),
    "abs": ("atomic", "abs"),
    "erf": ("atomic", "erf"),
    "sin": ("atomic", "sin"),
    "cos": ("atomic", "cos"),
    "reciprocal": ("atomic", "recip"),
    "tanh": ("hl", "tanh"),
    "sigmoid": ("hl", "sigmoid"),
    "relu": ("hl", "relu"),
    "silu": ("hl", "silu"),
}


@lowering(*_UNARY)
def unary(cx: Cx) -> Value:
    dialect, op = _UNARY[cx.node.target._opname]
    x = cx.value("self", cx.out.element_type)  # exp of an integer tensor is a float tensor
    return getattr(getattr(cx.b, dialect), op)(x)


@lowering("gelu")
def gelu(cx: Cx) -> Value:
    approximate = cx.arg("approximate")
    if approximate not in ("none", "tanh"):
        raise cx.error(f"approximate='{approximate}' is not 'none' or 'tanh'")
    return cx.b.hl.gelu(cx.value("self"), approximate=approximate)


@lowering("leaky_relu")
def leaky_relu(cx: Cx) -> Value:
    x = cx.value("self")
    elem = x.type.element_type
    positive = cx.b.atomic.cmp(x, cx.scalar(0, elem), pred="gt")
    scaled = cx.b.atomic.mul(x, cx.scalar(cx.arg("negative_slope"), elem))
    return cx.b.atomic.where(positive, x, scaled)


@lowering("hardtanh")
def hardtanh(cx: Cx) -> Value:
    return _clamp(cx, cx.value("self"), cx.arg("min_val"), cx.arg("max_val"))


@lowering("hardsigmoid")
def hardsigmoid(cx: Cx) -> Value:
    return _hardsigmoid(cx, cx.value("self"))


@lowering("hardswish")
def hardswish(cx: Cx) -> Value:
    x = cx.value("self")
    return cx.b.atomic.mul(x, _hardsigmoid(cx, x))


def _hardsigmoid(cx: Cx, x: Value) -> Value:
    """clamp(x / 6 + 1/2, 0, 1)."""
    elem = x.type.element_type
    shifted = cx.b.atomic.add(cx.b.atomic.div(x, cx.scalar(6, elem)), cx.scalar(0.5, elem))
    return _clamp(cx, shifted, 0, 1)


# -- two operands ---------------------------------------------------------------------------------


def _operands(cx: Cx, a: str = "self", b: str = "other") -> tuple[Value, Value]:
    """Both operands in the result's element type (PyTorch computes add/sub/mul/div there)."""
    elem = cx.out.element_type
    return cx.value(a, elem), cx.value(b, elem)


def _scaled_by_alpha(cx: Cx, x: Value) -> Value:
    alpha = cx.args.get("alpha", 1)
    if alpha == 1:
        return x
    return cx.b.atomic.mul(x, cx.scalar(alpha, x.type.element_type))


@lowering("add")
def add(cx: Cx) -> Value:
    a, b = _operands(cx)
    return cx.b.atomic.add(a, _scaled_by_alpha(cx, b))


@lowering("sub")
def sub(cx: Cx) -> Value:
    a, b = _operands(cx)
    return cx.b.atomic.sub(a, _scaled_by_alpha(cx, b))


@lowering("rsub")
def rsub(cx: Cx) -> Value:
    a, b = _operands(cx)
    return cx.b.atomic.sub(b, _scaled_by_alpha(cx, a))  # other - alpha * self


@lowering("mul")
def mul(cx: Cx) -> Value:
    return cx.b.atomic.mul(*_operands(cx))


@lowering("div")
def div(cx: Cx) -> Value:
    mode = cx.args.get("rounding_mode")
    if mode in ("floor", "trunc"):
        return divide_rounded(cx, mode)
    if mode is not None:
        raise cx.error(f"rounding_mode='{mode}' is not None, 'trunc' or 'floor'")
    return cx.b.atomic.div(*_operands(cx))


@lowering("maximum")
def maximum(cx: Cx) -> Value:
    return cx.b.atomic.max(*_operands(cx))


@lowering("minimum")
def minimum(cx: Cx) -> Value:
    return cx.b.atomic.min(*_operands(cx))


@lowering("pow")
def pow_(cx: Cx) -> Value:
    elem = cx.out.element_type
    exponent = cx.arg("exponent")
    if cx.overload == "Tensor_Scalar":
        x = cx.value("self", elem)
        if exponent == 1:
            return x
        if exponent == 2:
            return cx.b.atomic.mul(x, x)  # exact, and what canonicalize and fusion read best
        if exponent == 0.5 and x.type.is_float:
            return cx.b.atomic.sqrt(x)
    if elem not in ("f16", "bf16", "f32", "f64"):
        raise cx.error(f"a power in {elem} (tgc's pow is on floats)")
    return cx.b.atomic.pow(cx.value("self", elem), cx.value("exponent", elem))


_PREDICATES = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


@lowering(*_PREDICATES)
def compare(cx: Cx) -> Value:
    elem = cx.promoted("self", "other")
    a, b = cx.value("self", elem), cx.value("other", elem)
    return cx.b.atomic.cmp(a, b, pred=_PREDICATES[cx.node.target._opname])


# -- logic ----------------------------------------------------------------------------------------


def _as_bool(cx: Cx, name: str) -> Value:
    x = cx.value(name)
    if x.type.element_type == "i1":
        return x
    return cx.b.atomic.cmp(x, cx.scalar(0, x.type.element_type), pred="ne")


@lowering("logical_not", "bitwise_not")
def logical_not(cx: Cx) -> Value:
    if cx.node.target._opname == "bitwise_not" and cx.out.element_type != "i1":
        raise cx.error("bitwise_not on integers has no tgc op (on bool it is logical_not)")
    return cx.b.atomic.cmp(_as_bool(cx, "self"), cx.scalar(False, "i1"), pred="eq")


@lowering("logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor")
def logical_binary(cx: Cx) -> Value:
    op = cx.node.target._opname
    if op.startswith("bitwise") and cx.out.element_type != "i1":
        raise cx.error(f"{op} on integers has no tgc op (on bool it is the logical op)")
    a, b = _as_bool(cx, "self"), _as_bool(cx, "other")
    if op.endswith("_and"):
        return cx.b.atomic.where(a, b, cx.scalar(False, "i1"))
    if op.endswith("_or"):
        return cx.b.atomic.where(a, cx.scalar(True, "i1"), b)
    return cx.b.atomic.cmp(a, b, pred="ne")


@lowering("where")
def where(cx: Cx) -> Value:
    if cx.overload == "default":
        raise cx.error("where(condition) with one argument (nonzero) has a data-dependent shape")
    a, b = _operands(cx)
    return cx.b.atomic.where(_as_bool(cx, "condition"), a, b)


@lowering("masked_fill")
def masked_fill(cx: Cx) -> Value:
    elem = cx.out.element_type
    return cx.b.atomic.where(_as_bool(cx, "mask"), cx.value("value", elem), cx.value("self", elem))


@lowering("clamp", "clamp_min", "clamp_max")
def clamp(cx: Cx) -> Value:
    x = cx.value("self", cx.out.element_type)
    return _clamp(cx, x, cx.args.get("min"), cx.args.get("max"))


def _clamp(cx: Cx, x: Value, low, high) -> Value:
    """min(max(x, low), high), as PyTorch: high wins where low > high."""
    elem = x.type.element_type
    if low is not None:
        x = cx.b.atomic.max(x, cx.value(low, elem))
    if high is not None:
        x = cx.b.atomic.min(x, cx.value(high, elem))
    return x


# -- casts ----------------------------------------------------------------------------------------


@lowering("_to_copy", "to", "type_as", "_to_dim_order_copy")
def to(cx: Cx) -> Value:
    """A change of dtype (to the result's); device, layout and memory format mean nothing to a
    tgc function."""
    return cx.cast(cx.value("self"), cx.out.element_type)

"""What every CUDA template shares: C types per element type, and `CODE_FOR_OP`, the one table
from an elementwise op to its C expression.

f16 and bf16 values are stored in their own type and computed in f32 (`compute_type`), as the
numpy interpreter does. An op whose result is f16 or bf16 may use the "half" column of its
entry, a faster f32 form accurate far beyond 16 bits: `__expf` (ex2.approx: a few f32 ulps,
against bf16's 2^-8), where `expf` costs about ten instructions more. GPT-2's tanh GELU, whose
lowered tanh is an exp, was compute-bound (bench/results/design-evidence-2026-11-28.md).
Operands in an expression are always variable names (never expressions
with side effects), so an operand may appear twice in a template.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.ir import Operation
from tgc.types import TensorType

STORAGE_CTYPE = {
    "f16": "__half",
    "bf16": "__nv_bfloat16",
    "f32": "float",
    "f64": "double",
    "i1": "bool",
    "i8": "signed char",
    "i32": "int",
    "i64": "long long",
}
COMPUTE_CTYPE = {
    "f16": "float",
    "bf16": "float",
    "f32": "float",
    "f64": "double",
    "i1": "bool",
    "i8": "int",
    "i32": "int",
    "i64": "long long",
}


def type_class(element_type: str) -> str:
    """The column of CODE_FOR_OP used for values of this element type."""
    if element_type == "f64":
        return "double"
    if element_type in ("f16", "bf16", "f32"):
        return "float"
    if element_type == "i1":
        return "bool"
    return "int"


# op (with its variant in brackets) -> {type class or "*": C expression}. {0}, {1}, {2} are the
# operands (already in the compute type), {T} the compute type of the result. "half": the form
# for a result of f16 or bf16, where it differs from "float" (module doc).
CODE_FOR_OP: dict[str, dict[str, str]] = {
    "atomic.neg": {"*": "(-{0})"},  # -x
    "atomic.exp": {"half": "__expf({0})", "float": "expf({0})", "double": "exp({0})"},
    "atomic.log": {"float": "logf({0})", "double": "log({0})"},
    "atomic.sqrt": {"float": "sqrtf({0})", "double": "sqrt({0})"},
    "atomic.rsqrt": {"float": "rsqrtf({0})", "double": "rsqrt({0})"},
    "atomic.recip": {"float": "(1.0f / {0})", "double": "(1.0 / {0})"},
    "atomic.abs": {"float": "fabsf({0})", "double": "fabs({0})", "int": "({0} < 0 ? -{0} : {0})"},
    "atomic.erf": {"float": "erff({0})", "double": "erf({0})"},
    "atomic.sin": {"float": "sinf({0})", "double": "sin({0})"},
    "atomic.cos": {"float": "cosf({0})", "double": "cos({0})"},
    "atomic.floor": {"float": "floorf({0})", "double": "floor({0})"},
    "atomic.ceil": {"float": "ceilf({0})", "double": "ceil({0})"},
    "atomic.round": {"float": "rintf({0})", "double": "rint({0})"},  # halves to even
    "atomic.add": {"*": "({0} + {1})"},
    "atomic.sub": {"*": "({0} - {1})"},
    "atomic.mul": {"*": "({0} * {1})"},
    "atomic.div": {"*": "({0} / {1})"},  # integers: C truncates toward zero, as the reference
    "atomic.pow": {"float": "powf({0}, {1})", "double": "pow({0}, {1})"},
    # np.mod (sign of the divisor) and C fmod (sign of the dividend); integers by 0 give 0
    "atomic.mod[floor]": {
        "float": "tgc_modf({0}, {1})",
        "double": "tgc_mod({0}, {1})",
        "int": "tgc_imod({0}, {1})",
    },
    "atomic.mod[fmod]": {
        "float": "fmodf({0}, {1})",
        "double": "fmod({0}, {1})",
        "int": "tgc_ifmod({0}, {1})",
    },
    "atomic.max": {"*": "tgc_max({0}, {1})"},  # NaN propagates, as np.maximum
    "atomic.min": {"*": "tgc_min({0}, {1})"},
    "atomic.cmp[lt]": {"*": "({0} < {1})"},
    "atomic.cmp[le]": {"*": "({0} <= {1})"},
    "atomic.cmp[gt]": {"*": "({0} > {1})"},
    "atomic.cmp[ge]": {"*": "({0} >= {1})"},
    "atomic.cmp[eq]": {"*": "({0} == {1})"},
    "atomic.cmp[ne]": {"*": "({0} != {1})"},
    "atomic.where": {"*": "({0} ? {1} : {2})"},
    "atomic.cast": {"*": "(({T}) {0})"},  # rounding to f16/bf16 is added by `cast_expression`
    "hl.tanh": {"float": "tanhf({0})", "double": "tanh({0})"},
    "hl.sigmoid": {"float": "(1.0f / (1.0f + expf(-{0})))", "double": "(1.0 / (1.0 + exp(-{0})))"},
    "hl.relu": {"*": "({0} < ({T}) 0 ? ({T}) 0 : {0})"},  # NaN stays NaN, as np.maximum(x, 0)
    "hl.silu": {"float": "({0} / (1.0f + expf(-{0})))", "double": "({0} / (1.0 + exp(-{0})))"},
    "hl.gelu[tanh]": {
        "float": "(0.5f * {0} * (1.0f + tanhf(0.7978845608028654f * ({0} + 0.044715f * {0} * {0} * {0}))))",
        "double": "(0.5 * {0} * (1.0 + tanh(0.7978845608028654 * ({0} + 0.044715 * {0} * {0} * {0}))))",
    },
    "hl.gelu[none]": {
        "float": "(0.5f * {0} * (1.0f + erff({0} * 0.7071067811865476f)))",
        "double": "(0.5 * {0} * (1.0 + erf({0} * 0.7071067811865476)))",
    },
}

# Reductions: (combine expression, identity per type class).
REDUCE_CODE = {
    "atomic.reduce_sum": ("TgcSum", {"float": "0.0f", "double": "0.0", "int": "0"}),
    "atomic.reduce_max": (
        "TgcMax",
        {"float": "-INFINITY", "double": "-INFINITY", "int": "TGC_INT_LOWEST"},
    ),
    "atomic.reduce_min": (
        "TgcMin",
        {"float": "INFINITY", "double": "INFINITY", "int": "TGC_INT_HIGHEST"},
    ),
}


def op_key(op: Operation) -> str:
    """The CODE_FOR_OP key of an op: its name, plus its variant for ops that have one."""
    if op.name == "atomic.cmp":
        return f"atomic.cmp[{op.attr('pred')}]"
    if op.name == "hl.gelu":
        return f"hl.gelu[{op.attr('approximate')}]"
    if op.name == "atomic.mod":
        return "atomic.mod[fmod]" if op.attr("fmod") else "atomic.mod[floor]"
    return op.name


def has_code(op: Operation) -> bool:
    return op_key(op) in CODE_FOR_OP


def expression(op: Operation, operands: list[str], operand_types: list[TensorType]) -> str:
    """The C expression computing `op` from operand variables (in their compute types)."""
    table = CODE_FOR_OP[op_key(op)]
    out = op.results[0].type
    if op.name == "atomic.cast":
        return cast_expression(operands[0], operand_types[0].element_type, out.element_type)
    # Ops whose inputs decide the arithmetic (cmp, where) use the operands' class.
    basis = operand_types[-1] if op.name in ("atomic.cmp", "atomic.where") else out
    code = table.get(type_class(basis.element_type), table.get("*"))
    if out.element_type in ("f16", "bf16") and basis is out:
        code = table.get("half", code)
    if code is None:
        raise KeyError(f"no C code for '{op.name}' on {basis.element_type}")
    return code.format(*operands, T=COMPUTE_CTYPE[out.element_type])


def cast_expression(x: str, src: str, dst: str) -> str:
    if dst == "i1":
        return f"({x} != 0)"
    text = f"(({COMPUTE_CTYPE[dst]}) {x})"
    if dst == "bf16":
        return f"__bfloat162float(__float2bfloat16_rn({text}))"
    if dst == "f16":
        return f"__half2float(__float2half_rn({text}))"
    return text


def literal(value, element_type: str) -> str:
    """A C literal of the compute type of `element_type`."""
    cls = type_class(element_type)
    if cls == "bool":
        return "true" if value else "false"
    if cls == "int":
        return f"{int(value)}LL" if element_type == "i64" else str(int(value))
    value = float(value)
    if math.isnan(value):
        return "NAN" if cls == "float" else "((double) NAN)"
    if math.isinf(value):
        sign = "-" if value < 0 else ""
        return f"{sign}INFINITY" if cls == "float" else f"({sign}(double) INFINITY)"
    text = str(np.float32(value)) if cls == "float" else repr(value)
    if "e" not in text and "." not in text and "n" not in text:
        text += ".0"
    return text + ("f" if cls == "float" else "")


def load_expression(ptr: str, offset: str, element_type: str) -> str:
    """Read one element and convert it to its compute type."""
    if element_type in ("f16", "bf16"):
        return f"tgc_cvt({ptr}[{offset}])"
    return f"{ptr}[{offset}]"


def store_value(value: str, element_type: str) -> str:
    """Convert a compute-type value to its storage type."""
    if element_type == "bf16":
        return f"__float2bfloat16_rn({value})"
    if element_type == "f16":
        return f"__float2half_rn({value})"
    return value

"""The numpy backend: one op kernel per op from its numpy meaning, and a few graph kernels.

Calling convention (every kernel here, and what `planner.executor` calls):

    run(inputs: list[np.ndarray], attrs: dict, result_types: list[TensorType]) -> list[np.ndarray]

`inputs` are host arrays in the program's element types, in the kernel's argument order (an op
kernel: the op's operands; a graph kernel: its reference's arguments). `attrs` are the op's
attributes for an op kernel (defaults may be omitted) and `{}` for a graph kernel. The results
come back as arrays of `result_types`' shapes and dtypes; like the interpreter's "native"
precision, 16-bit floats are computed in f32 and rounded once per kernel.

Op kernels are made from the op registry (`tgc.opdef.OPS`) when this module is imported, so an
op added to a dialect gets its kernel with nothing else to write: "numpy.<dialect>.<op>", e.g.
"numpy.atomic.add", running the op's `reference` (an op's `reference_in_place`, where it has
one and its operand 0's memory is free to take: tgc/donation.py). The graph kernels run a whole
formula as one numpy expression: `numpy.tanh`, `numpy.fma`, `numpy.gelu_tanh`, `numpy.softmax`.
"""

from __future__ import annotations

import math

import numpy as np

import tgc.dialects  # noqa: F401  (registers the ops)
from tgc.donation import may_overwrite
from tgc.evaluate import widened
from tgc.ir import Operation, Value
from tgc.opdef import OPS
from tgc.planner.backends import Backend, register_backend
from tgc.planner.kernel import KERNELS, Kernel, Lowered, register_kernel
from tgc.types import ELEMENT_TYPE_OF_DTYPE, TensorType

SKIPPED_DIALECTS = ("builtin", "func", "kernel")  # structure and what-runs, not computations


def _as_results(outs, result_types: list[TensorType]) -> list[np.ndarray]:
    return [np.asarray(o).astype(t.dtype, copy=False) for o, t in zip(outs, result_types)]


# -- op kernels --------------------------------------------------------------------------------


def _proxy(cls: type[Operation], inputs, attrs: dict, result_types) -> Operation:
    """An unattached op of class `cls` typed like `inputs`: its `reference` reads the
    attributes and types from it."""
    operands = [Value(TensorType.get(a.shape, ELEMENT_TYPE_OF_DTYPE[a.dtype])) for a in inputs]
    return cls(operands, list(result_types), attrs)


def op_kernel_run(cls: type[Operation]):
    """The numpy-convention `run` of the op kernel for `cls`: the op's numpy meaning."""

    def run(inputs: list[np.ndarray], attrs: dict, result_types: list[TensorType]):
        inputs = [np.asarray(a) for a in inputs]
        raw = _proxy(cls, inputs, attrs, result_types).reference(*map(widened, inputs))
        return _as_results(raw if isinstance(raw, tuple) else (raw,), result_types)

    run.op_class = cls  # what `_prepare` builds its op from
    return run


def _prepare(kernel: Kernel, call: Operation):
    """An op kernel's call made ready once (the executor's `Backend.prepare`): the op whose
    `reference` it runs is built from the call's types and attributes here, not on every call
    (about a fifth of a small model's time per call on the host went to building them)."""
    cls = getattr(kernel.run, "op_class", None)
    if cls is None:
        return None  # a graph kernel: the general path
    operands = [Value(v.type.with_encoding(None)) for v in call.operands]
    types = [r.type for r in call.results]
    op = cls(operands, types, call.op_attributes())
    in_place = getattr(op, "reference_in_place", None)
    if in_place is not None and may_overwrite(call, 0):  # operand 0's memory is free to take

        def run_in_place(values: list) -> list:
            arrays = [np.asarray(v) for v in values]
            if not arrays[0].flags.writeable:  # a caller's read-only array: into a copy
                return _as_results([op.reference(*arrays)], types)
            return [in_place(*arrays)]

        return run_in_place

    def run(values: list) -> list:
        raw = op.reference(*(widened(np.asarray(v)) for v in values))
        return _as_results(raw if isinstance(raw, tuple) else (raw,), types)

    return run


register_backend(Backend("numpy", prepare=_prepare))


def _has_reference(cls: type[Operation]) -> bool:
    return cls.reference is not Operation.reference


def register_op_kernels() -> list[Kernel]:
    """One kernel per registered op with a numpy meaning (outside SKIPPED_DIALECTS) that has
    none yet; returns the new ones (call it again after registering an op)."""
    out = []
    for name, cls in OPS.items():
        if name.split(".", 1)[0] in SKIPPED_DIALECTS or not _has_reference(cls):
            continue
        if f"numpy.{name}" in KERNELS:
            continue
        doc = f"{name} by its numpy meaning"
        out.append(
            register_kernel(
                Kernel(f"numpy.{name}", "numpy", op=name, run=op_kernel_run(cls), doc=doc)
            )
        )
    return out


# -- graph kernels -----------------------------------------------------------------------------


def floats_only(types) -> str | None:
    operands, results = types
    for t in [*operands, *results]:
        if not t.is_float:
            return f"takes floats only, not {t.element_type}"
    return None


def _unary(f):
    def run(inputs, attrs, result_types):
        return _as_results([f(widened(np.asarray(inputs[0])))], result_types)

    return run


T = "tensor<4x8xf32>"
S = "tensor<f32>"

TANH_FORMULA = f"""
// the textbook formula
func.func @exp_formula(%x: {T}) -> {T} {{
  %ep = atomic.exp %x : ({T}) -> {T}
  %nx = atomic.neg %x : ({T}) -> {T}
  %en = atomic.exp %nx : ({T}) -> {T}
  %num = atomic.sub %ep, %en : ({T}, {T}) -> {T}
  %den = atomic.add %ep, %en : ({T}, {T}) -> {T}
  %y = atomic.div %num, %den : ({T}, {T}) -> {T}
  func.return %y : {T}
}}

// (exp(2x) - 1) / (exp(2x) + 1)
func.func @exp2x_formula(%x: {T}) -> {T} {{
  %two = atomic.constant {{value = dense<2.0> : {S}}} : () -> {S}
  %one = atomic.constant {{value = dense<1.0> : {S}}} : () -> {S}
  %x2 = atomic.mul %x, %two : ({T}, {S}) -> {T}
  %e = atomic.exp %x2 : ({T}) -> {T}
  %num = atomic.sub %e, %one : ({T}, {S}) -> {T}
  %den = atomic.add %e, %one : ({T}, {S}) -> {T}
  %y = atomic.div %num, %den : ({T}, {T}) -> {T}
  func.return %y : {T}
}}
"""

HL_TANH = f"""
func.func @hl_tanh(%x: {T}) -> {T} {{
  %y = hl.tanh %x : ({T}) -> {T}
  func.return %y : {T}
}}
"""

FMA = f"""
func.func @fma(%a: {T}, %b: {T}, %c: {T}) -> {T} {{
  %bc = atomic.mul %b, %c : ({T}, {T}) -> {T}
  %y = atomic.add %a, %bc : ({T}, {T}) -> {T}
  func.return %y : {T}
}}
"""

GELU_TANH_FORMULA = f"""
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as usually written
func.func @gelu_tanh_formula(%x: {T}) -> {T} {{
  %half = atomic.constant {{value = dense<0.5> : {S}}} : () -> {S}
  %one = atomic.constant {{value = dense<1.0> : {S}}} : () -> {S}
  %k = atomic.constant {{value = dense<0.7978846> : {S}}} : () -> {S}
  %c = atomic.constant {{value = dense<0.044715> : {S}}} : () -> {S}
  %x2 = atomic.mul %x, %x : ({T}, {T}) -> {T}
  %x3 = atomic.mul %x2, %x : ({T}, {T}) -> {T}
  %cx3 = atomic.mul %c, %x3 : ({S}, {T}) -> {T}
  %inner = atomic.add %x, %cx3 : ({T}, {T}) -> {T}
  %arg = atomic.mul %k, %inner : ({S}, {T}) -> {T}
  %t = hl.tanh %arg : ({T}) -> {T}
  %gate = atomic.add %one, %t : ({S}, {T}) -> {T}
  %hx = atomic.mul %half, %x : ({S}, {T}) -> {T}
  %y = atomic.mul %hx, %gate : ({T}, {T}) -> {T}
  func.return %y : {T}
}}
"""

HL_GELU_TANH = f"""
func.func @hl_gelu_tanh(%x: {T}) -> {T} {{
  %y = hl.gelu %x {{approximate = "tanh"}} : ({T}) -> {T}
  func.return %y : {T}
}}
"""

HL_SOFTMAX = f"""
func.func @hl_softmax(%x: {T}) -> {T} {{
  %y = hl.softmax %x {{axis = -1}} : ({T}) -> {T}
  func.return %y : {T}
}}
"""

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _fma(inputs, attrs, result_types):
    a, b, c = (widened(np.asarray(v)) for v in inputs)
    return _as_results([np.add(a, np.multiply(b, c))], result_types)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    k, c = x.dtype.type(_SQRT_2_OVER_PI), x.dtype.type(0.044715)
    return x.dtype.type(0.5) * x * (x.dtype.type(1) + np.tanh(k * (x + c * x * x * x)))


def _softmax_last(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


GRAPH_KERNELS = [
    Kernel(
        "numpy.tanh",
        "numpy",
        reference=(TANH_FORMULA, Lowered(HL_TANH)),
        run=_unary(np.tanh),
        constraints=floats_only,
        # np.tanh and the formulas, each in f32, differ by a few ulp (where exp overflows, the
        # formulas give NaN and np.tanh gives ±1)
        max_rel_error=1e-6,
        doc="np.tanh for the exp formulas of tanh and for lowered hl.tanh",
    ),
    Kernel(
        "numpy.fma",
        "numpy",
        reference=FMA,
        run=_fma,
        constraints=floats_only,
        max_rel_error=0.0,  # the same two numpy ops, rounded the same way
        doc="a + b*c",
    ),
    Kernel(
        "numpy.gelu_tanh",
        "numpy",
        reference=(GELU_TANH_FORMULA, Lowered(GELU_TANH_FORMULA), Lowered(HL_GELU_TANH)),
        run=_unary(_gelu_tanh),
        constraints=floats_only,
        max_rel_error=1e-6,  # np.tanh for the lowered tanh, x^3 for x (1 + c x^2): a few ulp
        doc="the tanh approximation of GELU",
    ),
    Kernel(
        "numpy.softmax",
        "numpy",
        reference=Lowered(HL_SOFTMAX),
        run=_unary(_softmax_last),
        constraints=floats_only,
        max_rel_error=0.0,  # the lowered ops themselves, in numpy
        doc="max-subtracted softmax along the last axis",
    ),
]


def register_graph_kernels() -> list[Kernel]:
    return [register_kernel(k) for k in GRAPH_KERNELS]


OP_KERNELS = register_op_kernels()
register_graph_kernels()

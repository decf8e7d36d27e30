"""The executor (issue 12, item 6, numpy): planner/executor.py runs a selected function.

A hand-built selected function (op kernels as `kernel.call {callee = "numpy.<op>"}`, graph
kernels as calls holding their subgraph, plain ops left in between) must compute what the
unselected program computes: checked against the float64 interpreter on fresh random inputs.
A stand-in device backend (values boxed in another "space") shows how cuda/torch plug in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import tgc.planner
from tgc.diagnostics import TgcError
from tgc.opdef import OPS
from tgc.parser import parse_module
from tgc.planner.backends import BACKENDS, SPACES, Backend, Space
from tgc.planner.backends.numpy import op_kernel_run
from tgc.planner.executor import run_plan, run_planned
from tgc.planner.kernel import KERNELS, Kernel, register_kernel, rel_error, unregister_kernel
from tgc.runtime.interpreter import run_function
from tgc.verifier import verify

tgc.planner.load_backends(["numpy"])  # numpy's kernels alone, whatever is installed

# f32 plans against the float64 interpreter: a few f32 roundings per op on values of order 1.
F32_TOLERANCE = 1e-5

X, W, B, C = "tensor<4x8xf32>", "tensor<8x8xf32>", "tensor<8xf32>", "tensor<f32>"
FLAT = "tensor<32xf32>"

PROGRAM = f"""
func.func @f(%x: {X}, %w: {W}, %b: {B}) -> {FLAT} {{
  %m = atomic.matmul %x, %w : ({X}, {W}) -> {X}
  %s = atomic.add %m, %b : ({X}, {B}) -> {X}
  %t = hl.tanh %s : ({X}) -> {X}
  %c = atomic.constant {{value = dense<0.5> : {C}}} : () -> {C}
  %h = atomic.mul %t, %c : ({X}, {C}) -> {X}
  %r = hl.softmax %h {{axis = -1}} : ({X}) -> {X}
  %xt = atomic.mul %x, %t : ({X}, {X}) -> {X}
  %g = atomic.add %r, %xt : ({X}, {X}) -> {X}
  %y = atomic.reshape %g : ({X}) -> {FLAT}
  func.return %y : {FLAT}
}}
"""

SELECTED = f"""
func.func @f(%x: {X}, %w: {W}, %b: {B}) -> {FLAT} {{
  %m = kernel.call %x, %w {{callee = "numpy.atomic.matmul", op = "atomic.matmul", plan.backend = "numpy"}} : ({X}, {W}) -> {X}
  %s = kernel.call %m, %b {{callee = "numpy.atomic.add", op = "atomic.add"}} : ({X}, {B}) -> {X}
  %t = kernel.call %s {{callee = "numpy.tanh", plan.backend = "numpy", plan.seconds = 1.0e-06, plan.source = "roofline"}} : ({X}) -> {X} {{
  ^bb0(%p: {X}):
    %e = atomic.exp %p : ({X}) -> {X}
    %n = atomic.neg %p : ({X}) -> {X}
    %f = atomic.exp %n : ({X}) -> {X}
    %num = atomic.sub %e, %f : ({X}, {X}) -> {X}
    %den = atomic.add %e, %f : ({X}, {X}) -> {X}
    %q = atomic.div %num, %den : ({X}, {X}) -> {X}
    kernel.yield %q : {X}
  }}
  %c = atomic.constant {{value = dense<0.5> : {C}}} : () -> {C}
  %h = kernel.call %t, %c {{callee = "numpy.atomic.mul", op = "atomic.mul"}} : ({X}, {C}) -> {X}
  %r = kernel.call %h {{axis = -1, callee = "numpy.hl.softmax", op = "hl.softmax"}} : ({X}) -> {X}
  %g = kernel.call %r, %x, %t {{callee = "numpy.fma"}} : ({X}, {X}, {X}) -> {X} {{
  ^bb0(%a: {X}, %u: {X}, %v: {X}):
    %uv = atomic.mul %u, %v : ({X}, {X}) -> {X}
    %z = atomic.add %a, %uv : ({X}, {X}) -> {X}
    kernel.yield %z : {X}
  }}
  %y = atomic.reshape %g : ({X}) -> {FLAT}
  func.return %y : {FLAT}
}}
"""


def parse(text: str):
    module = parse_module(text, "plan.tg")
    verify(module)
    return module.funcs[0]


def fresh_inputs(func, seed: int) -> list[np.ndarray]:
    """N(0, 1) floats, redrawn where |v| < 0.1 (never zeros)."""
    rng = np.random.default_rng(seed)
    out = []
    for arg in func.args:
        a = rng.standard_normal(arg.type.shape)
        a = np.where(np.abs(a) < 0.1, 0.1 + np.abs(a), a)
        out.append(a.astype(arg.type.dtype))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_selected_function_computes_the_program(seed):
    program, selected = parse(PROGRAM), parse(SELECTED)
    inputs = fresh_inputs(program, seed)
    (want,) = run_function(program, inputs, "f64")
    (got,) = run_plan(selected, inputs)
    assert got.dtype == np.float32 and got.shape == (32,)
    assert rel_error(got, want) <= F32_TOLERANCE
    # the interpreter agrees on the selected function (a call's region is its meaning)
    (interpreted,) = run_function(selected, inputs, "f64")
    assert rel_error(interpreted, want) <= 1e-12


def test_each_call_runs_its_kernel():
    """Every kernel.call goes to the kernel its callee names (counted through the backend)."""
    called = []

    def counting(kernel, inputs, attrs, result_types):
        called.append((kernel.name, sorted(attrs)))
        return kernel.run(inputs, attrs, result_types)

    selected = parse(SELECTED)
    run_plan(selected, fresh_inputs(selected, 3), {"numpy": Backend("numpy", call=counting)})
    assert called == [
        ("numpy.atomic.matmul", []),
        ("numpy.atomic.add", []),
        ("numpy.tanh", []),
        ("numpy.atomic.mul", []),
        ("numpy.hl.softmax", ["axis"]),  # op attributes only: no callee, op or plan.*
        ("numpy.fma", []),
    ]


def test_a_wrong_kernel_gives_a_wrong_plan_result():
    """The check above can fail: the same plan with a tanh kernel that is off by 1e-3."""
    program, selected = parse(PROGRAM), parse(SELECTED)
    inputs = fresh_inputs(program, 4)
    (want,) = run_function(program, inputs, "f64")
    good = KERNELS["numpy.tanh"]
    bad = Kernel(
        good.name,
        "numpy",
        reference=good.reference,
        run=lambda ins, attrs, types: [np.tanh(ins[0]) * np.float32(1.001)],
    )
    KERNELS[good.name] = bad
    try:
        (got,) = run_plan(selected, inputs)
    finally:
        KERNELS[good.name] = good
    assert rel_error(got, want) > F32_TOLERANCE


# -- a stand-in device backend: values boxed in the space "cuda" ------------------------------


@dataclass
class Boxed:
    array: np.ndarray


DEVICE = 'tensor<4x8xf32, "cuda">'

MIXED = f"""
func.func @f(%x: {X}) -> {X} {{
  %d = kernel.copy %x : ({X}) -> {DEVICE}
  %e = kernel.call %d {{callee = "cuda.test_exp", op = "atomic.exp"}} : ({DEVICE}) -> {DEVICE}
  %h = kernel.copy %e : ({DEVICE}) -> {X}
  %y = kernel.call %h, %x {{callee = "numpy.atomic.add", op = "atomic.add"}} : ({X}, {X}) -> {X}
  func.return %y : {X}
}}
"""


@pytest.fixture
def device(monkeypatch):
    """A "cuda" space whose values are Boxed arrays, and a backend that unboxes them."""
    moves = []

    def to_host(v):
        assert isinstance(v, Boxed)
        moves.append("to_host")
        return v.array.copy()

    def from_host(a, t):
        moves.append("from_host")
        return Boxed(np.array(a, dtype=t.dtype))

    def adopt(v):
        assert isinstance(v, Boxed), "the executor keeps values in the space's representation"
        return v.array

    monkeypatch.setitem(SPACES, "cuda", Space("cuda", to_host, from_host))
    backend = Backend("cuda", adopt=adopt, release=Boxed)
    kernel = register_kernel(
        Kernel("cuda.test_exp", "cuda", op="atomic.exp", run=op_kernel_run(OPS["atomic.exp"]))
    )
    yield {**BACKENDS, "cuda": backend}, moves
    unregister_kernel(kernel.name)


def test_a_mixed_plan_moves_values_between_spaces(device):
    backends, moves = device
    func = parse(MIXED)
    inputs = fresh_inputs(func, 5)
    (got,) = run_plan(func, inputs, backends)
    want = np.exp(inputs[0].astype(np.float64)) + inputs[0]
    assert rel_error(got, want) <= F32_TOLERANCE
    assert moves == ["from_host", "to_host"]  # one copy each way


ON_DEVICE = f"""
func.func @f(%d: {DEVICE}) -> {DEVICE} {{
  %e = kernel.call %d {{callee = "cuda.test_exp", op = "atomic.exp"}} : ({DEVICE}) -> {DEVICE}
  func.return %e : {DEVICE}
}}
"""


def test_run_planned_keeps_device_values_on_the_device(device):
    """Arguments and results typed in device memory stay there: no copy either way."""
    backends, moves = device
    func = parse(ON_DEVICE)
    x = fresh_inputs(func, 7)[0]
    (got,) = run_planned(func, [Boxed(x.copy())], backends)
    assert isinstance(got, Boxed) and moves == []
    assert rel_error(got.array, np.exp(x.astype(np.float64))) <= F32_TOLERANCE


def test_run_planned_counts_its_arguments(device):
    backends, _ = device
    with pytest.raises(TgcError, match=r"@f takes 1 argument\(s\), 2 given"):
        run_planned(parse(ON_DEVICE), [Boxed(np.ones((4, 8))), Boxed(np.ones((4, 8)))], backends)


@pytest.mark.usefixtures("device")
def test_an_unavailable_backend_is_a_located_error():
    with pytest.raises(TgcError, match="runs on the cuda backend, which is not available") as e:
        run_plan(parse(MIXED), fresh_inputs(parse(MIXED), 6), {"numpy": BACKENDS["numpy"]})
    assert (e.value.loc.line, e.value.loc.col) == (4, 8)


def test_a_kernel_called_on_values_in_another_space_is_refused(device):
    backends, _ = device
    text = MIXED.replace('callee = "cuda.test_exp"', 'callee = "numpy.atomic.exp"')
    with pytest.raises(TgcError, match="works in host memory, but the call's values are in cuda"):
        run_plan(parse(text), fresh_inputs(parse(text), 7), backends)


def test_a_space_nothing_can_hold_is_an_error(monkeypatch):
    monkeypatch.delitem(SPACES, "cuda", raising=False)  # as on a machine with no GPU
    with pytest.raises(TgcError, match="no backend that can hold values in cuda memory"):
        run_plan(parse(MIXED), fresh_inputs(parse(MIXED), 8), {"numpy": BACKENDS["numpy"]})


SINGLE = f"""
func.func @f(%x: {X}) -> {X} {{
  %y = kernel.call %x {{callee = "CALLEE", op = "atomic.exp"}} : ({X}) -> {X}
  func.return %y : {X}
}}
"""


@pytest.mark.parametrize(
    "callee, message",
    [
        ("numpy.nope", "'kernel.call' names no registered kernel 'numpy.nope'"),
        (
            "numpy.atomic.neg",
            "kernel 'numpy.atomic.neg' runs 'atomic.neg', but the call means 'atomic.exp'",
        ),
    ],
)
def test_a_call_to_the_wrong_kernel_is_a_located_error(callee, message):
    func = parse(SINGLE.replace("CALLEE", callee))
    with pytest.raises(TgcError, match=message) as e:
        run_plan(func, fresh_inputs(func, 9))
    assert (e.value.loc.line, e.value.loc.col) == (3, 8)


def test_plain_ops_on_device_values_need_a_kernel(device):
    backends, _ = device
    text = f"""
func.func @f(%x: {X}) -> {X} {{
  %d = kernel.copy %x : ({X}) -> {DEVICE}
  %e = atomic.exp %d : ({DEVICE}) -> {DEVICE}
  %h = kernel.copy %e : ({DEVICE}) -> {X}
  func.return %h : {X}
}}
"""
    with pytest.raises(TgcError, match="'atomic.exp' on values in cuda memory has no kernel"):
        run_plan(parse(text), fresh_inputs(parse(text), 10), backends)


def test_op_kernels_are_prepared_once_not_built_on_every_call(monkeypatch):
    """A plan run many times (a torch.compile'd model's calls) builds nothing per call: the
    numpy backend prepares each op kernel's call once (its op, from the call's types and
    attributes), and the calls then run on values alone, with the same results."""
    from tgc.ir import Operation
    from tgc.planner.executor import PlannedFunction

    selected = parse(SELECTED)
    planned = PlannedFunction(selected)
    inputs = fresh_inputs(selected, 3)
    (first,) = planned(inputs)
    built = []
    real_init = Operation.__init__

    def counting_init(self, *args, **kwargs):
        built.append(type(self).__name__)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(Operation, "__init__", counting_init)
    for _ in range(3):
        (again,) = planned(inputs)
        np.testing.assert_array_equal(again, first)
    assert built == []  # no op made while running
    (want,) = run_plan(selected, inputs)
    np.testing.assert_array_equal(first, want)

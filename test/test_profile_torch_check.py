"""Checking an instance with PyTorch on the kernel's own device (planner/torch_check.py), here
with torch-cpu (the same code runs on "cuda" with torch-cuda): the float64 reference torch
evaluates equals numpy's within 1e-12 (normwise, `rel_error`) on fresh random inputs of every
op kind the torch backend has, and of the ops that move data, make values or compare integers;
the native evaluation is numpy's within the kernel's stated error; the error computed on
tensors is `rel_error`'s; `measure` checks through it where it can (never calling numpy's
interpreter) and a wrong kernel is still a failure; what it cannot evaluate stays with numpy.

Skipped where PyTorch does not import (CI has none); test_profile_check.py covers the host path.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from test_planner_kernels import random_inputs as kernel_test_inputs
from test_planner_torch import POSITIVE, instances
from test_profile_check import error_cases

import tgc
from tgc.planner import profile
from tgc.planner.kernel import KERNELS, Kernel, rel_error
from tgc.planner.profile import HostCheck, Instance, measure, reference_function
from tgc.runtime.interpreter import run_function
from tgc.types import TensorType

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (the torch backend is optional)"
)

from tgc.planner import torch_check  # noqa: E402  (needs torch)
from tgc.planner.backends import torch as torch_backend  # noqa: E402

SEEDS = (0, 1, 2)
F64_CLOSE = 1e-12  # torch's float64 against numpy's: a few ulp of sums and libm, normwise


@pytest.fixture(scope="module", autouse=True)
def torch_kernels():
    """torch-cpu registered for this module (and left as found: registered by another module
    that loaded it first, or not)."""
    added = torch_backend.register()
    yield
    if added:
        torch_backend.unregister()


def parse(text: str):
    return tgc.parse(text).funcs[0]


def to_numpy(values) -> list[np.ndarray]:
    return [torch_backend.to_numpy(x) for x in values]


def with_inputs(check: torch_check.TorchCheck, arrays: list[np.ndarray]):
    """The check evaluated on given host arrays instead of its own draw."""
    check.inputs = [torch_backend.from_numpy(np.array(a)) for a in arrays]
    return check


def same_within(got: list, want: list, bound: float, what: str) -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, g.dtype, w.dtype)
        assert rel_error(g, w) <= bound, f"{what}: {rel_error(g, w):.3g} > {bound:.3g}"


def check_against_numpy(func, inputs: list[np.ndarray], stated: float, what: str) -> None:
    """torch's "f64" against numpy's within F64_CLOSE; torch's "native" against numpy's within
    the kernel's stated error (both compute in the program's types, summing in other orders),
    plus an ulp of a 16-bit result (sums that differ in f32 may round to neighbours)."""
    reason = torch_check.unsupported(func, None)
    assert reason is None or "f64" in reason, (what, reason)  # an f64 result: numpy checks it
    check = with_inputs(torch_check.TorchCheck(func, None, 0), inputs)
    same_within(
        to_numpy(check.reference("f64")), run_function(func, inputs, "f64"), F64_CLOSE, what
    )
    results = func.function_type.results
    ulp = max(
        (float(ml_dtypes.finfo(t.dtype).eps) for t in results if t.element_type in ("f16", "bf16")),
        default=0,
    )
    native = to_numpy(check.reference("native"))
    same_within(native, run_function(func, inputs, "native"), stated + ulp, what + " (native)")


def op_kinds() -> list[str]:
    return sorted(torch_backend.OP_FUNCTIONS)


@pytest.mark.parametrize("op", op_kinds())
@pytest.mark.parametrize("seed", SEEDS)
def test_the_float64_reference_is_numpys_for_every_op_kind(op, seed):
    rng = np.random.default_rng(seed)
    stated = torch_backend.OP_FUNCTIONS[op][1]
    checked = 0
    for text in instances(op, rng, "f32"):
        func = parse(text)
        # the kernel tests' inputs (magnitudes in [0.5, 2), positive where the op needs it) and
        # the check's own draw (normal, weights scaled by fan-in)
        ours = to_numpy(torch_check.TorchCheck(func, None, seed).inputs)
        for inputs in (kernel_test_inputs(func, rng, positive=op in POSITIVE), ours):
            check_against_numpy(func, inputs, stated, f"{op}: {text}")
            checked += 1
    assert checked >= 2


# Ops evaluated besides the torch kernels' (torch_check MOVES, values made on the host,
# comparisons of integers), with a float op after each so the result is a float.
MOVES = {
    "reshape": (
        "%m = atomic.reshape %x : (tensor<6x8xf32>) -> tensor<2x3x8xf32>",
        [(6, 8)],
        (2, 3, 8),
    ),
    "transpose": (
        "%m = atomic.transpose %x {perm = [2, 0, 1]} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>",
        [(2, 3, 4)],
        (4, 2, 3),
    ),
    "broadcast": (
        "%m = atomic.broadcast %x : (tensor<3x1xf32>) -> tensor<2x3x5xf32>",
        [(3, 1)],
        (2, 3, 5),
    ),
    "slice": (
        "%m = atomic.slice %x {start = [1, 0], stop = [5, 7], step = [2, 3]}"
        " : (tensor<6x8xf32>) -> tensor<2x3xf32>",
        [(6, 8)],
        (2, 3),
    ),
    "concat": (
        "%m = atomic.concat %x, %z {axis = 1} : (tensor<3x2xf32>, tensor<3x4xf32>)"
        " -> tensor<3x6xf32>",
        [(3, 2), (3, 4)],
        (3, 6),
    ),
}


def _moving(name: str) -> str:
    line, shapes, out = MOVES[name]
    names = ["%x", "%z"][: len(shapes)]
    args = ", ".join(f"{n}: {_t(s)}" for n, s in zip(names, shapes))
    return (
        f"func.func @f({args}) -> {_t(out)} {{\n  {line}\n"
        f"  %y = atomic.exp %m : ({_t(out)}) -> {_t(out)}\n  func.return %y : {_t(out)}\n}}\n"
    )


def _t(shape, element="f32") -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{element}>"


SPLIT = """
func.func @f(%x: tensor<4x9xbf16>) -> tensor<4x3xbf16> {
  %a, %b = atomic.split %x {axis = 1, sizes = [3, 6]} : (tensor<4x9xbf16>) -> (tensor<4x3xbf16>, tensor<4x6xbf16>)
  %s = atomic.reduce_sum %b {axes = [1], keepdims = true} : (tensor<4x6xbf16>) -> tensor<4x1xbf16>
  %y = atomic.mul %a, %s : (tensor<4x3xbf16>, tensor<4x1xbf16>) -> tensor<4x3xbf16>
  func.return %y : tensor<4x3xbf16>
}
"""

# a causal mask from iotas compared as integers, a constant, a cast to bf16 and back
MASKED = """
func.func @f(%s: tensor<3x16x16xf32>) -> tensor<3x16x16xf32> {
  %i = atomic.iota {axis = 1} : () -> tensor<16x16xi32>
  %j = atomic.iota {axis = 0} : () -> tensor<16x16xi32>
  %keep = atomic.cmp %i, %j {pred = "le"} : (tensor<16x16xi32>, tensor<16x16xi32>) -> tensor<16x16xi1>
  %low = atomic.constant {value = dense<-1.0e4> : tensor<f32>} : () -> tensor<f32>
  %m = atomic.where %keep, %s, %low : (tensor<16x16xi1>, tensor<3x16x16xf32>, tensor<f32>) -> tensor<3x16x16xf32>
  %h = atomic.cast %m : (tensor<3x16x16xf32>) -> tensor<3x16x16xbf16>
  %w = atomic.cast %h : (tensor<3x16x16xbf16>) -> tensor<3x16x16xf32>
  %y = hl.softmax %w {axis = -1} : (tensor<3x16x16xf32>) -> tensor<3x16x16xf32>
  func.return %y : tensor<3x16x16xf32>
}
"""


@pytest.mark.parametrize("name", sorted(MOVES))
@pytest.mark.parametrize("seed", SEEDS)
def test_ops_that_move_data_are_evaluated_exactly(name, seed):
    func = parse(_moving(name))
    inputs = kernel_test_inputs(func, np.random.default_rng(seed))
    check_against_numpy(func, inputs, torch_backend.ULPS, name)


@pytest.mark.parametrize("text", [SPLIT, MASKED], ids=["split_bf16", "iota_mask_cast"])
@pytest.mark.parametrize("seed", SEEDS)
def test_values_made_on_the_host_and_integer_comparisons_are_numpys(text, seed):
    func = parse(text)
    inputs = kernel_test_inputs(func, np.random.default_rng(seed))
    check_against_numpy(func, inputs, torch_backend.SUMS, "graph")


def test_the_draw_is_seeded_and_shaped_as_random_inputs_draws():
    func = parse("""
func.func @f(%x: tensor<64x512xbf16>, %w: tensor<512x256xbf16>, %c: tensor<64x256xi1>) -> tensor<64x256xbf16> {
  %h = hl.linear %x, %w : (tensor<64x512xbf16>, tensor<512x256xbf16>) -> tensor<64x256xbf16>
  %z = atomic.constant {value = dense<0.0> : tensor<bf16>} : () -> tensor<bf16>
  %y = atomic.where %c, %h, %z : (tensor<64x256xi1>, tensor<64x256xbf16>, tensor<bf16>) -> tensor<64x256xbf16>
  func.return %y : tensor<64x256xbf16>
}
""")
    x, w, c = torch_check.TorchCheck(func, None, 7).inputs
    assert (x.dtype, w.dtype, c.dtype) == (torch.bfloat16, torch.bfloat16, torch.bool)
    assert tuple(x.shape) == (64, 512) and tuple(c.shape) == (64, 256)
    # N(0, 1) activations, N(0, 1/fan_in) weights (fan_in 512), i1 about half true
    assert 0.9 < float(x.float().std()) < 1.1
    assert 0.9 < float(w.float().std()) * math.sqrt(512) < 1.1
    assert 0.4 < float(c.float().mean()) < 0.6
    again = torch_check.TorchCheck(func, None, 7).inputs
    other = torch_check.TorchCheck(func, None, 8).inputs
    assert all(torch.equal(a, b) for a, b in zip(again, (x, w, c)))
    assert not torch.equal(other[0], x)


@pytest.mark.parametrize("seed", range(5))
def test_the_error_on_tensors_is_rel_errors(seed, monkeypatch):
    monkeypatch.setattr(torch_check, "CHUNK", 50)  # several sweeps, a short last one
    checked = 0
    for got, want in error_cases(seed):
        with np.errstate(all="ignore"):
            expected = rel_error(got, want)
        tensors = [torch_backend.from_numpy(np.array(a)) for a in (got, want)]
        assert torch_check.rel_error(*tensors) == expected, (got, want)
        checked += 1
    assert checked > 15


@pytest.mark.parametrize(
    "text, reason",
    [
        (
            """func.func @f(%t: tensor<10x4xf32>, %i: tensor<3xi32>) -> tensor<3x4xf32> {
  %y = atomic.gather %t, %i {axis = 0} : (tensor<10x4xf32>, tensor<3xi32>) -> tensor<3x4xf32>
  func.return %y : tensor<3x4xf32>
}""",
            "'atomic.gather' has no torch-cpu kernel",
        ),
        (
            """func.func @f(%x: tensor<8xf64>) -> tensor<8xf64> {
  %y = atomic.exp %x : (tensor<8xf64>) -> tensor<8xf64>
  func.return %y : tensor<8xf64>
}""",
            "float results are f64",
        ),
        (
            """func.func @f(%x: tensor<8xi32>) -> tensor<8xi32> {
  %y = atomic.add %x, %x : (tensor<8xi32>, tensor<8xi32>) -> tensor<8xi32>
  func.return %y : tensor<8xi32>
}""",
            "torch-cpu.atomic.add takes f32, f64 values, not i32",
        ),
    ],
)
def test_what_torch_cannot_evaluate_stays_with_numpy(text, reason):
    func = parse(text)
    assert reason in torch_check.unsupported(func, None)
    assert torch_check.unsupported(func, "no-such-space") is not None
    ret = func.body.last.operands[0].type
    kernel = Kernel("numpy.test_any", "numpy", reference=text, run=lambda *a: [])
    inst = Instance(kernel, tuple(a.type for a in func.body.args), (ret,))
    assert type(profile.checker(inst, func, 0)) is HostCheck


@pytest.fixture
def numpy_interpreter_forbidden(monkeypatch):
    """The check may not run numpy's interpreter (HostCheck): everything happens in torch."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the host check ran")

    monkeypatch.setattr(HostCheck, "__init__", forbidden)


def _instance(kernel: Kernel, text: str) -> Instance:
    func = parse(text)
    root = func.body.last.operands[0].defining_op
    attrs = {k: v for k, v in root.attributes.items() if "." not in k}
    return Instance(
        kernel,
        tuple(a.type for a in func.body.args),
        tuple(func.function_type.results),
        attrs if kernel.op else {},
    )


ATTENTION = """
func.func @f(%q: tensor<2x3x40x16xf32>, %k: tensor<2x3x40x16xf32>, %v: tensor<2x3x40x16xf32>) -> tensor<2x3x40x16xf32> {
  %y = hl.attention %q, %k, %v {causal = true} : (tensor<2x3x40x16xf32>, tensor<2x3x40x16xf32>, tensor<2x3x40x16xf32>) -> tensor<2x3x40x16xf32>
  func.return %y : tensor<2x3x40x16xf32>
}
"""
MATMUL = """
func.func @f(%a: tensor<48x64xf32>, %b: tensor<64x300xf32>) -> tensor<48x300xf32> {
  %y = atomic.matmul %a, %b : (tensor<48x64xf32>, tensor<64x300xf32>) -> tensor<48x300xf32>
  func.return %y : tensor<48x300xf32>
}
"""


@pytest.mark.parametrize(
    "name, text",
    [
        ("torch-cpu.hl.attention", ATTENTION),
        ("torch-cpu.atomic.matmul", MATMUL),
        ("numpy.atomic.matmul", MATMUL),
        ("numpy.hl.attention", ATTENTION),
    ],
)
def test_measure_checks_on_the_device_with_torch(name, text, numpy_interpreter_forbidden):
    m = measure(_instance(KERNELS[name], text), min_time=0.001)
    assert m.ok, m.message
    assert 0 <= m.max_error < 1e-5 and m.median > 0


def _wrong_gelu(op, x):
    """The tanh approximation where the exact (erf) GELU is asked: up to 5e-4 off."""
    return torch.nn.functional.gelu(x, approximate="tanh")


def _off_by(factor: float):
    return lambda op, a, b: torch.matmul(a, b) * factor


GELU = """
func.func @f(%x: tensor<64x96xf32>) -> tensor<64x96xf32> {
  %y = hl.gelu %x {approximate = "none"} : (tensor<64x96xf32>) -> tensor<64x96xf32>
  func.return %y : tensor<64x96xf32>
}
"""


@pytest.mark.parametrize(
    "op, fn, text",
    [
        ("hl.gelu", _wrong_gelu, GELU),
        ("atomic.matmul", _off_by(1.001), MATMUL),  # 1e-3 off, 100x its stated 1e-5
    ],
)
def test_a_wrong_kernel_is_caught_by_the_torch_check(
    op, fn, text, numpy_interpreter_forbidden, monkeypatch
):
    kernel = Kernel(
        "torch-cpu.test_wrong",
        "torch-cpu",
        op=op,
        run=torch_backend.host_run(op, fn, "cpu"),
        max_rel_error=torch_backend.OP_FUNCTIONS[op][1],
    )
    monkeypatch.setitem(torch_backend.TENSOR_RUN, kernel.name, torch_backend.tensor_run(op, fn))
    m = measure(_instance(kernel, text), min_time=0.001)
    assert not m.ok and m.message.startswith("wrong result"), m.message
    assert m.median is None and m.max_error > kernel.max_rel_error


def test_a_bf16_instance_is_checked_with_torch(numpy_interpreter_forbidden):
    """A 16-bit kernel of the host (numpy computes in f32 and rounds) on the torch path: its
    allowance is bf16's 8 ulp, its reference torch's float64."""
    x = TensorType.get((32, 64), "bf16")
    m = measure(Instance(KERNELS["numpy.atomic.exp"], (x,), (x,)), min_time=0.001)
    assert m.ok, m.message
    assert 0 < m.max_error < 8 * 2.0**-8


def test_the_reference_function_of_an_instance_is_what_the_check_evaluates():
    """The instance's own reference function goes to the torch check (an op kernel's op with
    its attributes)."""
    inst = _instance(KERNELS["torch-cpu.hl.attention"], ATTENTION)
    ref = reference_function(inst)
    check = profile.checker(inst, ref, 3)
    assert isinstance(check, torch_check.TorchCheck)
    (want,) = check.reference("f64")
    (numpy_want,) = run_function(ref, to_numpy(check.inputs), "f64")
    assert rel_error(torch_backend.to_numpy(want), numpy_want) <= F64_CLOSE


CAST_F16 = """
func.func @f(%a: tensor<256x512xf32>, %b: tensor<256x512xf32>) -> tensor<256x512xf16> {
  %p = atomic.mul %a, %b : (tensor<256x512xf32>, tensor<256x512xf32>) -> tensor<256x512xf32>
  %y = atomic.cast %p : (tensor<256x512xf32>) -> tensor<256x512xf16>
  func.return %y : tensor<256x512xf16>
}
"""


@pytest.mark.parametrize("seed", SEEDS)
def test_a_float64_value_cast_to_f16_is_rounded_once_as_numpy_rounds_it(seed):
    """In float64 the product is exact (48 bits), so it rounds to f16 from float64: numpy
    rounds once, torch's `.to(float16)` through f32 (about 8 of these 131,072 values differ)."""
    func = parse(CAST_F16)
    check = torch_check.TorchCheck(func, None, seed)
    (got,) = to_numpy(check.reference("f64"))
    (want,) = run_function(func, to_numpy(check.inputs), "f64")
    np.testing.assert_array_equal(got, want)

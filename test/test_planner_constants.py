"""Constants in the planner (issue 22, item 5).

- A constant kept in a `.npy` file (`dense_file<"...">`, what tgc-import writes for every
  large weight) stopped every planner tool with "internal error: TypeError: Strings must be
  encoded before hashing": the structural hash (planner/blocks.py) hashed the constant's key,
  which for a file constant is its path, a str. Now it is known by its type and file, as its
  equality is (hashing the bytes would read every weight of a model).
- On device backends alone (`backends=("cuda",)`, no numpy family), a constant that no
  generated kernel recomputes by value had no kernel at all ("no kernel can run
  'atomic.constant' within tolerance 1e-05"): any constant that is not a splat (GPT-2's i64
  position ids, an f32 table, a `dense_file` weight) and any constant read whole (a GEMM's
  operand, a result), whatever its element type. `PlanContext(host_constants=True)` makes the
  numpy backend's constant kernel an option whatever the backends: the value is made on the
  host and copied where it is read (planner/options.py `HOST_CONSTANT`); no other host kernel
  becomes one. Without it (the default, kept: the host as one more space costs device-only
  plans their exactness) such a plan still fails, with the located one-line error.

Checked with the stand-in device of test_planner_cuda.py (no GPU needed): each case planned on
the cuda family alone, run, and compared with the interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_planner_cuda import Boxed, _stand_in_call, _stand_in_region

import tgc
from tgc import datafiles
from tgc.attributes import DenseAttr
from tgc.builder import tensor
from tgc.dialects.kernel import CallOp, CopyOp
from tgc.planner.backends import Backend, Space
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.blocks import op_hashes
from tgc.diagnostics import TgcError
from tgc.planner import kernel_backends
from tgc.planner.cost import CachedCosts, RooflineCostSource
from tgc.planner.executor import run_plan
from tgc.planner.kernel import KERNELS
from tgc.planner.materialise import materialise
from tgc.planner.options import PlanContext
from tgc.planner.select import plan_function, prepare
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.tools import plan as plan_tool
from tgc.tools import run as run_tool

RNG = np.random.default_rng()
HOST_CONSTANT = "numpy.atomic.constant"  # planner/options.py's name for it


@pytest.fixture
def stand_in():
    """The CUDA planner side with a stand-in device (values boxed host arrays)."""

    def from_host(a, t):
        return Boxed(ck.host_array(a, t).copy())

    backend = Backend("cuda", call=_stand_in_call, run_region=_stand_in_region)
    ck.register(backend, Space("cuda", lambda v: v.array.copy(), from_host))
    yield
    ck.unregister()


# -- dense_file constants ------------------------------------------------------------------------

FILE_MODULE = """func.func @f(%x: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %c = atomic.constant {value = dense_file<"w/c.npy"> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
  %y = atomic.add %x, %c : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
  %z = atomic.mul %y, %c : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
  func.return %z : tensor<3x4xf32>
}
"""


def _file_model(tmp_path, text: str = FILE_MODULE, name: str = "w/c.npy"):
    ty = tensor("3x4xf32")
    values = RNG.standard_normal(ty.shape).astype(np.float32)
    datafiles.write(DenseAttr.in_file(values, ty, name), tmp_path)
    path = tmp_path / "m.tg"
    path.write_text(text)
    return path, values


def test_tgc_plan_plans_a_dense_file_constant(tmp_path, capsys):
    path, _ = _file_model(tmp_path)
    code = plan_tool.main([str(path), "--planner-backends", "numpy"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "numpy.atomic.constant()" in out.out and "internal error" not in out.err


def test_tgc_run_auto_runs_a_dense_file_constant(tmp_path, capsys):
    path, values = _file_model(tmp_path)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = [str(path), "--backend", "auto", "--planner-backends", "numpy", "--check"]
    code = run_tool.main([*argv, "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "check: result 0 ok" in out.out
    np.testing.assert_allclose(np.load(tmp_path / "result_0.npy"), (x + values) * values, rtol=1e-6)


def test_the_hash_of_a_dense_file_constant_is_its_type_and_file(tmp_path):
    """Equal where the constants are equal (the same file), different for another file."""
    ty = tensor("3x4xf32")
    for name in ("a.npy", "b.npy"):
        datafiles.write(DenseAttr.in_file(np.ones(ty.shape, np.float32), ty, name), tmp_path)
    text = """func.func @f() -> (tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>) {
  %a = atomic.constant {value = dense_file<"a.npy"> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
  %a2 = atomic.constant {value = dense_file<"a.npy"> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
  %b = atomic.constant {value = dense_file<"b.npy"> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
  func.return %a, %a2, %b : tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>
}
"""
    (tmp_path / "m.tg").write_text(text)
    func = tgc.parse_file(tmp_path / "m.tg").funcs[0]
    a, a2, b = list(func.body.ops)[:3]
    hashes = op_hashes([a, a2, b])
    assert hashes[a] == hashes[a2] != hashes[b]


# -- constants on device backends alone ------------------------------------------------------------

C = '"cuda"'
ON_DEVICE = {
    "i64 position ids read by a gather": f"""
func.func @f(%w: tensor<16x8xf32, {C}>) -> tensor<1x4x8xf32, {C}> {{
  %p = atomic.constant {{value = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>}} : () -> tensor<1x4xi64, {C}>
  %e = atomic.gather %w, %p {{axis = 0}} : (tensor<16x8xf32, {C}>, tensor<1x4xi64, {C}>) -> tensor<1x4x8xf32, {C}>
  func.return %e : tensor<1x4x8xf32, {C}>
}}""",
    "f32 table read by an add": f"""
func.func @f(%x: tensor<4xf32, {C}>) -> tensor<4xf32, {C}> {{
  %c = atomic.constant {{value = dense<[1.0, -2.0, 3.5, 4.0]> : tensor<4xf32>}} : () -> tensor<4xf32, {C}>
  %y = atomic.add %x, %c : (tensor<4xf32, {C}>, tensor<4xf32, {C}>) -> tensor<4xf32, {C}>
  func.return %y : tensor<4xf32, {C}>
}}""",
    "splat read whole by a GEMM": f"""
func.func @f(%x: tensor<4x4xf32, {C}>) -> tensor<4x4xf32, {C}> {{
  %c = atomic.constant {{value = dense<0.5> : tensor<4x4xf32>}} : () -> tensor<4x4xf32, {C}>
  %y = atomic.matmul %x, %c : (tensor<4x4xf32, {C}>, tensor<4x4xf32, {C}>) -> tensor<4x4xf32, {C}>
  func.return %y : tensor<4x4xf32, {C}>
}}""",
    "a table returned": f"""
func.func @f() -> tensor<4xf32, {C}> {{
  %c = atomic.constant {{value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>}} : () -> tensor<4xf32, {C}>
  func.return %c : tensor<4xf32, {C}>
}}""",
    "a splat returned": f"""
func.func @f() -> tensor<2x3xi64, {C}> {{
  %c = atomic.constant {{value = dense<7> : tensor<2x3xi64>}} : () -> tensor<2x3xi64, {C}>
  func.return %c : tensor<2x3xi64, {C}>
}}""",
}


def _device_context(host_constants: bool = True) -> PlanContext:
    return PlanContext(
        tolerance=1e-5, backends=kernel_backends(("cuda",)), host_constants=host_constants
    )


def _plan_on_device(func, host_constants: bool = True):
    """select_kernels(func, backends=("cuda",)) with the context's `host_constants`."""
    prepare(func)
    costs = CachedCosts(RooflineCostSource())
    materialise(func, plan_function(func, _device_context(host_constants), costs), costs)
    tgc.verify(func.parent_op)
    return func


def _planned_on_device(text: str, host_constants: bool = True):
    return _plan_on_device(tgc.parse(text).funcs[0], host_constants)


def _steps(func) -> list[str]:
    out = []
    for op in func.body.ops:
        if isinstance(op, CallOp):
            out.append(op.attr("callee"))
        elif isinstance(op, CopyOp):
            out.append("copy to " + (op.results[0].type.encoding or "host"))
    return out


@pytest.mark.parametrize("case", ON_DEVICE, ids=lambda c: c.replace(" ", "-"))
def test_a_constant_plans_and_runs_on_device_backends_alone(case, stand_in):
    """Each failed in select-kernels before; now the constant is made on the host and copied
    to the device where it is read, and the plan computes what the interpreter does."""
    text = ON_DEVICE[case]
    func = _planned_on_device(text)
    steps = _steps(func)
    assert steps[:2] == [HOST_CONSTANT, "copy to cuda"], steps
    # the host runs the constant alone: every other kernel is the device's
    assert all(s.startswith("cuda.") for s in steps[2:]), steps
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 3)
    want = run_function(reference, inputs)
    got = run_plan(func, inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5)


def test_a_splat_read_by_value_stays_inside_the_device_kernel(stand_in):
    """What already worked stays so: a splat an elementwise kernel recomputes is not run."""
    func = _planned_on_device(
        ON_DEVICE["f32 table read by an add"].replace("dense<[1.0, -2.0, 3.5, 4.0]>", "dense<2.0>")
    )
    assert _steps(func) == ["cuda.elementwise"]


def test_a_dense_file_weight_plans_on_device_backends_alone(tmp_path, stand_in):
    """An imported model's weight kept in a file, read by a GEMM on the device."""
    ty = tensor("8x4xf32")
    w = RNG.standard_normal(ty.shape).astype(np.float32)
    datafiles.write(DenseAttr.in_file(w, ty, "w.npy"), tmp_path)
    text = f"""func.func @f(%x: tensor<2x8xf32, {C}>) -> tensor<2x4xf32, {C}> {{
  %w = atomic.constant {{value = dense_file<"w.npy"> : tensor<8x4xf32>}} : () -> tensor<8x4xf32, {C}>
  %y = atomic.matmul %x, %w : (tensor<2x8xf32, {C}>, tensor<8x4xf32, {C}>) -> tensor<2x4xf32, {C}>
  func.return %y : tensor<2x4xf32, {C}>
}}
"""
    (tmp_path / "m.tg").write_text(text)
    module = tgc.parse_file(tmp_path / "m.tg")
    _plan_on_device(module.funcs[0])
    assert _steps(module.funcs[0]) == [HOST_CONSTANT, "copy to cuda", ck.CUBLAS_GEMM]
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    (got,) = run_plan(module.funcs[0], [x])
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-6)


def test_without_host_constants_the_device_plan_fails_at_the_constant(stand_in):
    """The default is unchanged: on the cuda family alone, the located one-line error."""
    with pytest.raises(TgcError, match="no kernel can run 'atomic.constant' within tolerance"):
        _planned_on_device(ON_DEVICE["i64 position ids read by a gather"], host_constants=False)


def test_the_host_constant_is_the_one_host_kernel_a_device_plan_may_take():
    """Limiting the backends still limits every other kernel (numpy's add is no option on the
    cuda family alone), and the host is a space of such a plan only through the constant."""
    ctx = _device_context()
    assert ctx.allows(KERNELS[HOST_CONSTANT]) and None in ctx.spaces()
    assert not ctx.allows(KERNELS["numpy.atomic.add"])
    assert not _device_context(False).allows(KERNELS[HOST_CONSTANT])
    assert None not in _device_context(False).spaces()
    only_numpy = PlanContext(
        kernels=[KERNELS["numpy.atomic.add"]], backends=("cuda",), host_constants=True
    )
    assert only_numpy.spaces() == set()

"""The GPU route on a GPU (marker `cuda`, skipped elsewhere with the reason): calls replayed as
CUDA graphs give the results plain launches give, follow their inputs' contents, and key on
their buffers; the padded cuBLAS GEMM computes the matmul, and a result of it the function only
returns is a strided view of its padded rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc.runtime.interpreter import random_inputs, run_function

pytestmark = pytest.mark.cuda
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _compile(text: str, db: Path):
    from tgc.planner import route

    options = route.RouteOptions(db=str(db), measure_budget=5.0, progress=False, min_time=0.002)
    return route.compile_module(tgc.parse(text), None, options)


def _device(arrays, func):
    from tgc.planner.backends import SPACES

    space = SPACES["cuda"]
    return [space.from_host(x, a.type) for x, a in zip(arrays, func.body.args)]


def _host(values) -> list[np.ndarray]:
    from tgc.planner.backends import SPACES

    return [np.asarray(SPACES["cuda"].to_host(v)) for v in values]


@pytest.mark.parametrize("example", ["gpt2_block", "mlp", "gelu_scale"])
def test_graph_replays_give_what_plain_launches_give(example, tmp_path):
    from tgc.planner.graphs import GraphReplay

    text = (EXAMPLES / f"{example}.tg").read_text()
    compiled = _compile(text, tmp_path / "m.sqlite")
    runner = compiled.runner
    assert isinstance(runner, GraphReplay) and runner.reason is None, compiled.report.summary()
    func = compiled.func
    first, second = random_inputs(func, 1), random_inputs(func, 2)
    values = _device(first, func)
    plain = _host(compiled.planned(values))
    captures, replays = runner.captures, runner.replays  # the compile's own timing captured
    replayed = [_host(compiled(values)) for _ in range(3)]  # plain, captured, replayed
    assert runner.captures == captures + 1 and runner.replays == replays + 2
    for got in replayed:
        for g, w in zip(got, plain):
            np.testing.assert_array_equal(g, w)
    # new contents in the same buffers: the replay reads them
    for value, array in zip(values, second):
        import pycuda.driver as cuda

        cuda.memcpy_htod(value.ptr, np.ascontiguousarray(array, value.dtype))
    got = _host(compiled(values))
    assert runner.captures == captures + 1 and runner.replays == replays + 3
    reference = tgc.parse(text).funcs[0]
    want = run_function(reference, second, "f64")
    for g, w in zip(got, want):
        scale = max(float(np.max(np.abs(w))), 1.0)
        assert float(np.max(np.abs(g.astype(np.float64) - w))) <= 2e-3 * scale
    np.testing.assert_array_equal(got[0], _host(compiled.planned(values))[0])


@pytest.mark.parametrize("name", ["cuda.cublas.gemm_padded", "cuda.cublas.gemm_split"])
@pytest.mark.parametrize(
    "dtype, rows, n", [("bf16", 64, 1001), ("f32", 33, 257), ("bf16", 7, 1003), ("bf16", 5, 5)]
)
def test_the_padded_gemm_computes_the_matmul(dtype, rows, n, name):
    """Their parts (aligned columns, the rest: either may be all), into padded rows and then
    the compact copy, or into the compact result."""
    from tgc.planner import load_backends
    from tgc.planner.backends import cuda_kernels as ck
    from tgc.planner.kernel import KERNELS
    from tgc.types import TensorType

    load_backends(("cuda",), required=True)
    rng = np.random.default_rng(n)
    k = 64
    a = rng.standard_normal((2, rows, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    result = TensorType.get((2, rows, n), dtype)
    kernel = KERNELS[name]
    assert name in ck.SPLIT_GEMMS
    a, b = a.astype(result.dtype), b.astype(result.dtype)
    (got,) = kernel.run([a, b], {"transpose_b": True}, [result])
    want = np.matmul(a.astype(np.float64), b.T.astype(np.float64))  # of the rounded inputs
    tolerance = 3e-2 if dtype == "bf16" else 1e-4
    error = np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want))
    assert error <= tolerance


_PADDED = [f'tensor<{s}xbf16, "cuda">' for s in ("2x64x96", "1001x96", "2x64x1001")]


def _padded_gemm_function(doubled: bool) -> str:
    """A planned function of one cuda.cublas.gemm_padded call (bf16, n = 1001: rows padded to
    1008) that returns the product, or (`doubled`) the product added to itself by a generated
    kernel, which reads it inside the function."""
    a, b, c = _PADDED
    name = "%p" if doubled else "%c"
    lines = [
        f"func.func @f(%a: {a}, %b: {b}) -> {c} {{",
        f'  {name} = kernel.call %a, %b {{callee = "cuda.cublas.gemm_padded", '
        f'op = "atomic.matmul", transpose_b = true}} : ({a}, {b}) -> {c}',
    ]
    if doubled:
        lines += [
            f'  %c = kernel.call %p {{callee = "cuda.elementwise"}} : ({c}) -> {c} {{',
            f"  ^bb0(%x: {c}):",
            f"    %y = atomic.add %x, %x : ({c}, {c}) -> {c}",
            f"    kernel.yield %y : {c}",
            "  }",
        ]
    return "\n".join([*lines, f"  func.return %c : {c}", "}", ""])


def _padded_gemm_operands(seed: int):
    rng = np.random.default_rng(seed)
    import ml_dtypes

    a = rng.standard_normal((2, 64, 96)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((1001, 96)).astype(ml_dtypes.bfloat16)
    return [a, b], np.matmul(a.astype(np.float64), b.T.astype(np.float64))  # of rounded inputs


def _close(got, want) -> bool:
    error = np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want))
    return bool(error <= 1e-2)


@pytest.mark.parametrize("doubled", [False, True])
def test_a_padded_gemm_result_the_function_returns_is_a_strided_view(doubled):
    """Returned as it is, gemm_padded's result keeps its padded rows (no compact copy) and says
    so to its readers: the host copy and a torch tensor of it hold the product. A kernel inside
    the function reads it compact (`doubled`)."""
    from tgc.planner import load_backends
    from tgc.planner.executor import PlannedFunction

    load_backends(("cuda",), required=True)
    func = tgc.parse(_padded_gemm_function(doubled)).funcs[0]
    operands, want = _padded_gemm_operands(7)
    want = want * 2 if doubled else want
    (got,) = PlannedFunction(func)(_device(operands, func))
    if doubled:
        assert got.strides is None
    else:
        assert got.ld == 1008 and got.strides == (64 * 1008 * 2, 1008 * 2, 2)
    assert _close(_host([got])[0], want)
    pytest.importorskip("torch", reason="the torch view of the result needs PyTorch")
    from tgc.planner.backends.torch import as_cuda_tensor

    tensor = as_cuda_tensor(got)
    assert tuple(tensor.shape) == (2, 64, 1001) and tensor.is_contiguous() == doubled
    assert _close(tensor.float().cpu().numpy(), want)


def test_a_padded_result_passed_to_a_kernel_is_refused_and_its_compact_copy_runs():
    from tgc.diagnostics import TgcError
    from tgc.planner import load_backends
    from tgc.planner.executor import PlannedFunction

    load_backends(("cuda",), required=True)
    func = tgc.parse(_padded_gemm_function(False)).funcs[0]
    operands, want = _padded_gemm_operands(8)
    (padded,) = PlannedFunction(func)(_device(operands, func))
    c = _PADDED[2]
    double = tgc.parse(
        f"func.func @g(%x: {c}) -> {c} {{\n"
        f'  %y = kernel.call %x {{callee = "cuda.elementwise"}} : ({c}) -> {c} {{\n'
        f"  ^bb0(%p: {c}):\n"
        f"    %q = atomic.add %p, %p : ({c}, {c}) -> {c}\n"
        f"    kernel.yield %q : {c}\n"
        "  }\n"
        f"  func.return %y : {c}\n}}\n"
    ).funcs[0]
    with pytest.raises(TgcError, match=r"padded rows .* pass its \.compact\(\) copy"):
        PlannedFunction(double)([padded])
    (got,) = PlannedFunction(double)([padded.compact()])
    assert _close(_host([got])[0], 2 * want)


@pytest.mark.parametrize("exponent", ["2.0", "3.0", "2.5"])
def test_generated_powers_match_float64(exponent, tmp_path):
    """x**2 and x**3 are generated as products (codegen/emitter.py `_small_power`)."""
    t = "tensor<64x1000xf32>"
    text = (
        f"func.func @f(%x: {t}) -> {t} {{\n"
        f"  %c = atomic.constant {{value = dense<{exponent}> : {t}}} : () -> {t}\n"
        f"  %a = atomic.abs %x : ({t}) -> {t}\n"
        f"  %p = atomic.pow %a, %c : ({t}, {t}) -> {t}\n"
        f"  func.return %p : {t}\n"
        "}\n"
    )
    compiled = _compile(text, tmp_path / "m.sqlite")
    x = random_inputs(compiled.func, 3)
    (got,) = compiled.run_host(x)
    want = np.abs(x[0].astype(np.float64)) ** float(exponent)
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=0)

"""bench/gpu_suite.py's bf16 and f16 rows (issue 8, item 4), checked on the CPU.

The GPU run is the lead's; what can fail before it is checked here: every workload's text
parses and verifies at full size; at a small size it computes, on the numpy backend in its own
element type, what an independent float64 numpy reference computes, within the tolerance the
benchmark itself applies against PyTorch (LOW_PRECISION_TOL; 1e-4 for f32), on fresh random
inputs; every row plans at full size as the GPU route plans it with nothing measured, on tgc's
own kernels (the standalone file's planning: PyTorch's kernels need the GPU), and the standalone
file of each row compiles with nvcc; PyTorch's side of each row (on the CPU) computes what the
text computes; the options and the report. The benchmark imports torch
only inside functions, so all but the PyTorch check run without it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.standalone import plan_standalone
from tgc.runtime.interpreter import run_function
from tgc.types import NUMPY_DTYPES
from tgc.verifier import verify

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import gpu_suite  # noqa: E402  (bench/ is on the path only now)

NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
TOL = {"f32": 1e-4, **gpu_suite.LOW_PRECISION_TOL}
ALL_ROWS = [(kind, dtype) for dtype in gpu_suite.LOW_DTYPES for kind in gpu_suite.LOW_WORKLOADS]


def full_size(kind: str, dtype: str) -> list[gpu_suite.Workload]:
    return gpu_suite.low_precision_workloads(kind, dtype, quick=False)


# -- float64 references, written from the ops' definitions (not from tgc) ---------------------------


def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def attention(q, k, v, causal):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = scores.shape[-1]
        scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def gpt2_block(b, s, d, h, x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, *mlp):
    w_fc, b_fc, w_proj, b_proj = mlp
    q, k, v = np.split(layernorm(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, axis=1)

    def heads(z):
        return z.reshape(b, s, h, d // h).transpose(0, 2, 1, 3)

    att = attention(heads(q), heads(k), heads(v), True).transpose(0, 2, 1, 3).reshape(b * s, d)
    x1 = x + att @ w_o + b_o
    return x1 + gelu_tanh(layernorm(x1, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj


# -- small cases: (text, inputs drawn in float64, reference) ----------------------------------------


def gpt2_case(rng, dtype):
    b, s, d, h = 2, 24, 64, 4  # 24 tokens: no multiple of a kernel's tile

    def w(*shape):
        return rng.standard_normal(shape) / np.sqrt(shape[0])

    def vec(n, mean=0.0):
        return mean + 0.1 * rng.standard_normal(n)

    inputs = [rng.standard_normal((b * s, d)), vec(d, 1.0), vec(d), w(d, 3 * d), vec(3 * d)]
    inputs += [w(d, d), vec(d), vec(d, 1.0), vec(d), w(d, 4 * d), vec(4 * d), w(4 * d, d), vec(d)]
    return (
        gpu_suite.gpt2_text(b, s, d, h, dtype=dtype),
        inputs,
        lambda *xs: [gpt2_block(b, s, d, h, *xs)],
    )


def attention_case(rng, dtype, causal):
    shape = (2, 3, 40, 16)
    inputs = [rng.standard_normal(shape) for _ in range(3)]
    return (
        gpu_suite.attention_text(*shape, causal, dtype),
        inputs,
        lambda q, k, v: [attention(q, k, v, causal)],
    )


def qkv_case(rng, dtype):
    t, d = 24, 32
    inputs = [rng.standard_normal((t, d))]
    inputs += [rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3)]
    return gpu_suite.qkv_text(t, d, dtype), inputs, lambda x, *ws: [x @ w for w in ws]


def gemm_gelu_case(rng, dtype):
    m, k, n = 24, 32, 48
    inputs = [rng.standard_normal((m, k)), rng.standard_normal((k, n)) / np.sqrt(k)]
    inputs.append(0.1 * rng.standard_normal(n))
    return (
        gpu_suite.gemm_gelu_text(m, k, n, dtype),
        inputs,
        lambda x, w, b: [gelu_tanh(x @ w + b)],
    )


def silu(x):
    return x / (1 + np.exp(-x))


def mlp_case(rng, dtype, form):
    """The SwiGLU or GPT-2 MLP with its residual, 24 tokens (no multiple of a kernel's tile)."""
    t, d, f = 24, 32, 48

    def w(*shape):
        return rng.standard_normal(shape) / np.sqrt(shape[0])

    x = rng.standard_normal((t, d))
    if form == "swiglu":
        return (
            gpu_suite.swiglu_mlp_text(t, d, f, dtype),
            [x, w(d, f), w(d, f), w(f, d)],
            lambda x, wg, wu, wd: [x + (silu(x @ wg) * (x @ wu)) @ wd],
        )
    inputs = [x, w(d, 4 * d), 0.1 * rng.standard_normal(4 * d), w(4 * d, d)]
    inputs.append(0.1 * rng.standard_normal(d))
    return (
        gpu_suite.gpt2_mlp_text(t, d, dtype),
        inputs,
        lambda x, w1, b1, w2, b2: [x + gelu_tanh(x @ w1 + b1) @ w2 + b2],
    )


SMALL_CASES = {
    "gpt2": gpt2_case,
    "attn_causal": lambda rng, dtype: attention_case(rng, dtype, True),
    "attn_full": lambda rng, dtype: attention_case(rng, dtype, False),
    "qkv": qkv_case,
    "gemm_gelu": gemm_gelu_case,
    "mlp_swiglu": lambda rng, dtype: mlp_case(rng, dtype, "swiglu"),
    "mlp_gpt2": lambda rng, dtype: mlp_case(rng, dtype, "gpt2"),
}


def max_rel_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("dtype", ["f32", *gpu_suite.LOW_DTYPES])
@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_small_text_on_numpy_backend_matches_float64_reference(case, dtype):
    """The text computes the workload: run in its element type (bf16/f16 stored, computed in
    f32, as the GPU kernels) against float64 on the same (rounded) inputs, within the
    benchmark's own tolerance for that type."""
    seed = secrets.randbits(32)
    text, inputs, reference = SMALL_CASES[case](np.random.default_rng(seed), dtype)
    module = parse_module(text)
    verify(module)
    stored = [x.astype(NUMPY_DTYPES[dtype]) for x in inputs]
    got = run_function(module.funcs[0], stored)
    want = reference(*(x.astype(np.float64) for x in stored))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == NUMPY_DTYPES[dtype]
        assert g.shape == w.shape
        err = max_rel_error(g, w)
        assert err <= TOL[dtype], f"{case} {dtype}: max rel. error {err:.2e} (seed {seed})"


@pytest.mark.parametrize(("kind", "dtype"), ALL_ROWS)
def test_full_size_texts_parse_and_verify(kind, dtype):
    for w in full_size(kind, dtype):
        module = parse_module(w.text)
        verify(module)
        (func,) = module.funcs
        assert all(a.type.element_type == dtype for a in func.body.args), w.name


def planned_row(w: gpu_suite.Workload, arch: str | None = None):
    """The row's function after its pipeline (tgc_program's), planned as the route plans it
    with nothing measured, for a GPU of `arch`, on tgc's own kernels."""
    module = parse_module(w.text)
    PassManager.from_text(w.pipeline or "lower-for-planning").run(module)
    with ck.planning_kernels(arch):
        plan_standalone(module.funcs[0])
    return module.funcs[0]


@pytest.mark.parametrize(("kind", "dtype"), ALL_ROWS)
def test_the_route_plans_every_row(kind, dtype):
    """What tgc_program does before it needs the GPU (the pipeline, the plan, at full size): a
    pass or planning error here would end the lead's run."""
    for w in full_size(kind, dtype):
        assert gpu_suite.callees(planned_row(w)), w.name


@pytest.mark.parametrize("dtype", gpu_suite.LOW_DTYPES)
def test_qkv_row_returning_its_products_times_one_batched_gemm_and_no_copies(dtype):
    """The QKV row returns q, k and v, so `-p optimize` stacks its matmuls: the weights packed
    (a kernel the route runs once per set of parameters), one batched GEMM, and the products
    returned as views of its result (no slice kernel, no copy)."""
    (w,) = full_size("qkv", dtype)
    assert w.pipeline == "optimize"
    func = planned_row(w)
    assert gpu_suite.callees(func) == [
        "cuda.elementwise",
        "cuda.cublas.gemm",
        "cuda.split_view",
        *["cuda.reshape_view"] * 3,
    ]
    (gemm,) = [op for op in func.body.ops if op.attributes.get("callee") == "cuda.cublas.gemm"]
    assert gemm.results[0].type.shape[0] == 3
    for v in func.body.last.operands:
        piece = v.defining_op.operands[0].defining_op
        assert piece.attr("callee") == "cuda.split_view" and piece.operands[0] is gemm.results[0]


@pytest.mark.parametrize("dtype", gpu_suite.LOW_DTYPES)
def test_attention_rows_are_one_kernel_each(dtype):
    """Each attention row times one fused kernel (no decomposition into GEMMs and softmax):
    planned for an H100 as the GPU run plans them, the wgmma kernel."""
    rows = full_size("attn", dtype)
    assert len(rows) == 2 * len(gpu_suite.ATTENTION_SHAPES)
    for w in rows:
        func = planned_row(w, "sm_90")
        assert gpu_suite.callees(func) == ["cuda.attention"], w.name
        assert func.body.first.attributes["param.wgmma"], w.name


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_compiles_the_standalone_file_of_every_low_precision_row(tmp_path):
    """Each bf16/f16 row's standalone file (its kernels as the route plans them for sm_90,
    tgc-translate --emit=cuda --arch=sm_90's) compiles as its header says, so that the GPU run
    does not stop at nvcc. The rows whose files name the same nvcc target compile as one
    module's file, a function each (planned as alone: the same kernels and host code), one
    nvcc run per target instead of one per row: nvcc's fixed cost is most of a small file's."""
    from tgc.planner.standalone import emit_standalone_cuda
    from tgc.printer import print_module

    def target(source: str) -> str:
        return re.search(r"nvcc (-\S+) -c FILE\.cu", source).group(1)

    groups: dict[str, list[str]] = {}  # nvcc target: the rows' functions after their pipelines
    for kind, dtype in ALL_ROWS:
        for w in full_size(kind, dtype):
            module = parse_module(w.text)
            PassManager.from_text(w.pipeline or "lower-for-planning").run(module)
            row = f"@row{sum(map(len, groups.values()))}("
            text = print_module(module).replace(f"@{module.funcs[0].sym_name}(", row, 1)
            own = emit_standalone_cuda(module, w.name, arch="sm_90")  # plans `module`
            groups.setdefault(target(own), []).append(text)

    files = []
    for flag, texts in groups.items():
        source = emit_standalone_cuda(parse_module("\n".join(texts)), "rows", arch="sm_90")
        assert target(source) == flag
        files.append((flag, source))

    def build(item):
        i, (flag, source) = item
        src = tmp_path / f"rows{i}.cu"
        src.write_text(source)
        cmd = [NVCC, flag, "-c", "-o", f"{src}.o", str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return None if proc.returncode == 0 else f"{flag}:\n{proc.stderr[-2000:]}"

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        failures = [f for f in pool.map(build, enumerate(files)) if f]
    assert not failures, "\n".join(failures)


# -- PyTorch's side (on the CPU) computes what the text computes ------------------------------------


def torch_side_cases(torch):
    """(name, tgc text, PyTorch function, inputs) at small sizes, in f32 on the CPU."""
    gen = torch.Generator().manual_seed(secrets.randbits(32))

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    block, gpt2_inputs = gpu_suite.gpt2_torch(2, 24, 64, 4, device="cpu")
    qkv = [rnd(2, 3, 40, 16) for _ in range(3)]
    cases = [("gpt2", gpu_suite.gpt2_text(2, 24, 64, 4), block, gpt2_inputs)]
    cases += [
        (
            f"attn causal={c}",
            gpu_suite.attention_text(2, 3, 40, 16, c, "f32"),
            gpu_suite.sdpa(c),
            qkv,
        )
        for c in (True, False)
    ]
    cases.append(
        (
            "qkv",
            gpu_suite.qkv_text(24, 32, "f32"),
            gpu_suite.three_gemms,
            [rnd(24, 32)] + [rnd(32, 32, scale=32**-0.5) for _ in range(3)],
        )
    )
    cases.append(
        (
            "gemm_gelu",
            gpu_suite.gemm_gelu_text(24, 32, 48, "f32"),
            gpu_suite.gemm_bias_gelu,
            [rnd(24, 32), rnd(32, 48, scale=32**-0.5), rnd(48, scale=0.1)],
        )
    )
    cases.append(
        (
            "mlp swiglu",
            gpu_suite.swiglu_mlp_text(24, 32, 48, "f32"),
            gpu_suite.swiglu_mlp,
            [rnd(24, 32), rnd(32, 48), rnd(32, 48), rnd(48, 32, scale=48**-0.5)],
        )
    )
    cases.append(
        (
            "mlp gpt2",
            gpu_suite.gpt2_mlp_text(24, 32, "f32"),
            gpu_suite.gpt2_mlp,
            [rnd(24, 32), rnd(32, 128), rnd(128, scale=0.1), rnd(128, 32, scale=128**-0.5)]
            + [rnd(32, scale=0.1)],
        )
    )
    return cases


def test_torch_side_computes_what_the_text_computes():
    """The rows' PyTorch functions and their tgc texts are the same function (else the GPU
    run's check would fail, or pass on a different workload): both in f32 on the CPU, on the
    same inputs, PyTorch's results against the numpy backend's."""
    torch = pytest.importorskip("torch")
    for name, text, fn, inputs in torch_side_cases(torch):
        want = fn(*inputs)
        wants = list(want) if isinstance(want, tuple) else [want]
        got = run_function(parse_module(text).funcs[0], [x.numpy() for x in inputs])
        assert len(got) == len(wants), name
        for g, w in zip(got, wants):
            err = max_rel_error(g, w.double().numpy())
            assert err <= 1e-4, f"{name}: max rel. error {err:.2e}"


def test_bf16_results_come_back_to_torch_exactly():
    """checked_result's conversion: a bf16 result (ml_dtypes) comes back as an f32 array torch
    takes, holding the same values."""
    torch = pytest.importorskip("torch")
    x = torch.randn(5, 7).to(torch.bfloat16)
    back = gpu_suite.torch_storable(x.float().numpy().astype(NUMPY_DTYPES["bf16"]))
    assert back.dtype == np.float32
    assert torch.equal(torch.from_numpy(back).to(torch.bfloat16), x)


# -- options and report ----------------------------------------------------------------------------


def test_help_needs_no_torch():
    """--help works where torch cannot be imported (the options are parsed before it is)."""
    code = (
        "import sys, runpy; sys.modules['torch'] = None; "
        f"sys.argv = ['gpu_suite.py', '--help']; runpy.run_path({str(ROOT / 'bench' / 'gpu_suite.py')!r}, run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "--dtypes" in proc.stdout and "gemm_gelu_T" in proc.stdout


def test_dtypes_select_rows():
    assert gpu_suite.parse_args(["--dtypes", "bf16"]).selected == [
        "gpt2_bf16",
        "attn_bf16",
        "qkv_bf16",
        "gemm_gelu_bf16",
        "mlp_bf16",
    ]
    default = gpu_suite.parse_args([]).selected
    assert default[: len(gpu_suite.F32_WORKLOADS)] == list(gpu_suite.F32_WORKLOADS)
    assert "gemm_gelu_f16" in default
    only = gpu_suite.parse_args(["--only", "gpt2,attn_f16", "--dtypes", "f32,f16"]).selected
    assert only == ["gpt2", "attn_f16"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtypes", "bf16,f64"], "--dtypes: unknown element type 'f64' (known: f32, bf16, f16)"),
        (["--only", "attn_f64"], "--only: unknown workload 'attn_f64' (known: gelu64M,"),
        (["--only", "gpt2_bf16", "--dtypes", "f16"], "names no workload of --dtypes f16"),
    ],
)
def test_bad_options_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_suite.parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def report_text(results, tmp_path) -> str:
    gpu_suite.write_report(results, "Test GPU", 3e12, "abc1234", tmp_path, quick=False)
    (path,) = tmp_path.iterdir()
    return path.read_text()


def f32_row():
    r = gpu_suite.Result("layernorm 8192x4096", "bw90", 0.1, 0.14, 0.094, 0.09, 1e-7)
    r.met = True
    return r


def test_report_of_fp32_rows_has_no_flops_column(tmp_path):
    text = report_text([f32_row()], tmp_path)
    assert "queued first so the host runs ahead; fp32; every tgc result" in text
    assert "TFLOP/s" not in text
    assert "| layernorm 8192x4096 | 0.1000 ms (90%) | 0.1400 ms (64%) |" in text


def test_report_of_low_precision_rows(tmp_path):
    """bf16/f16 rows: the TFLOP/s column (tgc / eager / compile), their checks' tolerance, a
    method line that does not call them fp32, "-" for a row with no target."""
    (attn, *_) = gpu_suite.low_precision_workloads("attn", "f16", quick=False)
    low = gpu_suite.Result(attn.name, attn.target, 2.0, 1.0, 0.5, None, 1e-3, None)
    low.flops, low.dtype = 1e12, "f16"
    gemm = gpu_suite.Result("GEMM bf16", "le_eager", 1.0, 2.0, None, error=1e-2)
    gemm.flops, gemm.dtype, gemm.met = 4e12, "bf16", gpu_suite.judge(gemm, 3e12)
    text = report_text([f32_row(), low, gemm], tmp_path)
    assert "fp32, except the rows named bf16 or f16 (both sides in that type" in text
    assert "within 0.02 for bf16, 0.005 for f16" in text
    assert "| floor | TFLOP/s: tgc / eager / compile | target |" in text
    assert "| - | >= 90% of copy bandwidth | met |" in text  # fp32 row: no flops
    assert f"| {attn.name} | 2.0000 ms | 1.0000 ms | 0.5000 ms | - | 500 / 1000 / 2000 |" in text
    assert "| none (reported) | - | 1.0e-03 |" in text
    assert "| 4000 / 2000 / - | at least as fast as eager | met |" in text


@pytest.mark.parametrize(
    ("target", "tgc", "eager", "compiled", "met"),
    [
        ("beat_eager_le_compile", 1.0, 1.1, 1.0, True),
        ("beat_eager_le_compile", 1.0, 1.1, 0.99, False),
        ("beat_eager_le_compile", 1.0, 1.0, 1.2, False),
        ("beat_eager_le_compile", 1.0, 1.1, None, False),
        ("sdpa80", 1.0, 0.8, None, True),
        ("sdpa80", 1.0, 0.79, None, False),
        ("beat_eager", 1.0, 1.01, None, True),
        ("beat_eager", 1.0, 1.0, None, False),
        ("le_compile", 1.0, 2.0, 1.0, True),
        ("le_compile", 1.0, 0.5, 0.99, False),
        ("le_compile", 1.0, 2.0, None, False),
        ("none", 5.0, 1.0, None, None),
        ("none", None, 1.0, None, None),
        ("sdpa80", None, 1.0, None, False),
    ],
)
def test_judge_new_targets(target, tgc, eager, compiled, met):
    res = gpu_suite.Result("row", target, tgc, eager, compiled)
    assert gpu_suite.judge(res, 3e12) is met


def test_a_target_is_judged_on_either_route_and_the_report_names_the_one_that_met_it(tmp_path):
    """The route with nothing measured misses torch.compile and auto beats it: "met by auto"; a
    row that both miss stays "missed"."""
    res = gpu_suite.Result("GPT-2 block bf16", "beat_eager_le_compile", 0.38, 0.48, 0.32)
    res.auto_ms = 0.30
    assert gpu_suite.judge(res, 3e12) is False
    assert gpu_suite.judge(res, 3e12, res.auto_ms) is True
    assert res.tgc_ms == 0.38  # judging auto's time leaves the row as it was
    res.met, res.met_auto = False, True
    both = gpu_suite.Result("attention", "sdpa80", 0.30, 0.18, 0.18)
    both.auto_ms = 0.29
    both.met, both.met_auto = False, gpu_suite.judge(both, 3e12, both.auto_ms)
    text = report_text([res, both], tmp_path)
    assert "| faster than eager, at least as fast as torch.compile | met by auto |" in text
    assert "| missed |" in text and both.met_auto is False


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize(("kind", "dtype"), ALL_ROWS)
def test_torch_side_inputs_and_results_fit_the_text(kind, dtype, quick):
    """Each row's PyTorch inputs are the tgc function's arguments (shape, type, order: the
    route takes them as they are) and PyTorch's results have its result types, at the
    sizes the GPU run uses (on torch's meta device: shapes only, nothing computed)."""
    torch = pytest.importorskip("torch")
    run = gpu_suite.LowPrecisionRun(dtype, None, False, {}, device="meta")
    for w in gpu_suite.low_precision_workloads(kind, dtype, quick):
        fn, inputs = gpu_suite.TORCH_SIDES[w.kind](run, *w.shape)
        (func,) = parse_module(w.text).funcs
        args = [a.type for a in func.body.args]
        assert [(tuple(x.shape), x.dtype) for x in inputs] == [
            (t.shape, gpu_suite.torch_dtype(t.element_type)) for t in args
        ], w.name
        outs = fn(*inputs)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        assert [(tuple(x.shape), x.dtype) for x in outs] == [
            (t.shape, gpu_suite.torch_dtype(t.element_type)) for t in func.function_type.results
        ], w.name
        assert torch.device("meta") == inputs[0].device

"""The GPU benchmark of issues 4 and 8: tgc against PyTorch eager, torch.compile and the floor.

Run on a GPU machine (PyTorch, PyCUDA and nvcc there), from the repository root:

    python3 bench/gpu_suite.py [--quick] [--only NAME,...] [--dtypes f32,bf16,f16] [--commit HASH]
        [--out bench/results] [--no-compile]

For each workload: inputs drawn once on the GPU; tgc, PyTorch eager and torch.compile run on one
stream. tgc is the GPU route (`tgc-run --backend cuda`, planner/route.py) with `--no-measure` on
an empty database: the plan of the default cost source, checked whole against the plan of
library kernels alone, as the route plans where nothing has been measured yet. Each is timed
by CUDA events around every repetition, after warm-up, with a sleep kernel queued first so
that the host enqueues ahead of the GPU; the median is reported. Every tgc result is
checked against PyTorch's before its time is kept. The floor is the bytes that must move (each
input read once, each output written once) over the device-to-device copy bandwidth measured in
the same run. Writes bench/results/<device>-<date>.md with the device, date and commit, and
each target of the issue marked met or missed.

The fp32 rows (issue 4) are memory-bound kernels, two matmuls and the GPT-2 block. The bf16 and
f16 rows (issue 8; `--dtypes bf16,f16` runs only these) are compute-bound and report TFLOP/s:
the GPT-2 block, attention (`hl.attention` against `F.scaled_dot_product_attention`) at
B8 H16 S2048 D64 and B4 H32 S4096 D128, causal and not, the Q/K/V projection with parameter
weights under `-p optimize`, a GEMM with bias and GELU, and MLP blocks with their residual
(SwiGLU at two Llama widths, GPT-2's). `--only` names: gelu64M, gelu16M, softmax4096,
softmax16384, layernorm, matmuls, gpt2 (fp32); gpt2_T, attn_T, qkv_T, gemm_gelu_T, mlp_T for T in
bf16, f16. test/test_bench_gpu_suite.py checks the workloads on the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass
class Result:
    name: str
    target: str
    tgc_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    floor_ms: float | None = None
    error: float | None = None
    met: bool | None = None  # the target, by the route with nothing measured
    met_auto: bool | None = None  # ... by --backend auto (where it ran)
    note: str = ""
    kernels: list[str] = field(default_factory=list)
    auto_ms: float | None = None  # --backend auto on the defaults' measurements
    tuned_ms: float | None = None  # ... after tgc-profile --tune
    auto_plan: str = ""
    tuned_plan: str = ""
    flops: float | None = None  # compute-bound rows: the flops of one call, for TFLOP/s
    dtype: str = "f32"


def time_ms(fn, stream, reps: int = 30, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)  # ~10 ms: the host gets ahead of the GPU
        for s, e in zip(starts, ends):
            s.record(stream)
            fn()
            e.record(stream)
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_region_kernel(kernel, inputs: list, out, want) -> tuple[float, float]:
    """(median ms, error) of a tgc region kernel (a KernelSource) launched directly through
    PyCUDA on the legacy default stream (PyTorch's current stream in the bench scripts, as the
    executor launches) on the torch tensors `inputs` into `out`, filled with NaN first; the
    error is max |out - want| / max |want| against `want` (f64), NaN where an element of `out`
    was not written."""
    import torch

    from tgc.runtime.cuda_compile import load_kernels
    from tgc.runtime.tensor_map import kernel_arguments

    (fn,) = load_kernels([kernel])
    out.fill_(float("nan"))
    arguments = kernel_arguments(kernel, [x.data_ptr() for x in (*inputs, out)])

    def launch():
        fn.prepared_async_call(
            kernel.grid, kernel.block, None, *arguments, shared_size=kernel.shared_bytes
        )

    launch()
    torch.cuda.synchronize()
    got = out.double()
    error = float((got - want).abs().max() / want.abs().max())
    if torch.isnan(got).any():
        error = float("nan")
    return time_ms(launch, torch.cuda.current_stream()), error


def copy_bandwidth(stream) -> float:
    """Bytes read plus written per second by a large device-to-device copy."""
    import torch

    n = 1 << 28  # 1 GiB of f32
    a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    with torch.cuda.stream(stream):
        ms = time_ms(lambda: b.copy_(a), stream, reps=20)
    return 2 * n * 4 / (ms * 1e-3)


def tgc_program(text: str, pipeline: str = ""):
    """The GPU route's compiled function of `text` (after `pipeline`, else lower-for-planning,
    as tgc-run --backend cuda -p does) with `--no-measure` on an empty database: the default
    cost source's plan, checked whole against the library plan (module doc)."""
    import tempfile

    import tgc
    from tgc.pass_manager import PassManager
    from tgc.planner.route import RouteOptions, compile_function

    tgc.load_all()
    module = tgc.parse(text)
    PassManager.from_text(pipeline or "lower-for-planning").run(module)
    with tempfile.TemporaryDirectory() as tmp:
        options = RouteOptions(db=str(Path(tmp) / "empty.sqlite"), measure=False, progress=False)
        return compile_function(module.funcs[0], options)


def generated_plan(text: str, params: dict | None = None, arch: str | None = None):
    """`text` (after lower-for-planning) planned for the GPU on tgc's generated kernels alone
    (no cuBLAS, cuBLASLt or PyTorch: what a benchmark of the templates runs), every generated
    kernel made with the template defaults for a GPU of `arch` (None: any sm_80 or later) and
    `params` over them. No GPU needed; on one, run it with `PlannedFunction` (after
    `load_backends(("cuda",))`)."""
    import tgc
    from tgc.pass_manager import PassManager
    from tgc.planner.backends.cuda_kernels import planning_kernels
    from tgc.planner.standalone import plan_standalone, set_template_params

    tgc.load_all()
    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    with planning_kernels(arch):
        plan_standalone(func, libraries=False)
    set_template_params(func, {"arch": arch, **(params or {})} if arch else dict(params or {}))
    return func


def callees(func) -> list[str]:
    """The kernels a planned function calls, in order."""
    return [
        str(op.attributes.get("callee") or op.name)
        for op in func.body.ops
        if op.name in ("kernel.call", "kernel.copy")
    ]


# -- --backend auto: tgc-profile, then select-kernels on the measurements (issue 7, item 6) ---------

AUTO_BACKENDS = ("cuda", "torch")  # the GPU's kernels: inputs and results live on the device


def on_device(text: str) -> str:
    """`text` with its values in device memory (every tensor type but a constant attribute's):
    the plan keeps the arguments and results there, as the GPU route does, and
    places the rest as it finds fastest."""
    import re

    return re.sub(r"(?<!> : )tensor<([^>]*)>", r'tensor<\1, "cuda">', text)


def profile_workload(path: Path, db: Path, pipeline: str, budget: float, tune: bool) -> str:
    """Run tgc-profile on the workload (a separate process, as a user would); its summary."""
    import subprocess

    cmd = [sys.executable, "-m", "tgc.tools.profile", str(path), "--db", str(db), "--quiet"]
    cmd += ["--planner-backends", ",".join(AUTO_BACKENDS), "--budget", str(budget)]
    cmd += ["-p", pipeline] if pipeline else []
    cmd += ["--tune"] if tune else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return lines[-1] if lines else f"tgc-profile exited {proc.returncode}"


def auto_plan(text: str, pipeline: str, db: Path):
    """The function select-kernels plans from the database (the route of tgc-run --backend
    auto --db DB --planner-backends cuda,torch, after `pipeline`; without one, tgc-run's
    default, lower-for-planning, which tgc-profile profiles too)."""
    import tgc
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.planner import load_backends
    from tgc.planner.select import with_backends, with_database
    from tgc.tools.run import AUTO_PIPELINE

    tgc.load_all()
    load_backends(AUTO_BACKENDS, required=True)
    passes = parse_pipeline(f"{pipeline},select-kernels" if pipeline else AUTO_PIPELINE)
    module = parse_module(text)
    PassManager(with_backends(with_database(passes, str(db)), AUTO_BACKENDS)).run(module)
    return module.funcs[0]


def plan_summary(func) -> str:
    from collections import Counter

    calls = Counter()
    sources = Counter()
    for op in func.body.ops:
        if op.name in ("kernel.call", "kernel.copy"):
            calls[str(op.attributes.get("callee") or op.name)] += 1
            sources[str(op.attributes.get("plan.source") or "?").strip('"')] += 1
    listed = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in calls.items())
    return f"{listed} (costs: {', '.join(f'{n} {c}' for n, c in sources.items())})"


def bench_auto(
    res: Result, text, pipeline, inputs, want, stream, db: Path, tol, budget, tune_budget
) -> None:
    """Profile, plan and time the auto route, first on the defaults, then after --tune (with
    `tune_budget` seconds; none: no tuning)."""
    import tempfile

    from tgc.planner.executor import PlannedFunction

    device_text = on_device(text)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "workload.tg"
        path.write_text(device_text)
        for tune in (False, True) if tune_budget > 0 else (False,):
            summary = profile_workload(path, db, pipeline, tune_budget if tune else budget, tune)
            print(f"  {res.name} [tgc-profile{' --tune' if tune else ''}]: {summary}", flush=True)
            func = PlannedFunction(auto_plan(device_text, pipeline, db))
            outs = func(list(inputs))
            err = results_error([checked_result(o) for o in outs], want)
            label = "auto tuned" if tune else "auto"
            if not err <= tol:
                res.note += f" [{label}: differs from PyTorch by {err:.2e}, tolerance {tol:g}]"
                continue
            ms = time_ms(lambda: func(list(inputs)), stream)
            print(f"  {res.name} [{label}]: {ms:.4f} ms", flush=True)
            if tune:
                res.tuned_ms, res.tuned_plan = ms, plan_summary(func.func)
            else:
                res.auto_ms, res.auto_plan = ms, plan_summary(func.func)


def checked_result(value):
    """A planned function's result (in device memory) as a torch tensor to check: through the
    host, since torch reads no bf16 from a `__cuda_array_interface__` (numpy has no bf16)."""
    import torch

    from tgc.planner.backends import SPACES

    return torch.from_numpy(torch_storable(SPACES["cuda"].to_host(value))).cuda()


def torch_storable(a):
    """A downloaded result as an array torch.from_numpy takes: bf16 (ml_dtypes) as f32."""
    import numpy as np

    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def rel_error(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / max(want.abs().max().item(), 1e-30))


def results_error(outs, want) -> float:
    """rel_error of each result against PyTorch's (a tensor, or a tuple of them); the largest."""
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    if len(outs) != len(wants):
        return float("inf")
    return max(rel_error(o, w) for o, w in zip(outs, wants))


def bench_one(
    res: Result,
    text: str,
    torch_fn,
    inputs,
    stream,
    pipeline="",
    nbytes=None,
    bandwidth=None,
    do_compile=True,
    tol=2e-4,
    auto_db: Path | None = None,
    auto_budget: float = 60.0,
    auto_tune_budget: float = 60.0,
):
    import torch

    torch_stream = torch.cuda.current_stream()
    program = tgc_program(text, pipeline)
    with torch.cuda.stream(torch_stream):
        want = torch_fn(*inputs)
        torch.cuda.synchronize()
        outs = program(list(inputs))
        err = results_error([checked_result(o) for o in outs], want)
    if err <= tol:
        res.tgc_ms = time_ms(lambda: program(list(inputs)), torch_stream)
        res.error, res.kernels = err, callees(program.func)
        print(f"  {res.name} [route]: {res.tgc_ms:.4f} ms; {program.report.summary()}", flush=True)
    else:
        res.note += f" [route: differs from PyTorch by {err:.2e}, tolerance {tol:g}]"
    if auto_db is not None:
        with torch.cuda.stream(torch_stream):
            want = torch_fn(*inputs)
            bench_auto(
                res,
                text,
                pipeline,
                inputs,
                want,
                torch_stream,
                auto_db,
                tol,
                auto_budget,
                auto_tune_budget,
            )
    with torch.cuda.stream(torch_stream):
        res.eager_ms = time_ms(lambda: torch_fn(*inputs), torch_stream)
        if do_compile:
            try:
                compiled = torch.compile(torch_fn)
                compiled(*inputs)
                res.compile_ms = time_ms(lambda: compiled(*inputs), torch_stream)
            except Exception as e:  # noqa: BLE001  (report whatever torch.compile raises, go on)
                res.note += f" torch.compile failed: {type(e).__name__}: {str(e)[:200]}"
    if nbytes is not None and bandwidth:
        res.floor_ms = nbytes / bandwidth * 1e3


# -- workloads --------------------------------------------------------------------------------------


def gelu_scale_text(n: int) -> str:
    return f"""func.func @gelu_scale(%x: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %g = hl.gelu %x {{approximate = "tanh"}} : (tensor<{n}xf32>) -> tensor<{n}xf32>
  %s = atomic.constant {{value = dense<1.702> : tensor<f32>}} : () -> tensor<f32>
  %y = atomic.mul %g, %s : (tensor<{n}xf32>, tensor<f32>) -> tensor<{n}xf32>
  func.return %y : tensor<{n}xf32>
}}"""


def softmax_text(r: int, n: int) -> str:
    t = f"tensor<{r}x{n}xf32>"
    return f"""func.func @softmax(%x: {t}) -> {t} {{
  %y = hl.softmax %x {{axis = -1}} : ({t}) -> {t}
  func.return %y : {t}
}}"""


def layernorm_text(r: int, n: int) -> str:
    t, p = f"tensor<{r}x{n}xf32>", f"tensor<{n}xf32>"
    return f"""func.func @layernorm(%x: {t}, %g: {p}, %b: {p}) -> {t} {{
  %y = hl.layernorm %x, %g, %b {{eps = 1.0e-05}} : ({t}, {p}, {p}) -> {t}
  func.return %y : {t}
}}"""


def two_matmuls_text(n: int) -> str:
    t = f"tensor<{n}x{n}xf32>"
    return f"""func.func @two_matmuls(%a: {t}, %b: {t}, %c: {t}) -> {t} {{
  %ab = atomic.matmul %a, %b : ({t}, {t}) -> {t}
  %ac = atomic.matmul %a, %c : ({t}, {t}) -> {t}
  %y = atomic.add %ab, %ac : ({t}, {t}) -> {t}
  func.return %y : {t}
}}"""


def gpt2_text(b: int, s: int, d: int = 768, h: int = 12, dtype: str = "f32") -> str:
    """GPT-2's transformer block on `b` x `s` tokens, every value of element type `dtype`."""
    hd, t, e = d // h, b * s, dtype
    x, v, w3, v3 = (
        f"tensor<{t}x{d}x{e}>",
        f"tensor<{d}x{e}>",
        f"tensor<{d}x{3 * d}x{e}>",
        f"tensor<{3 * d}x{e}>",
    )
    wo, w4, v4, w4t = (
        f"tensor<{d}x{d}x{e}>",
        f"tensor<{d}x{4 * d}x{e}>",
        f"tensor<{4 * d}x{e}>",
        f"tensor<{4 * d}x{d}x{e}>",
    )
    heads = f"tensor<{b}x{h}x{s}x{hd}x{e}>"
    split = f"tensor<{b}x{s}x{h}x{hd}x{e}>"
    qkv = f"tensor<{t}x{3 * d}x{e}>"
    fc = f"tensor<{t}x{4 * d}x{e}>"
    lines = [
        f"func.func @gpt2_block(%x: {x}, %ln1_g: {v}, %ln1_b: {v}, %w_qkv: {w3}, %b_qkv: {v3}, %w_o: {wo}, %b_o: {v}, %ln2_g: {v}, %ln2_b: {v}, %w_fc: {w4}, %b_fc: {v4}, %w_proj: {w4t}, %b_proj: {v}) -> {x} {{",
        f"  %h = hl.layernorm %x, %ln1_g, %ln1_b {{eps = 1.0e-05}} : ({x}, {v}, {v}) -> {x}",
        f"  %qkv = hl.linear %h, %w_qkv, %b_qkv : ({x}, {w3}, {v3}) -> {qkv}",
        f"  %q, %k, %v = atomic.split %qkv {{axis = 1, sizes = [{d}, {d}, {d}]}} : ({qkv}) -> ({x}, {x}, {x})",
    ]
    for name in "qkv":
        lines += [
            f"  %{name}4 = atomic.reshape %{name} : ({x}) -> {split}",
            f"  %{name}h = atomic.transpose %{name}4 {{perm = [0, 2, 1, 3]}} : ({split}) -> {heads}",
        ]
    lines += [
        f"  %att = hl.attention %qh, %kh, %vh {{causal = true}} : ({heads}, {heads}, {heads}) -> {heads}",
        f"  %att_t = atomic.transpose %att {{perm = [0, 2, 1, 3]}} : ({heads}) -> {split}",
        f"  %att_m = atomic.reshape %att_t : ({split}) -> {x}",
        f"  %o = hl.linear %att_m, %w_o, %b_o : ({x}, {wo}, {v}) -> {x}",
        f"  %x1 = atomic.add %x, %o : ({x}, {x}) -> {x}",
        f"  %h2 = hl.layernorm %x1, %ln2_g, %ln2_b {{eps = 1.0e-05}} : ({x}, {v}, {v}) -> {x}",
        f"  %fc = hl.linear %h2, %w_fc, %b_fc : ({x}, {w4}, {v4}) -> {fc}",
        f'  %act = hl.gelu %fc {{approximate = "tanh"}} : ({fc}) -> {fc}',
        f"  %mlp = hl.linear %act, %w_proj, %b_proj : ({fc}, {w4t}, {v}) -> {x}",
        f"  %y = atomic.add %x1, %mlp : ({x}, {x}) -> {x}",
        f"  func.return %y : {x}",
        "}",
    ]
    return "\n".join(lines)


def gpt2_flops(b: int, s: int, d: int = 768, h: int = 12) -> float:
    """The block's multiply-adds x 2: its four GEMMs (2 T d (3d + d + 4d + 4d)) and causal
    attention (half of 4 b h s^2 (d / h))."""
    return 2.0 * b * s * 12 * d * d + attention_flops(b, h, s, d // h, causal=True)


def gpt2_torch(b: int, s: int, d: int = 768, h: int = 12, dtype: str = "f32", device="cuda"):
    import torch
    import torch.nn.functional as F

    def block(x, ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
        hh = F.layer_norm(x, (d,), ln1_g, ln1_b, 1e-5)
        qkv = hh @ w_qkv + b_qkv
        q, k, v = qkv.split(d, dim=1)
        q, k, v = (z.reshape(b, s, h, d // h).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = att.transpose(1, 2).reshape(b * s, d)
        x1 = x + (att @ w_o + b_o)
        h2 = F.layer_norm(x1, (d,), ln2_g, ln2_b, 1e-5)
        return x1 + (F.gelu(h2 @ w_fc + b_fc, approximate="tanh") @ w_proj + b_proj)

    t = b * s
    g = seeded_generator(device)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, device=device, generator=g) * scale

    inputs = [
        rnd(t, d),
        1 + 0.1 * rnd(d),
        0.1 * rnd(d),
        rnd(d, 3 * d, scale=d**-0.5),
        0.1 * rnd(3 * d),
        rnd(d, d, scale=d**-0.5),
        0.1 * rnd(d),
        1 + 0.1 * rnd(d),
        0.1 * rnd(d),
        rnd(d, 4 * d, scale=d**-0.5),
        0.1 * rnd(4 * d),
        rnd(4 * d, d, scale=(4 * d) ** -0.5),
        0.1 * rnd(d),
    ]
    # The same values for every type, drawn in f32 and rounded (f32's are kept as they were).
    return block, [z.to(torch_dtype(dtype)) for z in inputs]


# -- bf16 and f16 workloads (issue 8, item 4) -------------------------------------------------------

DTYPES = ("f32", "bf16", "f16")
LOW_DTYPES = ("bf16", "f16")

# Max error relative to the largest |PyTorch result| accepted for the bf16 and f16 rows. bf16
# keeps 8 significant bits (unit roundoff u = 2^-8 = 3.9e-3), f16 11 (u = 2^-11 = 4.9e-4).
# Both sides round every stored value to the type, but not at the same points: eager rounds
# each op's result (the GEMM's before the bias, the sum before GELU), tgc's fused kernels keep
# f32 in registers and round once, and cuBLAS/SDPA sum in their own order; a block compounds
# that over a dozen ops (the bf16 GPT-2 block was 4.1e-3 off PyTorch's in relative Frobenius
# norm on an H100, bench/results/attention_tc-NVIDIA-H100-80GB-HBM3-2026-11-23.md). 2e-2 is 5u
# of bf16 and 5e-3 10u of f16 (f16 errs less, but SDPA and cuBLAS still round P and partial
# sums to it): room for that, while a wrong kernel (a missed mask, a lost tile) errs by O(1).
LOW_PRECISION_TOL = {"bf16": 2e-2, "f16": 5e-3}

# (B, H, S, D) of the attention rows: the shapes of issue 8 (bench/attention_tc.py's too).
ATTENTION_SHAPES = [(8, 16, 2048, 64), (4, 32, 4096, 128)]


def seeded_generator(device: str):
    """A generator seeded 0 on `device`; None on "meta" (shapes only: nothing is drawn)."""
    import torch

    return None if device == "meta" else torch.Generator(device=device).manual_seed(0)


def torch_dtype(dtype: str):
    import torch

    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]


def attention_text(b: int, h: int, s: int, d: int, causal: bool, dtype: str) -> str:
    """`hl.attention` on (B, H, S, D) q, k, v (SDPA's layout), causal or not."""
    t = f"tensor<{b}x{h}x{s}x{d}x{dtype}>"
    attrs = " {causal = true}" if causal else ""
    return (
        f"func.func @attention(%q: {t}, %k: {t}, %v: {t}) -> {t} {{\n"
        f"  %y = hl.attention %q, %k, %v{attrs} : ({t}, {t}, {t}) -> {t}\n"
        f"  func.return %y : {t}\n}}"
    )


def attention_flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    """4 B H S^2 D (Q K^T and P V, a multiply-add 2 flops), half of it under a causal mask."""
    full = 4.0 * b * h * s * s * d
    return full / 2 if causal else full


def qkv_text(t: int, d: int, dtype: str) -> str:
    """Q, K and V of `t` tokens: three matmuls sharing x, their weights parameters, the three
    products returned. `-p optimize` stacks them (passes/algebraic, `stack-shared-matmuls`): one
    batched GEMM with x shared, the weights packed once, q, k and v returned as contiguous views
    of its product. (The concat merge would copy each returned piece out.) The merged GEMM whose
    pieces attention reads in place is the GPT-2 block's."""
    x, w = f"tensor<{t}x{d}x{dtype}>", f"tensor<{d}x{d}x{dtype}>"
    lines = [
        f"func.func @qkv(%x: {x}, %wq: {w} {{tgc.param}}, %wk: {w} {{tgc.param}}, %wv: {w} {{tgc.param}}) -> ({x}, {x}, {x}) {{"
    ]
    lines += [f"  %{n} = atomic.matmul %x, %w{n} : ({x}, {w}) -> {x}" for n in "qkv"]
    lines += [f"  func.return %q, %k, %v : {x}, {x}, {x}", "}"]
    return "\n".join(lines)


def gemm_gelu_text(m: int, k: int, n: int, dtype: str) -> str:
    """GELU(tanh) of x w + b: the GEMM with a bias and GELU epilogue (GPT-2's MLP up)."""
    x, w, b, y = (
        f"tensor<{m}x{k}x{dtype}>",
        f"tensor<{k}x{n}x{dtype}>",
        f"tensor<{n}x{dtype}>",
        f"tensor<{m}x{n}x{dtype}>",
    )
    return f"""func.func @gemm_gelu(%x: {x}, %w: {w}, %b: {b}) -> {y} {{
  %y = hl.linear %x, %w, %b : ({x}, {w}, {b}) -> {y}
  %g = hl.gelu %y {{approximate = "tanh"}} : ({y}) -> {y}
  func.return %g : {y}
}}"""


def swiglu_mlp_text(t: int, d: int, f: int, dtype: str) -> str:
    """A Llama-family MLP with its residual: x + (silu(x wg) * (x wu)) wd, the weights
    parameters. lower-for-planning packs wg and wu once into one GEMM (stack-shared-matmuls),
    so the block is that GEMM, one elementwise kernel reading its two halves, and the down
    GEMM with the residual add."""
    x, w, wd, h = (
        f"tensor<{t}x{d}x{dtype}>",
        f"tensor<{d}x{f}x{dtype}>",
        f"tensor<{f}x{d}x{dtype}>",
        f"tensor<{t}x{f}x{dtype}>",
    )
    return f"""func.func @swiglu_mlp(%x: {x}, %wg: {w} {{tgc.param}}, %wu: {w} {{tgc.param}}, %wd: {wd} {{tgc.param}}) -> {x} {{
  %g = atomic.matmul %x, %wg : ({x}, {w}) -> {h}
  %u = atomic.matmul %x, %wu : ({x}, {w}) -> {h}
  %s = hl.silu %g : ({h}) -> {h}
  %a = atomic.mul %s, %u : ({h}, {h}) -> {h}
  %y = atomic.matmul %a, %wd : ({h}, {wd}) -> {x}
  %r = atomic.add %x, %y : ({x}, {x}) -> {x}
  func.return %r : {x}
}}"""


def gpt2_mlp_text(t: int, d: int, dtype: str) -> str:
    """GPT-2's MLP with its residual: x + gelu_tanh(x w_fc + b_fc) w_proj + b_proj (4d wide)."""
    x, w, wt, v, v4, h = (
        f"tensor<{t}x{d}x{dtype}>",
        f"tensor<{d}x{4 * d}x{dtype}>",
        f"tensor<{4 * d}x{d}x{dtype}>",
        f"tensor<{d}x{dtype}>",
        f"tensor<{4 * d}x{dtype}>",
        f"tensor<{t}x{4 * d}x{dtype}>",
    )
    return f"""func.func @gpt2_mlp(%x: {x}, %w_fc: {w} {{tgc.param}}, %b_fc: {v4} {{tgc.param}}, %w_proj: {wt} {{tgc.param}}, %b_proj: {v} {{tgc.param}}) -> {x} {{
  %fc = hl.linear %x, %w_fc, %b_fc : ({x}, {w}, {v4}) -> {h}
  %act = hl.gelu %fc {{approximate = "tanh"}} : ({h}) -> {h}
  %mlp = hl.linear %act, %w_proj, %b_proj : ({h}, {wt}, {v}) -> {x}
  %y = atomic.add %x, %mlp : ({x}, {x}) -> {x}
  func.return %y : {x}
}}"""


# --only's names: the fp32 rows, then each bf16/f16 workload as `<workload>_<dtype>`.
F32_WORKLOADS = (
    "gelu64M",
    "gelu16M",
    "softmax4096",
    "softmax16384",
    "layernorm",
    "matmuls",
    "gpt2",
)
LOW_WORKLOADS = ("gpt2", "attn", "qkv", "gemm_gelu", "mlp")


def workload_names(dtypes) -> list[str]:
    """The names --only takes for the rows of `dtypes`, in the order the suite runs them."""
    names = list(F32_WORKLOADS) if "f32" in dtypes else []
    return names + [f"{w}_{dt}" for dt in LOW_DTYPES if dt in dtypes for w in LOW_WORKLOADS]


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked (before torch is imported: --help and errors need no GPU); sets
    `args.selected`, the names of the workloads to run."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, no torch.compile")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated workload names: "
        + ", ".join(F32_WORKLOADS)
        + " (fp32); gpt2_T, attn_T, qkv_T, gemm_gelu_T, mlp_T for T bf16 or f16",
    )
    ap.add_argument(
        "--dtypes",
        default=",".join(DTYPES),
        help="comma-separated element types of the rows to run (default %(default)s)",
    )
    ap.add_argument("--commit", default=os.environ.get("TGC_COMMIT", "unknown"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument(
        "--auto",
        metavar="DB",
        default=None,
        help="also time --backend auto (tgc-profile into DB, then --tune, select-kernels)",
    )
    ap.add_argument("--auto-budget", type=float, default=60.0, help="tgc-profile's --budget")
    ap.add_argument(
        "--auto-tune-budget",
        type=float,
        default=None,
        help="tgc-profile --tune's --budget (default: --auto-budget; 0: no tuning)",
    )
    args = ap.parse_args(argv)
    dtypes = [dt for dt in args.dtypes.split(",") if dt]
    for dt in dtypes:
        if dt not in DTYPES:
            ap.error(f"--dtypes: unknown element type '{dt}' (known: {', '.join(DTYPES)})")
    only = [name for name in args.only.split(",") if name]
    known = workload_names(DTYPES)
    for name in only:
        if name not in known:
            ap.error(f"--only: unknown workload '{name}' (known: {', '.join(known)})")
    args.selected = [n for n in workload_names(dtypes) if not only or n in only]
    if not args.selected:
        ap.error(f"--only {args.only} names no workload of --dtypes {args.dtypes}")
    return args


@dataclass
class Workload:
    """One bf16/f16 row's tgc side, made without torch (a CPU test plans each at full size)."""

    kind: str  # its --only name less the type: gpt2, attn, qkv, gemm_gelu
    name: str
    target: str
    text: str
    flops: float
    shape: tuple  # what its PyTorch side (TORCH_SIDES[kind]) takes
    pipeline: str = ""
    note: str = ""


def low_precision_workloads(kind: str, dtype: str, quick: bool) -> list[Workload]:
    """The rows of workload `kind` in `dtype` (issue 8's sizes; smaller for --quick)."""
    return WORKLOADS_OF[kind](dtype, quick)


def gpt2_workloads(dtype: str, quick: bool) -> list[Workload]:
    b, s = (8, 1024) if not quick else (2, 256)
    name = f"GPT-2 block {dtype}, batch {b} x {s} tokens"
    text, flops = gpt2_text(b, s, dtype=dtype), gpt2_flops(b, s)
    return [Workload("gpt2", name, "beat_eager_le_compile", text, flops, (b, s))]


def qkv_workloads(dtype: str, quick: bool) -> list[Workload]:
    t, d = (8192, 768) if not quick else (1024, 768)
    name = f"QKV projection {dtype}, {t}x{d} @ 3 x {d}x{d} parameters"
    note = "pipeline 'optimize'; weights {tgc.param}; stacked: one batched GEMM, q, k, v returned as views"
    text, flops = qkv_text(t, d, dtype), 3 * 2.0 * t * d * d
    row = Workload("qkv", name, "beat_eager", text, flops, (t, d), "optimize", note=note)
    return [row]


def gemm_gelu_workloads(dtype: str, quick: bool) -> list[Workload]:
    m, k, n = (8192, 768, 3072) if not quick else (1024, 768, 3072)
    name = f"GEMM + bias + GELU(tanh) {dtype}, {m}x{k} @ {k}x{n}"
    text, flops = gemm_gelu_text(m, k, n, dtype), 2.0 * m * n * k
    return [Workload("gemm_gelu", name, "le_eager", text, flops, (m, k, n))]


# (tokens, model width, SwiGLU width) of the MLP rows: TinyLlama-1.1B's and Llama-2-7B's widths
SWIGLU_SHAPES = [(8192, 2048, 5632), (4096, 4096, 11008)]


def mlp_workloads(dtype: str, quick: bool) -> list[Workload]:
    """The SwiGLU MLP at two Llama widths and GPT-2 small's MLP, each with its residual (issue
    24's "at least as fast as torch.compile's")."""
    rows = []
    for t, d, f in SWIGLU_SHAPES:
        t = t if not quick else t // 8
        name = f"SwiGLU MLP {dtype}, {t} tokens, {d} -> 2 x {f} -> {d}, + x"
        text, flops = swiglu_mlp_text(t, d, f, dtype), 2.0 * t * d * f * 3
        rows.append(Workload("mlp", name, "le_compile", text, flops, ("swiglu", t, d, f)))
    t, d = (8192, 768) if not quick else (1024, 768)
    name = f"GPT-2 MLP {dtype}, {t} tokens, {d} -> {4 * d} (bias, GELU tanh) -> {d} (bias), + x"
    text, flops = gpt2_mlp_text(t, d, dtype), 2.0 * t * d * 4 * d * 2
    rows.append(Workload("mlp", name, "le_compile", text, flops, ("gpt2", t, d, 4 * d)))
    return rows


def attention_workloads(dtype: str, quick: bool) -> list[Workload]:
    """Both shapes, causal and not."""
    rows = []
    for i, (b, h, s, d) in enumerate(ATTENTION_SHAPES):
        if quick:
            b, s = max(1, b // 4), s // 4
        for causal in (True, False):
            # The issue's goal is causal bf16 at the first shape; the other rows are reported.
            target = "sdpa80" if causal and dtype == "bf16" and i == 0 else "none"
            name = f"attention B{b} H{h} S{s} D{d} {'causal' if causal else 'full'} {dtype}"
            text, flops = (
                attention_text(b, h, s, d, causal, dtype),
                attention_flops(b, h, s, d, causal),
            )
            rows.append(Workload("attn", name, target, text, flops, (b, h, s, d, causal)))
    return rows


WORKLOADS_OF = {
    "gpt2": gpt2_workloads,
    "attn": attention_workloads,
    "qkv": qkv_workloads,
    "gemm_gelu": gemm_gelu_workloads,
    "mlp": mlp_workloads,
}


@dataclass
class LowPrecisionRun:
    """What every bf16/f16 row of one run shares: its element type, the options, the seeded
    generator of its inputs."""

    dtype: str
    stream: object
    do_compile: bool
    auto: dict
    device: str = "cuda"  # a CPU test makes the inputs on "meta"
    gen: object = None

    def rnd(self, *shape, scale: float = 1.0):
        """N(0, scale^2) in the row's type (drawn in f32 on the device, then rounded)."""
        import torch

        if self.gen is None:
            self.gen = seeded_generator(self.device)
        x = torch.randn(*shape, device=self.device, generator=self.gen) * scale
        return x.to(torch_dtype(self.dtype))

    def bench(self, w: Workload) -> Result:
        """bench_one on `w` and its PyTorch side, within the type's tolerance."""
        res = Result(w.name, w.target, flops=w.flops, dtype=self.dtype)
        fn, inputs = TORCH_SIDES[w.kind](self, *w.shape)
        tol = LOW_PRECISION_TOL[self.dtype]
        bench_one(
            res,
            w.text,
            fn,
            inputs,
            self.stream,
            pipeline=w.pipeline,
            do_compile=self.do_compile,
            tol=tol,
            **self.auto,
        )
        res.note += f" {w.note}" if w.note else ""
        print(res, flush=True)
        return res


def bench_low_precision(dtype: str, args, stream, want, do_compile: bool, auto: dict) -> list:
    """The `dtype` (bf16 or f16) rows of issue 8 that `want` selects, each beside PyTorch eager
    and torch.compile in the same type, its results checked within LOW_PRECISION_TOL."""
    run = LowPrecisionRun(dtype, stream, do_compile, auto)
    return [
        run.bench(w)
        for kind in LOW_WORKLOADS
        if want(f"{kind}_{dtype}")
        for w in low_precision_workloads(kind, dtype, args.quick)
    ]


# The PyTorch side of each kind of workload: (its function, its inputs on the GPU).


def gpt2_side(run: LowPrecisionRun, b: int, s: int):
    return gpt2_torch(b, s, dtype=run.dtype, device=run.device)


def attention_side(run: LowPrecisionRun, b: int, h: int, s: int, d: int, causal: bool):
    return sdpa(causal), [run.rnd(b, h, s, d) for _ in range(3)]


def qkv_side(run: LowPrecisionRun, t: int, d: int):
    return three_gemms, [run.rnd(t, d)] + [run.rnd(d, d, scale=d**-0.5) for _ in range(3)]


def gemm_gelu_side(run: LowPrecisionRun, m: int, k: int, n: int):
    return gemm_bias_gelu, [run.rnd(m, k), run.rnd(k, n, scale=k**-0.5), run.rnd(n, scale=0.1)]


def mlp_side(run: LowPrecisionRun, form: str, t: int, d: int, f: int):
    x = run.rnd(t, d)
    if form == "swiglu":
        w_in = [run.rnd(d, f, scale=d**-0.5) for _ in range(2)]
        return swiglu_mlp, [x, *w_in, run.rnd(f, d, scale=f**-0.5)]
    w_fc, b_fc = run.rnd(d, f, scale=d**-0.5), run.rnd(f, scale=0.1)
    return gpt2_mlp, [x, w_fc, b_fc, run.rnd(f, d, scale=f**-0.5), run.rnd(d, scale=0.1)]


TORCH_SIDES = {
    "gpt2": gpt2_side,
    "attn": attention_side,
    "qkv": qkv_side,
    "gemm_gelu": gemm_gelu_side,
    "mlp": mlp_side,
}


def sdpa(causal: bool):
    """PyTorch's side of the attention rows (a named function: torch.compile compiles it)."""
    import torch.nn.functional as F

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return attention


def three_gemms(x, wq, wk, wv):
    return x @ wq, x @ wk, x @ wv


def gemm_bias_gelu(x, w, b):
    import torch.nn.functional as F

    return F.gelu(x @ w + b, approximate="tanh")


def swiglu_mlp(x, wg, wu, wd):
    import torch.nn.functional as F

    return x + (F.silu(x @ wg) * (x @ wu)) @ wd


def gpt2_mlp(x, w_fc, b_fc, w_proj, b_proj):
    import torch.nn.functional as F

    return x + F.gelu(x @ w_fc + b_fc, approximate="tanh") @ w_proj + b_proj


def main(argv=None) -> int:
    args = parse_args(argv)

    import torch
    import torch.nn.functional as F

    tune_budget = args.auto_budget if args.auto_tune_budget is None else args.auto_tune_budget
    auto = (
        {
            "auto_db": Path(args.auto),
            "auto_budget": args.auto_budget,
            "auto_tune_budget": tune_budget,
        }
        if args.auto
        else {}
    )
    do_compile = not (args.quick or args.no_compile)
    torch.manual_seed(0)
    stream = torch.cuda.current_stream()
    device = torch.cuda.get_device_name()
    bw = copy_bandwidth(stream)
    print(f"device {device}, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    results: list[Result] = []

    def want(name):
        return name in args.selected

    scale = 1.702
    for n, label, target in ((64 << 20, "gelu64M", "bw90"), (16 << 20, "gelu16M", "beat_compile")):
        if args.quick:
            n //= 16
        if not want(label):
            continue
        res = Result(f"gelu(tanh) x scale, {n >> 20}M", target)
        x = torch.randn(n, device="cuda")
        bench_one(
            res,
            gelu_scale_text(n),
            lambda x: F.gelu(x, approximate="tanh") * scale,
            [x],
            stream,
            nbytes=8 * n,
            bandwidth=bw,
            do_compile=do_compile,
            **auto,
        )
        results.append(res)
        print(res, flush=True)
        del x
    for r, n, label in ((4096, 4096, "softmax4096"), (16384, 1024, "softmax16384")):
        if args.quick:
            r //= 8
        if not want(label):
            continue
        res = Result(f"softmax {r}x{n}", "bw80_beat_both")
        x = torch.randn(r, n, device="cuda")
        bench_one(
            res,
            softmax_text(r, n),
            lambda x: torch.softmax(x, -1),
            [x],
            stream,
            nbytes=8 * r * n,
            bandwidth=bw,
            do_compile=do_compile,
            **auto,
        )
        results.append(res)
        print(res, flush=True)
    if want("layernorm"):
        r, n = (8192, 4096) if not args.quick else (1024, 4096)
        res = Result(f"layernorm {r}x{n}", "bw90")
        x, g, b = (
            torch.randn(r, n, device="cuda"),
            torch.randn(n, device="cuda"),
            torch.randn(n, device="cuda"),
        )
        bench_one(
            res,
            layernorm_text(r, n),
            lambda x, g, b: F.layer_norm(x, (n,), g, b, 1e-5),
            [x, g, b],
            stream,
            nbytes=8 * r * n + 8 * n,
            bandwidth=bw,
            do_compile=do_compile,
            **auto,
        )
        results.append(res)
        print(res, flush=True)
    if want("matmuls"):
        n = 4096 if not args.quick else 1024
        res = Result(f"A@B + A@C, {n}^2", "le2.9ms")
        a, b, c = (torch.randn(n, n, device="cuda") for _ in range(3))
        from tgc.pass_manager import PASSES

        pipeline = "optimize" if "optimize" in PASSES else ""
        bench_one(
            res,
            two_matmuls_text(n),
            lambda a, b, c: a @ b + a @ c,
            [a, b, c],
            stream,
            pipeline=pipeline,
            do_compile=do_compile,
            tol=1e-3,
            **auto,
        )
        res.note += f" pipeline '{pipeline or 'none'}'"
        results.append(res)
        print(res, flush=True)
    if want("gpt2"):
        bsz, seq = (8, 1024) if not args.quick else (2, 256)
        res = Result(f"GPT-2 block, batch {bsz} x {seq} tokens", "beat_compile")
        fn, inputs = gpt2_torch(bsz, seq)
        bench_one(
            res,
            gpt2_text(bsz, seq),
            fn,
            inputs,
            stream,
            do_compile=do_compile,
            tol=2e-3,
            **auto,
        )
        results.append(res)
        print(res, flush=True)
    for dtype in LOW_DTYPES:
        results += bench_low_precision(dtype, args, stream, want, do_compile, auto)

    for res in results:
        res.met = judge(res, bw)
        if res.auto_ms is not None:
            res.met_auto = judge(res, bw, res.auto_ms)
    write_report(results, device, bw, args.commit, Path(args.out), args.quick)
    return 0


def judge(res: Result, bw: float, ms: float | None = None) -> bool | None:
    """Whether `res` meets its target with tgc's time `ms` (default: the route's, nothing
    measured)."""
    if res.target == "none":
        return None
    ms = res.tgc_ms if ms is None else ms
    if ms is None:
        return False
    res = replace(res, tgc_ms=ms)
    frac = res.floor_ms / res.tgc_ms if res.floor_ms else None
    best_torch = min(x for x in (res.eager_ms, res.compile_ms) if x is not None)
    if res.target == "bw90":
        return frac is not None and frac >= 0.9
    if res.target == "bw80_beat_both":
        return frac is not None and frac >= 0.8 and res.tgc_ms < best_torch
    if res.target == "beat_compile":
        return res.compile_ms is not None and res.tgc_ms < res.compile_ms
    if res.target == "le2.9ms":
        return res.tgc_ms <= 2.9
    if res.target == "beat_eager_le_compile":
        faster = res.tgc_ms < res.eager_ms
        return faster and res.compile_ms is not None and res.tgc_ms <= res.compile_ms
    if res.target == "sdpa80":
        return res.eager_ms >= 0.8 * res.tgc_ms
    if res.target == "beat_eager":
        return res.tgc_ms < res.eager_ms
    if res.target == "le_eager":
        return res.tgc_ms <= res.eager_ms
    if res.target == "le_compile":
        return res.compile_ms is not None and res.tgc_ms <= res.compile_ms
    return None


TARGET_TEXT = {
    "bw90": ">= 90% of copy bandwidth",
    "bw80_beat_both": ">= 80% of bandwidth, faster than eager and torch.compile",
    "beat_compile": "faster than torch.compile",
    "le2.9ms": "<= 2.9 ms",
    "beat_eager_le_compile": "faster than eager, at least as fast as torch.compile",
    "sdpa80": ">= 80% of SDPA's speed (eager)",
    "beat_eager": "faster than eager",
    "le_eager": "at least as fast as eager",
    "le_compile": "at least as fast as torch.compile",
    "none": "none (reported)",
}


def fmt(ms, floor=None) -> str:
    if ms is None:
        return "-"
    text = f"{ms:.4f} ms"
    if floor:
        text += f" ({100 * floor / ms:.0f}%)"
    return text


def device_slug(device: str) -> str:
    """The device's name as it appears in a results file's name."""
    return device.replace(" ", "-").replace("/", "-")


def report_start(out: Path, stem: str, title: str, device: str, commit: str):
    """(a benchmark report's path, out/<stem>-<device>-<date>.md, the folder made; its title
    and device line)."""
    today = datetime.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-{device_slug(device)}-{today}.md"
    return path, [
        f"# {title}: {device}, {today}",
        "",
        f"- device: {device}; date: {today}; commit: {commit}",
    ]


def element_types(results) -> str:
    """The method line's element types: fp32, unless a row names bf16 or f16."""
    low = sorted({r.dtype for r in results} - {"f32"}, key=DTYPES.index)
    if not low:
        return "fp32"
    return f"fp32, except the rows named {' or '.join(low)} (both sides in that type throughout)"


def low_precision_method(results) -> list[str]:
    """The report's lines on the bf16/f16 rows' checks and on TFLOP/s, where there are such rows."""
    lines = []
    low = [dt for dt in LOW_DTYPES if any(r.dtype == dt for r in results)]
    if low:
        tols = ", ".join(f"{LOW_PRECISION_TOL[dt]:g} for {dt}" for dt in low)
        lines.append(
            f"- {' and '.join(low)} rows: inputs drawn in f32 and rounded to the type; tgc's results "
            f"checked against PyTorch's in the same type, max error relative to the largest "
            f"|PyTorch result| within {tols} (rounding at different points)"
        )
    if any(r.flops for r in results):
        lines.append(
            "- TFLOP/s: one call's flops over its median time; a GEMM 2 M N K, attention "
            "4 B H S^2 D (half under a causal mask), the GPT-2 block its four GEMMs plus causal "
            "attention; eager attention is `F.scaled_dot_product_attention`"
        )
    return lines


def tflops_order(auto: bool) -> list[str]:
    return ["tgc", *(["auto", "auto tuned"] if auto else []), "eager", "compile"]


def tflops(flops: float, ms: float) -> float:
    """The rate of `flops` done in `ms` milliseconds, in TFLOP/s."""
    return flops / (ms * 1e-3) / 1e12


def tflops_cell(r: Result, auto: bool) -> str:
    """`tgc / [auto / tuned /] eager / compile` TFLOP/s of a compute-bound row, "-" for others."""
    if not r.flops:
        return "-"
    times = [r.tgc_ms, *([r.auto_ms, r.tuned_ms] if auto else []), r.eager_ms, r.compile_ms]
    return " / ".join("-" if ms is None else f"{tflops(r.flops, ms):.0f}" for ms in times)


def write_report(results, device, bw, commit, out: Path, quick: bool) -> None:
    today = datetime.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{device_slug(device)}-{today}{'-quick' if quick else ''}.md"
    lines = [
        f"# tgc GPU benchmark: {device}, {today}",
        "",
        f"- device: {device}; measured device-to-device copy bandwidth {bw / 1e12:.2f} TB/s (read + write)",
        f"- date: {today}; commit: {commit}",
        (
            "- method: medians of 30 repetitions timed with CUDA events after 3 warm-ups, a sleep kernel "
            f"queued first so the host runs ahead; {element_types(results)}; every tgc result checked "
            "against PyTorch"
        ),
        "- percentages: the floor (bytes that must move / copy bandwidth) over the measured time",
        (
            "- tgc: the GPU route (`--backend cuda`) with `--no-measure` on an empty database: "
            "the default cost source's plan, checked whole against the plan of library kernels"
        ),
        *low_precision_method(results),
        "",
    ]
    auto = any(r.auto_plan or r.tuned_plan for r in results)
    if auto:
        lines[-1:-1] = [
            (
                "- tgc auto: `--backend auto` on the kernels of the cuda and torch backends, planned "
                "by select-kernels from what tgc-profile measured into the database (arguments "
                "and results in device memory); auto tuned: the same after `tgc-profile --tune`"
            )
        ]
    compute = any(r.flops for r in results)
    head = "| workload | tgc | " + ("tgc auto | auto tuned | " if auto else "")
    head += "PyTorch eager | torch.compile | floor | "
    if compute:
        head += f"TFLOP/s: {' / '.join(tflops_order(auto))} | "
    lines += [
        head + "target | met | max rel. error vs PyTorch |",
        "|---|---|---|---|---|---|---|---|"
        + ("---|---|" if auto else "")
        + ("---|" if compute else ""),
    ]
    for r in results:
        met = {True: "met", False: "missed", None: "-"}[r.met]
        if r.met is False and r.met_auto:
            met = "met by auto"
        err = f"{r.error:.1e}" if r.error is not None else "-"
        autos = f"{fmt(r.auto_ms, r.floor_ms)} | {fmt(r.tuned_ms, r.floor_ms)} | " if auto else ""
        rate = f"{tflops_cell(r, auto)} | " if compute else ""
        lines.append(
            f"| {r.name} | {fmt(r.tgc_ms, r.floor_ms)} | {autos}{fmt(r.eager_ms, r.floor_ms)} | "
            f"{fmt(r.compile_ms, r.floor_ms)} | {fmt(r.floor_ms)} | {rate}{TARGET_TEXT[r.target]} | "
            f"{met} | {err} |"
        )
    lines.append("")
    for r in results:
        lines.append(
            f"- {r.name}: tgc kernels: {', '.join(r.kernels)}{'. ' + r.note.strip() if r.note.strip() else ''}"
        )
        if r.auto_plan:
            lines.append(f"  - auto plan: {r.auto_plan}")
        if r.tuned_plan:
            lines.append(f"  - auto plan after --tune: {r.tuned_plan}")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    t0 = time.time()
    code = main()
    print(f"total {time.time() - t0:.0f} s")
    sys.exit(code)

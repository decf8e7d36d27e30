"""The GPU benchmark of issue 4: tgc against PyTorch eager, torch.compile and the memory floor.

Run on a GPU machine (PyTorch, PyCUDA and nvcc there), from the repository root:

    python3 bench/gpu_suite.py [--quick] [--only NAME,...] [--commit HASH] [--out bench/results]

For each workload: inputs drawn once on the GPU; tgc (fused kernels through the PyCUDA
executor, plain matmuls through cuBLAS), PyTorch eager and torch.compile run on one stream;
each is timed by CUDA events around every repetition, after warm-up, with a sleep kernel queued
first so that the host enqueues ahead of the GPU; the median is reported. Every tgc result is
checked against PyTorch's before its time is kept. The floor is the bytes that must move (each
input read once, each output written once) over the device-to-device copy bandwidth measured in
the same run. Writes bench/results/<device>-<date>.md with the device, date and commit, and
each target of the issue marked met or missed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
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
    met: bool | None = None
    note: str = ""
    kernels: list[str] = field(default_factory=list)
    variants: list[tuple[str, float]] = field(default_factory=list)
    profile: list[tuple[str, float]] = field(default_factory=list)
    best_variant: str = ""
    auto_ms: float | None = None  # --backend auto on the defaults' measurements
    tuned_ms: float | None = None  # ... after tgc-profile --tune
    auto_plan: str = ""
    tuned_plan: str = ""


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


def copy_bandwidth(stream) -> float:
    """Bytes read plus written per second by a large device-to-device copy."""
    import torch

    n = 1 << 28  # 1 GiB of f32
    a = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    with torch.cuda.stream(stream):
        ms = time_ms(lambda: b.copy_(a), stream, reps=20)
    return 2 * n * 4 / (ms * 1e-3)


def tgc_runner(text: str, pipeline: str = "", params: dict | None = None):
    import tgc
    from tgc.codegen.plan import build_plan
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager
    from tgc.runtime.cuda_executor import CudaPlanRunner

    tgc.load_all()
    module = parse_module(text)
    params = dict(params or {})
    # The `cuda` route's options (tgc-run --backend cuda's pipeline); the rest are template
    # parameters of every kernel.
    options = {
        key.replace("_", "-"): "true" if params.pop(key) else "false"
        for key in ("matmul_epilogue", "attention_kernel")
        if key in params
    }
    route = "cuda{" + " ".join(f"{k}={v}" for k, v in options.items()) + "}"
    PassManager.from_text(f"{pipeline},{route}" if pipeline else route).run(module)
    return CudaPlanRunner(build_plan(module.funcs[0], {"*": params} if params else None))


# -- --backend auto: tgc-profile, then select-kernels on the measurements (issue 7, item 6) ---------

AUTO_BACKENDS = ("cuda", "torch")  # the GPU's kernels: inputs and results live on the device


def on_device(text: str) -> str:
    """`text` with its values in device memory (every tensor type but a constant attribute's):
    the plan keeps the arguments and results there, as the fixed route's runner does, and
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
    auto --db DB --planner-backends cuda,torch, after `pipeline`)."""
    import tgc
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.planner import load_backends
    from tgc.planner.select import with_backends, with_database

    tgc.load_all()
    load_backends(AUTO_BACKENDS, required=True)
    passes = parse_pipeline(f"{pipeline},select-kernels" if pipeline else "select-kernels")
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


def bench_auto(res: Result, text, pipeline, inputs, want, stream, db: Path, tol, budget) -> None:
    """Profile, plan and time the auto route, first on the defaults, then after --tune."""
    import tempfile

    import torch

    from tgc.planner.executor import PlannedFunction

    device_text = on_device(text)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "workload.tg"
        path.write_text(device_text)
        for tune in (False, True):
            summary = profile_workload(path, db, pipeline, budget, tune)
            print(f"  {res.name} [tgc-profile{' --tune' if tune else ''}]: {summary}", flush=True)
            func = PlannedFunction(auto_plan(device_text, pipeline, db))
            outs = func(list(inputs))
            got = torch.as_tensor(outs[0], device="cuda")
            err = rel_error(got, want)
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


def run_tgc(runner, inputs_torch, stream):
    import torch

    runner.upload([x.detach().cpu().numpy() for x in inputs_torch])
    runner.poison()
    runner.launch(check_each=True)
    outs = [torch.from_numpy(o).cuda() for o in runner.download()]
    ms = time_ms(lambda: runner.launch(), stream)
    return outs, ms


def rel_error(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / max(want.abs().max().item(), 1e-30))


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
    variants=None,
    auto_db: Path | None = None,
    auto_budget: float = 60.0,
):
    import torch

    best = None
    for params in variants or [None]:
        runner = tgc_runner(text, pipeline, params)
        torch_stream = torch.cuda.ExternalStream(runner.stream.handle)
        with torch.cuda.stream(torch_stream):
            want = torch_fn(*inputs)
            torch.cuda.synchronize()
            outs, ms = run_tgc(runner, inputs, torch_stream)
            err = rel_error(outs[0], want)
        label = ", ".join(f"{k}={v}" for k, v in (params or {}).items()) or "defaults"
        if not err <= tol:
            res.note += f" [{label}: differs from PyTorch by {err:.2e}, tolerance {tol:g}]"
            continue
        res.variants.append((label, ms))
        print(f"  {res.name} [{label}]: {ms:.4f} ms", flush=True)
        if best is None or ms < best[0]:
            best = (
                ms,
                err,
                label,
                [
                    s.kernel.name if hasattr(s, "kernel") else type(s).__name__
                    for s in runner.plan.steps
                ],
            )
            res.profile = runner.profile() if len(runner.plan.steps) > 1 else []
        del runner
    if best is not None:
        res.tgc_ms, res.error, res.best_variant, res.kernels = best
    torch_stream = torch.cuda.current_stream()
    if auto_db is not None:
        with torch.cuda.stream(torch_stream):
            want = torch_fn(*inputs)
            bench_auto(res, text, pipeline, inputs, want, torch_stream, auto_db, tol, auto_budget)
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


def gpt2_text(b: int, s: int, d: int = 768, h: int = 12) -> str:
    hd, t = d // h, b * s
    x, v, w3, v3 = (
        f"tensor<{t}x{d}xf32>",
        f"tensor<{d}xf32>",
        f"tensor<{d}x{3 * d}xf32>",
        f"tensor<{3 * d}xf32>",
    )
    wo, w4, v4, w4t = (
        f"tensor<{d}x{d}xf32>",
        f"tensor<{d}x{4 * d}xf32>",
        f"tensor<{4 * d}xf32>",
        f"tensor<{4 * d}x{d}xf32>",
    )
    heads = f"tensor<{b}x{h}x{s}x{hd}xf32>"
    split = f"tensor<{b}x{s}x{h}x{hd}xf32>"
    qkv = f"tensor<{t}x{3 * d}xf32>"
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
        f"  %fc = hl.linear %h2, %w_fc, %b_fc : ({x}, {w4}, {v4}) -> tensor<{t}x{4 * d}xf32>",
        f'  %act = hl.gelu %fc {{approximate = "tanh"}} : (tensor<{t}x{4 * d}xf32>) -> tensor<{t}x{4 * d}xf32>',
        f"  %mlp = hl.linear %act, %w_proj, %b_proj : (tensor<{t}x{4 * d}xf32>, {w4t}, {v}) -> {x}",
        f"  %y = atomic.add %x1, %mlp : ({x}, {x}) -> {x}",
        f"  func.return %y : {x}",
        "}",
    ]
    return "\n".join(lines)


def gpt2_torch(b: int, s: int, d: int = 768, h: int = 12):
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
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", generator=g) * scale

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
    return block, inputs


# Template parameter sets tried for the memory-bound kernels (what a profiler would search);
# the fastest correct one is reported, and every one is listed.
ELEMENTWISE_VARIANTS = [
    None,
    {"block_size": 128},
    {"block_size": 512},
    {"streaming": True},
    {"streaming": True, "block_size": 512},
]
ROW_VARIANTS = [
    None,
    {"merge_passes": True},
    {"streaming": True},
    {"keep_in_registers": False},
    {"block_size": 128},
    {"block_size": 512},
    {"warp_per_row_max": 512, "block_size": 128},
    {"block_size": 256, "warp_per_row_max": 2048},
]


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, no torch.compile")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--commit", default=os.environ.get("TGC_COMMIT", "unknown"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-sweep", action="store_true", help="template defaults only")
    ap.add_argument(
        "--auto",
        metavar="DB",
        default=None,
        help="also time --backend auto (tgc-profile into DB, then --tune, select-kernels)",
    )
    ap.add_argument("--auto-budget", type=float, default=60.0, help="tgc-profile's --budget")
    args = ap.parse_args(argv)
    auto = {"auto_db": Path(args.auto), "auto_budget": args.auto_budget} if args.auto else {}
    only = set(filter(None, args.only.split(",")))
    do_compile = not (args.quick or args.no_compile)
    torch.manual_seed(0)
    stream = torch.cuda.current_stream()
    device = torch.cuda.get_device_name()
    bw = copy_bandwidth(stream)
    print(f"device {device}, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    results: list[Result] = []

    def want(name):
        return not only or name in only

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
            variants=None if args.no_sweep else ELEMENTWISE_VARIANTS,
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
            variants=None if args.no_sweep else ROW_VARIANTS,
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
            variants=None if args.no_sweep else ROW_VARIANTS,
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
            variants=None
            if args.no_sweep
            else [None, {"attention_kernel": False}, {"matmul_epilogue": True}],
            **auto,
        )
        results.append(res)
        print(res, flush=True)

    for res in results:
        res.met = judge(res, bw)
    write_report(results, device, bw, args.commit, Path(args.out), args.quick)
    return 0


def judge(res: Result, bw: float) -> bool | None:
    if res.tgc_ms is None:
        return False
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
    return None


TARGET_TEXT = {
    "bw90": ">= 90% of copy bandwidth",
    "bw80_beat_both": ">= 80% of bandwidth, faster than eager and torch.compile",
    "beat_compile": "faster than torch.compile",
    "le2.9ms": "<= 2.9 ms",
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
            "queued first so the host runs ahead; fp32; every tgc result checked against PyTorch"
        ),
        "- percentages: the floor (bytes that must move / copy bandwidth) over the measured time",
        "",
    ]
    auto = any(r.auto_plan or r.tuned_plan for r in results)
    if auto:
        lines[-1:-1] = [
            (
                "- tgc auto: `--backend auto` on the kernels of the cuda and torch backends, planned "
                "by select-kernels from what tgc-profile measured into the database (arguments "
                "and results in device memory); auto tuned: the same after `tgc-profile --tune`; "
                "tgc: the fixed `cuda` route, its best template parameters of the sweep"
            )
        ]
    head = "| workload | tgc | " + ("tgc auto | auto tuned | " if auto else "")
    lines += [
        head + "PyTorch eager | torch.compile | floor | target | met | max rel. error vs PyTorch |",
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if auto else ""),
    ]
    for r in results:
        met = "met" if r.met else "missed"
        err = f"{r.error:.1e}" if r.error is not None else "-"
        autos = f"{fmt(r.auto_ms, r.floor_ms)} | {fmt(r.tuned_ms, r.floor_ms)} | " if auto else ""
        lines.append(
            f"| {r.name} | {fmt(r.tgc_ms, r.floor_ms)} | {autos}{fmt(r.eager_ms, r.floor_ms)} | "
            f"{fmt(r.compile_ms, r.floor_ms)} | {fmt(r.floor_ms)} | {TARGET_TEXT[r.target]} | "
            f"{met} | {err} |"
        )
    lines.append("")
    for r in results:
        lines.append(
            f"- {r.name}: tgc steps: {', '.join(r.kernels)}{'. ' + r.note.strip() if r.note.strip() else ''}"
        )
        if r.profile:
            steps = "; ".join(f"{name}: {ms:.3f}" for name, ms in r.profile)
            lines.append(f"  - time per step (ms, one run, events between steps): {steps}")
        if r.variants:
            tried = "; ".join(f"{label}: {ms:.4f} ms" for label, ms in r.variants)
            lines.append(f"  - template parameters tried (best: {r.best_variant}): {tried}")
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

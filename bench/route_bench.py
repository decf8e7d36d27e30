"""The GPU route (planner/route.py) on bench/gpu_suite.py's rows, first use and second run,
beside PyTorch eager and torch.compile, on the same GPU in the same run.

On the GPU machine, from the repository root:

    python3 bench/route_bench.py [--dtypes bf16,f32] [--only gpt2,attn,...] [--budget S]
                                 [--commit HASH] [--out bench/results]

For each row: the route on first use with an empty database (its measuring inside
`--budget`, its first-use seconds reported); the route again on that database (plan seconds:
nothing measured); the route with `--no-measure` and an empty database (the default cost source
alone); eager; torch.compile. Every tgc result is checked against PyTorch's within the type's
tolerance (gpu_suite's LOW_PRECISION_TOL, 2e-4 in f32) before its time is kept. Times: gpu_suite's
`time_ms` (CUDA events, a sleep kernel ahead, median of 30). Writes
bench/results/route-<device>-<date>.md.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_suite as gs  # noqa: E402

F32_TOL = 2e-4


@dataclass
class Row:
    name: str
    first_ms: float | None = None
    first_use_s: float | None = None
    measured: int = 0
    second_plan_s: float | None = None
    second_ms: float | None = None
    no_measure_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    chosen: str = ""
    candidates: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def f32_workloads(quick: bool) -> list[gs.Workload]:
    b, s = (8, 1024) if not quick else (2, 256)
    text = gs.gpt2_text(b, s, dtype="f32")
    name = f"GPT-2 block f32, batch {b} x {s} tokens"
    return [gs.Workload("gpt2", name, "", text, gs.gpt2_flops(b, s), (b, s))]


def route_program(text: str, db: Path, budget: float, measure: bool = True):
    import tgc
    from tgc.planner.route import RouteOptions, compile_module

    tgc.load_all()
    options = RouteOptions(db=str(db), measure=measure, measure_budget=budget, progress=False)
    return compile_module(tgc.parse(text), None, options)


def checked(outs, want, tol: float) -> float:
    err = gs.results_error([gs.checked_result(o) for o in outs], want)
    if not err <= tol:
        raise AssertionError(f"differs from PyTorch by {err:.2e} (tolerance {tol:g})")
    return err


def bench_row(w: gs.Workload, dtype: str, stream, budget: float, do_compile: bool) -> Row:
    import torch

    row = Row(w.name)
    run = gs.LowPrecisionRun(dtype, stream, do_compile, {})
    if dtype == "f32":
        fn, inputs = gs.gpt2_torch(*w.shape, dtype="f32")
    else:
        fn, inputs = gs.TORCH_SIDES[w.kind](run, *w.shape)
    tol = F32_TOL if dtype == "f32" else gs.LOW_PRECISION_TOL[dtype]
    want = fn(*inputs)
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "measurements.sqlite"
        for label in ("first", "second", "no_measure"):
            try:
                path = Path(tmp) / "empty.sqlite" if label == "no_measure" else db
                start = time.perf_counter()
                prog = route_program(w.text, path, budget, measure=label != "no_measure")
                seconds = time.perf_counter() - start
                checked(prog(list(inputs)), want, tol)
                ms = gs.time_ms(lambda p=prog: p(list(inputs)), stream)
                print(f"  {w.name} [route {label}]: {ms:.4f} ms; {prog.report.summary()}")
                if label == "first":
                    row.first_ms, row.first_use_s = ms, seconds
                    row.measured = prog.report.measured
                    row.chosen, row.candidates = prog.report.chosen, prog.report.candidates
                elif label == "second":
                    row.second_ms, row.second_plan_s = ms, seconds
                else:
                    row.no_measure_ms = ms
                del prog
            except Exception as e:  # noqa: BLE001  (a row that fails is reported, the others go on)
                row.notes.append(f"route {label}: {type(e).__name__}: {e}"[:300])
                print(f"  {w.name} [route {label}]: failed: {e}", flush=True)
    row.eager_ms = gs.time_ms(lambda: fn(*inputs), stream)
    if do_compile:
        try:
            compiled = torch.compile(fn)
            compiled(*inputs)
            row.compile_ms = gs.time_ms(lambda: compiled(*inputs), stream)
        except Exception as e:  # noqa: BLE001
            row.notes.append(f"torch.compile: {type(e).__name__}"[:100])
    print(row, flush=True)
    return row


def fmt(x, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def write_report(rows: list[Row], device: str, commit: str, out: Path, budget: float) -> Path:
    date = datetime.date.today().isoformat()
    path = out / f"route-{gs.device_slug(device)}-{date}.md"
    lines = [
        f"# The GPU route against eager and torch.compile ({date})",
        "",
        f"Device: {device}. Commit: {commit}. `python3 bench/route_bench.py` (first-use budget "
        f"{budget:g} s). Times in ms, medians of 30 CUDA-event timings; every tgc result "
        "checked against PyTorch first.",
        "",
        "| row | route, first use | first use (s) | measured | route, second run"
        " | plan (s), second run | route, --no-measure, empty db | eager | torch.compile "
        "| whole plans (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cands = ", ".join(f"{k} {v:.4f}" for k, v in r.candidates.items())
        lines.append(
            f"| {r.name} | {fmt(r.first_ms)} | {fmt(r.first_use_s, 1)} | "
            f"{r.measured} | {fmt(r.second_ms)} | {fmt(r.second_plan_s, 2)} | "
            f"{fmt(r.no_measure_ms)} | {fmt(r.eager_ms)} | {fmt(r.compile_ms)} | "
            f"{cands}; ran {r.chosen} |"
        )
    notes = [f"- {r.name}: {n}" for r in rows for n in r.notes]
    if notes:
        lines += ["", "Notes:", "", *notes]
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="bf16,f32")
    ap.add_argument("--only", default="gpt2,attn,qkv,gemm_gelu")
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    import torch

    commit = (
        args.commit
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    stream = torch.cuda.current_stream()
    rows = []
    for dtype in args.dtypes.split(","):
        if dtype == "f32":
            workloads = f32_workloads(args.quick) if "gpt2" in args.only else []
        else:
            workloads = [
                w
                for kind in args.only.split(",")
                for w in gs.low_precision_workloads(kind, dtype, args.quick)
            ]
        for w in workloads:
            rows.append(bench_row(w, dtype, stream, args.budget, not args.no_compile))
    device = torch.cuda.get_device_name()
    path = write_report(rows, device, commit, Path(args.out), args.budget)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

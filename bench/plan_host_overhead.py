"""Where a planned function's host time goes: `--backend auto`'s plan of a gpu_suite workload,
run as a `PlannedFunction` on values in device memory, timed on the GPU (CUDA events, as
gpu_suite) and on the host (each call's Python time while the GPU runs behind), with a
cProfile of the host side. A plan whose host time per call exceeds its GPU time is host-bound:
its kernels wait for their launches. Then each step's GPU time (CUDA events between steps),
beside each step of the GPU route's plan with nothing measured (`--backend cuda --no-measure`,
gpu_suite's tgc column) on the same block: where the two plans differ, kernel by kernel.

    python3 bench/plan_host_overhead.py --db DB [--dtype bf16] [--calls 200]

Needs a GPU, PyCUDA and PyTorch; DB is a measurement database tgc-profile filled for the
workload (gpu_suite --auto writes one); prints its table and writes nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_suite import (  # noqa: E402
    auto_plan,
    gpt2_text,
    gpt2_torch,
    on_device,
    tgc_program,
    time_ms,
)


def step_times(func, inputs, reps: int = 10) -> list[tuple[str, float]]:
    """Median milliseconds of each step of the planned function `func` (CUDA events recorded
    between steps on the legacy default stream, where the plan's kernels run)."""
    import statistics

    import torch

    from tgc.planner.executor import _run_located

    stream = torch.cuda.default_stream()
    times: list[list[float]] = [[] for _ in func.steps]
    for _ in range(reps):
        env = list(inputs) + [None] * (func.slot_count - len(inputs))
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(func.steps) + 1)]
        marks[0].record(stream)
        for j, step in enumerate(func.steps):
            outs = _run_located(step, [env[i] for i in step.operands])
            for i, value in zip(step.results, outs):
                env[i] = value
            marks[j + 1].record(stream)
        torch.cuda.synchronize()
        for j in range(len(func.steps)):
            times[j].append(marks[j].elapsed_time(marks[j + 1]))
    return [(_step_name(s.op), statistics.median(t)) for s, t in zip(func.steps, times)]


def _step_name(op) -> str:
    """The step's kernel, its template parameters and the time the planner expected."""
    callee = str(op.attributes.get("callee") or op.name).strip('"')
    params = " ".join(f"{k[6:]}={v}" for k, v in op.attributes.items() if k.startswith("param."))
    seconds = op.attributes.get("plan.seconds")
    expected = f" (planned {float(seconds) * 1e3:.4f} ms)" if seconds is not None else ""
    types = ", ".join(str(r.type) for r in op.results)
    return f"{callee} {params} -> {types}{expected}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="the measurement database to plan from")
    ap.add_argument("--dtype", default="bf16", choices=["f32", "bf16", "f16"])
    ap.add_argument(
        "--calls",
        type=int,
        default=20,
        help="calls timed on the host (few: a full launch queue would block the host)",
    )
    args = ap.parse_args(argv)

    import torch

    from tgc.planner.executor import PlannedFunction

    b, s = 8, 1024
    text = on_device(gpt2_text(b, s, dtype=args.dtype))
    func = PlannedFunction(auto_plan(text, "", Path(args.db)))
    _, inputs = gpt2_torch(b, s, dtype=args.dtype)
    stream = torch.cuda.current_stream()
    func(list(inputs))
    torch.cuda.synchronize()
    gpu_ms = time_ms(lambda: func(list(inputs)), stream)

    torch.cuda._sleep(200_000_000)  # the GPU busy: the host's own time per call
    start = time.perf_counter()
    for _ in range(args.calls):
        func(list(inputs))
    host_ms = (time.perf_counter() - start) * 1e3 / args.calls
    torch.cuda.synchronize()

    profile = cProfile.Profile()
    torch.cuda._sleep(200_000_000)
    profile.enable()
    for _ in range(args.calls):
        func(list(inputs))
    profile.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)

    steps = len(func.steps)
    print(f"GPT-2 block {args.dtype}, batch {b} x {s}: {steps} steps")
    print(f"  per call, GPU (CUDA events): {gpu_ms:.4f} ms")
    print(f"  per call, host (Python):     {host_ms:.4f} ms ({1e3 * host_ms / steps:.1f} us/step)")
    print(out.getvalue())

    auto_steps = step_times(func, list(inputs))
    route = tgc_program(gpt2_text(b, s, dtype=args.dtype))
    route_steps = step_times(route.planned, list(inputs))
    print(f"per step (ms): auto {sum(t for _, t in auto_steps):.4f} in {len(auto_steps)} steps")
    for name, t in auto_steps:
        print(f"  {t:.4f}  {name}")
    print(f"per step (ms): route, nothing measured {sum(t for _, t in route_steps):.4f}")
    for name, t in route_steps:
        print(f"  {t:.4f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

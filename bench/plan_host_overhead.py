"""Where a planned function's host time goes: `--backend auto`'s plan of a gpu_suite workload,
run as a `PlannedFunction` on values in device memory, timed on the GPU (CUDA events, as
gpu_suite) and on the host (each call's Python time while the GPU runs behind), with a
cProfile of the host side. A plan whose host time per call exceeds its GPU time is host-bound:
its kernels wait for their launches.

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

from gpu_suite import auto_plan, gpt2_text, gpt2_torch, on_device, time_ms  # noqa: E402


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
    return 0


if __name__ == "__main__":
    sys.exit(main())

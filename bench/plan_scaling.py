"""Planner speed: time of `select-kernels`' planning on GPT-2 models of N transformer blocks.

    python bench/plan_scaling.py [N ...] [--repeat K] [--kernels numpy|numpy+cuda]
                                                                 (default: 1 12 48, both)

The models are those of bench/pass_scaling.py (examples/gpt2_block.tg chained N times). Each is
planned in two forms, as written (hl ops) and after `lower-hl` (atomic ops, where the graph
kernels numpy.tanh, numpy.softmax, ... match), and with two kernel sets:

- `numpy`: the registered backends (numpy here, as in CI);
- `numpy+cuda`: the same plus a roofline-costed "cuda" op kernel for every op, so that every
  value has two placements and every copy a cost (planning only: nothing runs).

For each: the planning time (`plan_function`: segments, copies found, options matched where
needed, structural hashes, the DP and reading the plan back; best of K, after a warm-up that
builds the decompositions and the kernels' reference graphs once per process; the canonical
form `prepare` is not included), the segments and how many distinct ones were solved, the ops
whose options were matched (counted, decompositions' ops included), whether the plan is proven
optimal, the ratio to one block, and whether the plan equals the one found planning every
segment anew.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pass_scaling import generate

import tgc
from tgc.planner import load_backends
from tgc.planner.cost import CachedCosts, RooflineCostSource
from tgc.planner.kernel import KERNELS, Kernel, register_kernel
from tgc.planner.options import PlanContext
from tgc.planner.select import plan_function, prepare


def cuda_stand_ins() -> list[Kernel]:
    """A "cuda" op kernel for each numpy op kernel: placements to choose from, costed by the
    roofline; registered for planning only (this process never runs them)."""
    found = []
    for k in list(KERNELS.values()):
        if k.backend == "numpy" and k.op is not None and not k.name.startswith("copy."):
            name = "cuda.bench." + k.name.split(".", 1)[1]
            found.append(KERNELS.get(name) or register_kernel(Kernel(name, "cuda", op=k.op)))
    return found


def kernel_set(name: str) -> list[Kernel]:
    numpy = [k for k in KERNELS.values() if k.backend == "numpy" and not k.name.startswith("cuda")]
    if name == "numpy":
        return numpy
    return numpy + cuda_stand_ins()


def prepared(blocks: int, form: str):
    module = tgc.parse(generate(blocks), "bench.tg")
    if form == "lowered":
        tgc.run_pipeline(module, "lower-hl")
    func = module.funcs[0]
    prepare(func)
    return func


class CountingContext(PlanContext):
    """A PlanContext that counts the ops whose options it finds (matching them)."""

    matched = 0

    def options_at(self, op):
        self.matched += 1
        return super().options_at(op)


def plan_once(blocks: int, form: str, kernels, reuse: bool = True):
    func = prepared(blocks, form)
    ctx = CountingContext(kernels, tolerance=1e-5)
    costs = CachedCosts(RooflineCostSource())
    start = time.perf_counter()
    selection = plan_function(func, ctx, costs, reuse=reuse)
    seconds = time.perf_counter() - start
    return seconds, selection, sum(1 for _ in func.body.ops), ctx.matched


def measure(blocks: int, form: str, kernels, repeat: int) -> dict:
    best, selection, ops, matched = None, None, 0, 0
    for _ in range(repeat):
        seconds, selection, ops, matched = plan_once(blocks, form, kernels)
        best = seconds if best is None else min(best, seconds)
    _, fresh, _, _ = plan_once(blocks, form, kernels, reuse=False)
    return {
        "blocks": blocks,
        "ops": ops,
        "matched": matched,
        "seconds": best,
        "segments": selection.segments,
        "distinct": selection.distinct_segments,
        "exact": selection.exact,
        "estimate": selection.seconds,
        "same": str(selection.plan) == str(fresh.plan),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("blocks", nargs="*", type=int, default=[1, 12, 48])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kernels", choices=("numpy", "numpy+cuda"), action="append")
    args = ap.parse_args(argv)
    load_backends()
    print(
        f"# planning GPT-2 blocks, best of {args.repeat}, {platform.processor() or platform.machine()}"
        f", {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(
        "| kernels | form | blocks | ops planned | segments (solved) | ops matched | exact | "
        "plan estimate s | planning s | vs 1 block | same plan without reuse |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for kernels_name in args.kernels or ("numpy", "numpy+cuda"):
        kernels = kernel_set(kernels_name)
        for form in ("hl", "lowered"):
            plan_once(1, form, kernels)  # warm-up: decompositions, reference graphs
            base = None
            for n in args.blocks:
                row = measure(n, form, kernels, args.repeat)
                base = base or row["seconds"]
                print(
                    f"| {kernels_name} | {form} | {n} | {row['ops']} | {row['segments']} "
                    f"({row['distinct']}) | {row['matched']} | {'yes' if row['exact'] else 'no'} | "
                    f"{row['estimate']:.4g} | {row['seconds']:.4f} | "
                    f"{row['seconds'] / base:.2f}x | {'yes' if row['same'] else 'NO'} |"
                )


if __name__ == "__main__":
    main()

"""The DP's gap to brute force on random small DAGs (shared values), exact search on and off.

    python bench/plan_gap.py [--cases N] [--ops LO HI]       (default: 400 cases of 3-9 ops)

Random DAGs (test/planner_fakes.py: ops read any earlier values; numpy and cuda op kernels with
random availability, overlapping fake graph kernels, hl.relu and hl.silu decompositions; random
costs for every kernel and copy) with at most 5000 plans each. For each: the cheapest plan over
every path (`paths` + `plan_cost`), the DP's plan with the shared values enumerated (default
budget), and the DP's plan by the plain recurrence alone (budget 0: every reader pays for a
shared value). Prints how often each is optimal and the gap (plan cost / optimum - 1).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test"))

from planner_fakes import (
    cone_matcher,
    fake_kernels,
    random_costs,
    random_dag,
    with_graph_kernels,
)

from tgc.planner.cost import CachedCosts
from tgc.planner.options import PlanContext
from tgc.planner.paths import count_paths, paths, plan_cost
from tgc.planner.select import plan_function
from tgc.planner.solve import EXACT_BUDGET


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--ops", type=int, nargs=2, default=(3, 9))
    ap.add_argument("--seed", type=int, default=1000)
    args = ap.parse_args(argv)
    gaps: dict[int, list[float]] = {EXACT_BUDGET: [], 0: []}
    exact_flags: dict[int, int] = {EXACT_BUDGET: 0, 0: 0}
    start = time.perf_counter()
    skipped = 0
    for seed in range(args.seed, args.seed + args.cases):
        rng = random.Random(seed)
        kernels = fake_kernels(rng)
        func = random_dag(rng, rng.randint(*args.ops), hl=0.1)
        kernels = with_graph_kernels(kernels) if seed % 2 == 0 else kernels
        ctx = PlanContext(kernels, match=cone_matcher)
        costs = CachedCosts(random_costs(rng, kernels))
        if count_paths(func, ctx) > 5000:
            skipped += 1
            continue
        best = min(plan_cost(p, costs) for p in paths(func, ctx))
        for budget, found in gaps.items():
            selection = plan_function(func, ctx, costs, budget=budget)
            exact_flags[budget] += selection.exact
            found.append(selection.seconds / best - 1)
    n = len(gaps[0])
    print(
        f"# {n} random DAGs of {args.ops[0]}-{args.ops[1]} ops ({skipped} with over 5000 plans "
        f"skipped), {time.perf_counter() - start:.1f} s"
    )
    print("| DP | proven exact | optimal plans | mean gap | median gap | max gap |")
    print("|---|---:|---:|---:|---:|---:|")
    for budget, label in ((EXACT_BUDGET, "shared values enumerated"), (0, "plain recurrence")):
        g = gaps[budget]
        optimal = sum(x <= 1e-12 for x in g)
        print(
            f"| {label} | {exact_flags[budget]}/{n} | {optimal}/{n} | {statistics.mean(g):.2%} | "
            f"{statistics.median(g):.2%} | {max(g):.2%} |"
        )


if __name__ == "__main__":
    main()

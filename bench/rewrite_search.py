"""Compare the rewrite searches: `algebraic` (best-first, α = 1.05 and 1.5) and `eqsat`.

For each program (the examples, test/lit/algebraic/options.tg's functions, the workloads of
bench/gpu_suite.py, and random graphs of three small terms over three 64x64 inputs drawn from
tgc-rulegen's enumeration, seeded) the cleanup before the search runs first
(`fold-batch-norm,lower-hl,canonicalize,cse`), then each search alone on a fresh copy; the
table gives the modelled cost after the search (passes/algebraic/cost.py, default weights,
summed over functions) and the search's time on this machine. `eqsat{cost=planner ...}`
extracts by the planner's numpy kernels instead (planner/eqsat_cost.py): its column is priced
by the same algebraic model, which is not the one it minimised, so a higher number there is a
different choice, not a worse search.

    python bench/rewrite_search.py > bench/results/rewrite-search-<date>.md
"""

from __future__ import annotations

import glob
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tgc
from tgc.parser import parse_module
from tgc.pass_manager import PassManager, parse_pipeline
from tgc.passes.algebraic.cost import CostWeights, ops_seconds

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
SEARCHES = [
    "algebraic",
    "algebraic{alpha=1.5}",
    "eqsat",
    "eqsat{cost=planner backends=numpy db=/nonexistent/none.sqlite}",
]
RANDOM_GRAPHS = 8
RANDOM_OPS = ("add", "sub", "mul", "matmul", "transpose", "neg")
PREPARE = "fold-batch-norm,lower-hl,canonicalize,cse"


def programs() -> list[tuple[str, str]]:
    out = [
        (Path(p).name, Path(p).read_text()) for p in sorted(glob.glob(str(ROOT / "examples/*.tg")))
    ]
    text = (ROOT / "test/lit/algebraic/options.tg").read_text()
    for i, part in enumerate(re.split(r"^// -----.*$", text, flags=re.M)):
        out.append((f"options.tg#{i}", part))
    out += suite_workloads()
    out += random_graphs(RANDOM_GRAPHS, seed=0)
    return out


def suite_workloads() -> list[tuple[str, str]]:
    """bench/gpu_suite.py's f32 workloads at its sizes."""
    import gpu_suite as suite

    return [
        ("suite gelu_scale 2^24", suite.gelu_scale_text(1 << 24)),
        ("suite softmax 4096x4096", suite.softmax_text(4096, 4096)),
        ("suite layernorm 8192x1024", suite.layernorm_text(8192, 1024)),
        ("suite two_matmuls 2048", suite.two_matmuls_text(2048)),
        ("suite gpt2 block 8x1024", suite.gpt2_text(8, 1024)),
    ]


def random_graphs(count: int, seed: int) -> list[tuple[str, str]]:
    """`count` functions returning three terms of 2-3 ops each over three 64x64 inputs."""
    from tgc.builder import FunctionBuilder
    from tgc.passes.rulegen.enumerate import Config, enumerate_terms
    from tgc.printer import print_module
    from tgc.types import TensorType

    enum = enumerate_terms(Config(ops=RANDOM_OPS, max_ops=3, inputs=3))
    terms = [t for t in enum.reps if t.spec is not None and t.size >= 2]
    rng = np.random.default_rng(seed)
    t = TensorType.get((64, 64), "f32")
    out = []
    for n in range(count):
        fb = FunctionBuilder("f", [t, t, t], ["a", "b", "c"])
        values: dict[int, object] = {}

        def emit(term, fb=fb, values=values):
            if term.spec is None:
                return fb.args[term.index]
            if term.id not in values:
                operands = [emit(c) for c in term.children]
                created = fb.create(term.spec.op, operands, term.spec.attributes())
                values[term.id] = created.results[0]
            return values[term.id]

        picked = [terms[i] for i in rng.choice(len(terms), size=3, replace=False)]
        module = fb.ret(*[emit(p) for p in picked])
        out.append((f"random #{n}", print_module(module)))
    return out


def cost(module) -> float:
    return sum(ops_seconds(f.body.ops, CostWeights()) for f in module.funcs)


def main() -> None:
    tgc.load_all()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    print(f"# rewrite searches, {time.strftime('%Y-%m-%d')}, commit {commit}\n")
    print("modelled cost after the search (µs) / search time (ms)\n")
    print("| program | before | " + " | ".join(SEARCHES) + " |")
    print("|---|---|" + "---|" * len(SEARCHES))
    for name, text in programs():
        prepared = parse_module(text, name)
        PassManager(parse_pipeline(PREPARE)).run(prepared)
        from tgc.printer import print_module

        base = print_module(prepared)
        row = [name, f"{cost(prepared) * 1e6:.2f}"]
        for search in SEARCHES:
            module = parse_module(base, name)
            start = time.perf_counter()
            PassManager(parse_pipeline(search)).run(module)
            ms = (time.perf_counter() - start) * 1e3
            row.append(f"{cost(module) * 1e6:.2f} / {ms:.0f}")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

"""Compare the rewrite searches: `algebraic` (best-first, α = 1.05 and 1.5) and `eqsat`.

For each program (the examples, test/lit/algebraic/options.tg's functions) the cleanup before
the search runs first (`fold-batch-norm,lower-hl,canonicalize,cse`), then each search alone on
a fresh copy; the table gives the modelled cost after the search (passes/algebraic/cost.py,
default weights, summed over functions) and the search's time on this machine.

    python bench/rewrite_search.py > bench/results/rewrite-search-<date>.md
"""

from __future__ import annotations

import glob
import re
import subprocess
import time
from pathlib import Path

import tgc
from tgc.parser import parse_module
from tgc.pass_manager import PassManager, parse_pipeline
from tgc.passes.algebraic.cost import CostWeights, ops_seconds

ROOT = Path(__file__).resolve().parent.parent
SEARCHES = ["algebraic", "algebraic{alpha=1.5}", "eqsat"]
PREPARE = "fold-batch-norm,lower-hl,canonicalize,cse"


def programs() -> list[tuple[str, str]]:
    out = [
        (Path(p).name, Path(p).read_text()) for p in sorted(glob.glob(str(ROOT / "examples/*.tg")))
    ]
    text = (ROOT / "test/lit/algebraic/options.tg").read_text()
    for i, part in enumerate(re.split(r"^// -----.*$", text, flags=re.M)):
        out.append((f"options.tg#{i}", part))
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

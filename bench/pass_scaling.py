"""Optimiser speed: time of `-p optimize` on generated GPT-2 models of N transformer blocks.

    python bench/pass_scaling.py [N ...] [--repeat K] [--no-gc] [--profile N]   (default: 1 12 48)

Each model is one function chaining N GPT-2 blocks (pre-norm, 768 wide, 12 causal heads of 64,
MLP 3072 wide, sequence 64: examples/gpt2_block.tg with every name suffixed by the block
number), so the IR grows linearly in N. For each size: the ops in the input (mostly hl), the ops
after lower-hl (the atomic graph the other passes work on), the ops left after optimize, the
time of each pass and of the whole pipeline (best of K runs, parse excluded), ops/s (lowered
ops per second of optimize) and the growth of the time relative to the previous size divided by
the growth in blocks (1.0 = linear). `--no-gc` turns Python's cyclic garbage collector off
while the passes run (as tgc.parser does while parsing) to separate its cost from the passes'
own. `--profile N` prints cProfile's top functions for size N.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import platform
import pstats
import re
from collections import defaultdict
from pathlib import Path

from tgc.parser import parse_module
from tgc.pass_manager import PassManager, parse_pipeline
from tgc.verifier import verify

BLOCK = (Path(__file__).resolve().parent.parent / "examples" / "gpt2_block.tg").read_text()
PARAMS = [
    "ln1_g",
    "ln1_b",
    "w_qkv",
    "b_qkv",
    "w_o",
    "b_o",
    "ln2_g",
    "ln2_b",
    "w_fc",
    "b_fc",
    "w_proj",
    "b_proj",
]


def _block_body() -> tuple[list[str], dict[str, str]]:
    """The op lines of examples/gpt2_block.tg and the type of each parameter."""
    header = next(line for line in BLOCK.splitlines() if line.startswith("func.func"))
    types = {}
    for part in header.split("(", 1)[1].split(") ->")[0].split(", %"):
        name, t = part.lstrip("%").split(": ")
        types[name] = t
    body = [line for line in BLOCK.splitlines() if line.startswith("  %")]
    return body, types


def generate(blocks: int) -> str:
    """One function chaining `blocks` GPT-2 blocks; block i's values are suffixed `_i`."""
    body, types = _block_body()
    args = ["%x: tensor<64x768xf32>"]
    lines = []
    current = "%x"
    for i in range(blocks):
        args += [f"%{p}_{i}: {types[p]}" for p in PARAMS]
        for line in body:
            renamed = _rename(line, i, current)
            lines.append(renamed)
        current = f"%y_{i}"
    head = f"func.func @gpt2_{blocks}({', '.join(args)}) -> tensor<64x768xf32> {{"
    return "\n".join([head, *lines, f"  func.return {current} : tensor<64x768xf32>", "}"]) + "\n"


def _rename(line: str, block: int, block_input: str) -> str:
    """Suffix every value name with the block number; the block's %x is the previous output."""

    def renamed(m: re.Match) -> str:
        return block_input if m.group(0) == "%x" else f"{m.group(0)}_{block}"

    return re.sub(r"%[A-Za-z_][A-Za-z0-9_]*", renamed, line)


def count_ops(module) -> int:
    return sum(1 for f in module.funcs for _ in f.body.ops)


def run_once(text: str, collect: bool) -> tuple[dict[str, float], int, int]:
    """Per-pass seconds (summed over repeated names), lowered op count and final op count."""
    lowered = parse_module(text, "bench.tg")
    PassManager(parse_pipeline("lower-hl")).run(lowered)
    lowered_ops = count_ops(lowered)
    del lowered
    gc.collect()
    module = parse_module(text, "bench.tg")
    verify(module)
    pm = PassManager(parse_pipeline("optimize"))
    if not collect:
        gc.disable()
    try:
        pm.run(module)
    finally:
        gc.enable()
    times: dict[str, float] = defaultdict(float)
    for name, seconds in pm.timings:
        times[name] += seconds
    return dict(times), lowered_ops, count_ops(module)


def measure(blocks: int, repeat: int, collect: bool) -> dict:
    text = generate(blocks)
    input_ops = count_ops(parse_module(text, "bench.tg"))
    best = None
    for _ in range(repeat):
        times, lowered, final = run_once(text, collect)
        total = sum(times.values())
        if best is None or total < best["total"]:
            best = {"times": times, "total": total, "lowered": lowered, "final": final}
    return {"blocks": blocks, "input": input_ops, **best}


def profile(blocks: int) -> None:
    module = parse_module(generate(blocks), "bench.tg")
    pm = PassManager(parse_pipeline("optimize"))
    profiler = cProfile.Profile()
    profiler.enable()
    pm.run(module)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("blocks", nargs="*", type=int, default=[1, 12, 48])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-gc", action="store_true", help="no cyclic GC while the passes run")
    ap.add_argument("--profile", type=int, default=None, metavar="N")
    args = ap.parse_args(argv)
    if args.profile is not None:
        profile(args.profile)
        return
    parse_module(generate(1), "warmup.tg")  # build the Lark parser outside the timings
    rows = [measure(n, args.repeat, not args.no_gc) for n in args.blocks]
    print(
        f"# -p optimize, best of {args.repeat}, cyclic GC {'off' if args.no_gc else 'on'}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    passes = list(rows[0]["times"])
    print(
        "| blocks | input ops | lowered ops | ops after | "
        + " | ".join(passes)
        + " | optimize s | ops/s | time growth / block growth |"
    )
    print("|" + "---:|" * (len(passes) + 7))
    previous = None
    for row in rows:
        growth = ""
        if previous is not None:
            growth = (
                f"{(row['total'] / previous['total']) / (row['blocks'] / previous['blocks']):.2f}"
                f" ({row['total'] / previous['total']:.1f}x for {row['blocks'] / previous['blocks']:.0f}x)"
            )
        cells = " | ".join(f"{row['times'][p]:.3f}" for p in passes)
        print(
            f"| {row['blocks']} | {row['input']} | {row['lowered']} | {row['final']} | {cells} | "
            f"{row['total']:.3f} | {row['lowered'] / row['total']:,.0f} | {growth} |"
        )
        previous = row


if __name__ == "__main__":
    main()

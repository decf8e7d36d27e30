"""Compiler speed on generated models: `-p optimize`, `-p fuse`, `tgc-translate --emit=cuda`.

    python bench/pass_scaling.py [N ...] [--repeat K] [--no-gc] [--profile N]   (default: 1 12 48)
    python bench/pass_scaling.py --cuda [N ...] [--repeat K] [--profile N]   (default: 1 12 24 48)
    python bench/pass_scaling.py --chain [N ...] [--repeat K] [--profile N]  (default: 200 400 10000)

Each model is one function chaining N GPT-2 blocks (pre-norm, 768 wide, 12 causal heads of 64,
MLP 3072 wide, sequence 64: examples/gpt2_block.tg with every name suffixed by the block
number), so the IR grows linearly in N. For each size: the ops in the input (mostly hl), the ops
after lower-hl (the atomic graph the other passes work on), the ops left after optimize, the
time of each pass and of the whole pipeline (best of K runs, parse excluded), ops/s (lowered
ops per second of optimize) and the growth of the time relative to the previous size divided by
the growth in blocks (1.0 = linear). `--no-gc` turns Python's cyclic garbage collector off
while the passes run (as tgc.parser does while parsing) to separate its cost from the passes'
own. `--profile N` prints cProfile's top functions for size N.

`--cuda`: the whole route of `tgc-translate --emit=cuda` on the same models, in process (parse and
verify, `lower-for-planning`, the plan (planner/standalone.py `plan_standalone`), then code
generation (`device_program` and the file)) and as the command itself (wall time of a fresh
process: Python start and imports included). `--chain`: `-p fuse` on one function chaining N `atomic.exp` (one kernel),
in process and as `tgc-opt -p fuse`. Both report best of K and the time growth relative to the
previous size divided by the size growth (1.0 = linear).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import platform
import pstats
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import tgc
from tgc.parser import parse_module
from tgc.pass_manager import PassManager, parse_pipeline
from tgc.verifier import verify

tgc.load_all()  # the dialects and passes the benchmarks parse and run

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


def exp_chain(n: int) -> str:
    """One function of `n` chained `atomic.exp` on a 4x8 tensor (fuse makes it one kernel)."""
    lines = ["func.func @chain(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {"]
    previous = "%x"
    for i in range(n):
        lines.append(f"  %v{i} = atomic.exp {previous} : (tensor<4x8xf32>) -> tensor<4x8xf32>")
        previous = f"%v{i}"
    return "\n".join([*lines, f"  func.return {previous} : tensor<4x8xf32>", "}"]) + "\n"


def command_seconds(argv: list[str], text: str, repeat: int) -> float:
    """Best wall time of a tool of this environment (bin/ beside the interpreter) on `text`."""
    tool = str(Path(sys.executable).with_name(argv[0]))
    with tempfile.NamedTemporaryFile("w", suffix=".tg") as f:
        f.write(text)
        f.flush()
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            subprocess.run([tool, *argv[1:], f.name], check=True, stdout=subprocess.DEVNULL)
            best = min(best, time.perf_counter() - start)
    return best


def cuda_route_once(text: str) -> dict:
    """Seconds of each stage of `tgc-translate --emit=cuda`, in process (planner/standalone.py's
    `emit_standalone_cuda`, its planning and writing timed apart)."""
    from tgc.codegen.kernels import module_names
    from tgc.codegen.standalone import write_file
    from tgc.planner.backends.cuda_kernels import planning_kernels
    from tgc.planner.standalone import device_program, plan_standalone

    start = time.perf_counter()
    module = parse_module(text, "bench.tg")
    verify(module)
    parsed = time.perf_counter()
    PassManager(parse_pipeline("lower-for-planning")).run(module)
    lowered = time.perf_counter()
    (func,) = module.funcs
    names = module_names()
    entry = names.allocate(func.sym_name, "tgc_run_", ["{}_scratch_bytes", "tgc_main_{}"])
    with planning_kernels(None):
        plan_standalone(func)
        planned = time.perf_counter()
        ops = count_ops(module)
        source = write_file([device_program(func, names, None)], [entry], names, "bench.tg")
    done = time.perf_counter()
    return {
        "parse": parsed - start,
        "lower": lowered - parsed,
        "plan": planned - lowered,
        "emit": done - planned,
        "total": done - start,
        "ops": ops,
        "kernels": source.count("__global__"),
    }


def measure_cuda(blocks: int, repeat: int) -> dict:
    text = generate(blocks)
    best = min((cuda_route_once(text) for _ in range(repeat)), key=lambda r: r["total"])
    cli = command_seconds(["tgc-translate", "--emit=cuda", "-o", os.devnull], text, repeat)
    return {"size": blocks, **best, "cli": cli}


def fuse_chain_once(text: str) -> float:
    module = parse_module(text, "chain.tg")
    pm = PassManager(parse_pipeline("fuse"))
    start = time.perf_counter()
    pm.run(module)
    return time.perf_counter() - start


def measure_chain(n: int, repeat: int) -> dict:
    text = exp_chain(n)
    fuse = min(fuse_chain_once(text) for _ in range(repeat))
    cli = command_seconds(["tgc-opt", "-p", "fuse", "-o", os.devnull], text, repeat)
    return {"size": n, "fuse": fuse, "cli": cli}


def growth(row: dict, previous: dict | None, key: str) -> str:
    """Time growth over size growth against the previous row (1.0 = linear)."""
    if previous is None:
        return ""
    times, sizes = row[key] / previous[key], row["size"] / previous["size"]
    return f"{times / sizes:.2f} ({times:.1f}x for {sizes:.0f}x)"


def machine_line(what: str, repeat: int) -> str:
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    return (
        f"# {what}, best of {repeat}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs{load}, Python {platform.python_version()}"
    )


def print_cuda_table(sizes: list[int], repeat: int) -> None:
    cuda_route_once(generate(1))  # imports and templates outside the timings
    rows = [measure_cuda(n, repeat) for n in sizes]
    print(machine_line("tgc-translate --emit=cuda", repeat))
    print(
        "| blocks | ops planned | kernels | parse s | lower s | plan s | generate s "
        "| in process s | growth / block growth | command s | growth / block growth |"
    )
    print("|" + "---:|" * 11)
    previous = None
    for r in rows:
        print(
            f"| {r['size']} | {r['ops']} | {r['kernels']} | {r['parse']:.3f} | {r['lower']:.3f}"
            f" | {r['plan']:.3f} | {r['emit']:.3f} | {r['total']:.3f} | "
            f"{growth(r, previous, 'total')} | {r['cli']:.2f} | {growth(r, previous, 'cli')} |"
        )
        previous = r


def print_chain_table(sizes: list[int], repeat: int) -> None:
    fuse_chain_once(exp_chain(10))  # imports outside the timings
    rows = [measure_chain(n, repeat) for n in sizes]
    print(machine_line("-p fuse on a chain of atomic.exp", repeat))
    print(
        "| ops in chain | fuse s | growth / size growth | tgc-opt -p fuse s | growth / size growth |"
    )
    print("|" + "---:|" * 5)
    previous = None
    for r in rows:
        print(
            f"| {r['size']} | {r['fuse']:.3f} | {growth(r, previous, 'fuse')} | "
            f"{r['cli']:.2f} | {growth(r, previous, 'cli')} |"
        )
        previous = r


def profile_work(work) -> None:
    profiler = cProfile.Profile()
    profiler.runcall(work)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("blocks", nargs="*", type=int, help="sizes (default: per mode, see above)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-gc", action="store_true", help="no cyclic GC while the passes run")
    ap.add_argument("--profile", type=int, default=None, metavar="N")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cuda", action="store_true", help="tgc-translate --emit=cuda route")
    mode.add_argument("--chain", action="store_true", help="-p fuse on chains of atomic.exp")
    args = ap.parse_args(argv)
    if args.cuda or args.chain:
        run_route(args)
        return
    if args.profile is not None:
        profile(args.profile)
        return
    parse_module(generate(1), "warmup.tg")  # build the Lark parser outside the timings
    rows = [measure(n, args.repeat, not args.no_gc) for n in args.blocks or [1, 12, 48]]
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


def run_route(args: argparse.Namespace) -> None:
    """--cuda and --chain: a table, or a profile of one size (`--profile N`)."""
    if args.cuda:
        sizes = args.blocks or [1, 12, 24, 48]

        def work(n: int):
            return cuda_route_once(generate(n))

        table = print_cuda_table
    else:
        sizes = args.blocks or [200, 400, 10000]

        def work(n: int):
            return fuse_chain_once(exp_chain(n))

        table = print_chain_table
    if args.profile is not None:
        work(1)  # imports and templates outside the profile
        profile_work(lambda: work(args.profile))
    else:
        table(sizes, args.repeat)


if __name__ == "__main__":
    main()

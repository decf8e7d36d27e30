"""Front-end speed: start-up of tgc-opt, and parse, verify and print time for N tensor ops.

    python bench/parse_scaling.py [N ...] [--runs K] [--no-startup]   (default N: 1000 10000 100000)

Start-up: `tgc-opt` on a 10-op module (the first 10 ops below), and `xdsl-opt` on the same module
in MLIR's generic form (`--allow-unregistered-dialect`), each the median wall time of K runs of
the executable beside this Python (after one warm-up run): tgc-opt with its parser cache, tgc-opt
building the parser every run (a fresh empty XDG_CACHE_HOME), and bare `python -c pass` as the
floor every Python tool pays.

Throughput: the module is one function with a GPT-2-like mix of ops (matmul, add, mul, exp,
reduce, softmax, transpose, reshape) over a few shapes, each op using recent values. Prints one
row per size and the growth factor of the total time between successive sizes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tgc
from tgc.parser import parse_module
from tgc.printer import print_module
from tgc.verifier import verify

tgc.load_all()  # the dialects of the generated ops

T = "tensor<64x256xf32>"
R = "tensor<64x1xf32>"
W = "tensor<256x256xf32>"
TT = "tensor<256x64xf32>"
K = "tensor<16384xf32>"


def generate(n_ops: int) -> str:
    lines = [f"func.func @big(%x: {T}, %w: {W}, %r: {R}) -> {T} {{"]
    prev, older = "%x", "%x"
    i = 0
    while i < n_ops:
        kind = i % 8
        v = f"%v{i}"
        if kind == 0:
            lines.append(f"  {v} = atomic.matmul {prev}, %w : ({T}, {W}) -> {T}")
        elif kind == 1:
            lines.append(f"  {v} = atomic.add {prev}, {older} : ({T}, {T}) -> {T}")
        elif kind == 2:
            lines.append(f"  {v} = atomic.mul {prev}, {prev} : ({T}, {T}) -> {T}")
        elif kind == 3:
            lines.append(f"  {v} = atomic.exp {prev} : ({T}) -> {T}")
        elif kind == 4:
            lines.append(
                f"  {v} = atomic.reduce_sum {prev} {{axes = [1], keepdims = true}} : ({T}) -> {R}"
            )
            lines.append(f"  %s{i} = atomic.sub {prev}, %r : ({T}, {R}) -> {T}")
            i += 1
            v = f"%s{i - 1}"
        elif kind == 5:
            lines.append(f"  {v} = hl.softmax {prev} {{axis = -1}} : ({T}) -> {T}")
        elif kind == 6:
            lines.append(f"  {v} = atomic.transpose {prev} {{perm = [1, 0]}} : ({T}) -> {TT}")
            lines.append(f"  %t{i} = atomic.transpose {v} {{perm = [1, 0]}} : ({TT}) -> {T}")
            i += 1
            v = f"%t{i - 1}"
        else:
            lines.append(f"  {v} = atomic.reshape {prev} : ({T}) -> {K}")
            lines.append(f"  %u{i} = atomic.reshape {v} : ({K}) -> {T}")
            i += 1
            v = f"%u{i - 1}"
        older, prev = prev, v
        i += 1
    lines.append(f"  func.return {prev} : {T}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def measure(n_ops: int) -> tuple[float, float, float]:
    text = generate(n_ops)
    t0 = time.perf_counter()
    module = parse_module(text, "bench.tg")
    t1 = time.perf_counter()
    verify(module)
    t2 = time.perf_counter()
    out = print_module(module)
    t3 = time.perf_counter()
    assert out.count("\n") >= n_ops
    return t1 - t0, t2 - t1, t3 - t2


def wall_seconds(command: list[str], runs: int, fresh_cache: bool = False) -> float:
    """Median wall time of `runs` runs of `command` (after one untimed warm-up run); each run
    must succeed. With `fresh_cache`, every run gets a new empty XDG_CACHE_HOME."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs + 1):
            env = dict(os.environ, XDG_CACHE_HOME=f"{tmp}/{i}") if fresh_cache else None
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
            if i:
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def startup(runs: int) -> None:
    """tgc-opt and xdsl-opt on the same 10-op module, side by side."""
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        custom = Path(tmp, "ten.tg")
        custom.write_text(generate(10))
        generic = Path(tmp, "ten.mlir")
        generic.write_text(print_module(parse_module(custom.read_text(), str(custom)), True))
        tgc_opt = [str(bin_dir / "tgc-opt"), str(custom)]
        rows = [
            ("python -c pass", wall_seconds([sys.executable, "-c", "pass"], runs)),
            ("tgc-opt", wall_seconds(tgc_opt, runs)),
            ("tgc-opt, parser not cached", wall_seconds(tgc_opt, runs, fresh_cache=True)),
        ]
        xdsl = bin_dir / "xdsl-opt"
        if xdsl.exists():
            command = [str(xdsl), "--allow-unregistered-dialect", str(generic)]
            rows.append(("xdsl-opt (generic form)", wall_seconds(command, runs)))
    for name, seconds in rows:
        print(f"{name:<28} {seconds:>7.3f} s")
    if not xdsl.exists():
        print(f"{'xdsl-opt':<28} not installed beside {sys.executable}")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[1000, 10000, 100000])
    ap.add_argument("--runs", type=int, default=9, help="start-up runs per tool (median)")
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up comparison")
    args = ap.parse_args(argv)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    if not args.no_startup:
        print(f"# start-up on a 10-op module, median of {args.runs} runs, {machine}")
        startup(args.runs)
        print()
    parse_module(generate(10), "warmup.tg")  # build the Lark parser once, outside the timings
    print(f"# tgc front end, {machine}, Python {platform.python_version()}")
    print(
        f"{'ops':>8} {'parse s':>9} {'verify s':>9} {'print s':>9} {'total s':>9} {'ops/s':>9} "
        f"{'growth':>7}"
    )
    last = None
    for n in args.sizes:
        p, v, w = measure(n)
        total = p + v + w
        growth = f"{total / last:.1f}x" if last else ""
        print(f"{n:>8} {p:>9.3f} {v:>9.3f} {w:>9.3f} {total:>9.3f} {n / total:>9.0f} {growth:>7}")
        last = total


if __name__ == "__main__":
    main(sys.argv[1:])

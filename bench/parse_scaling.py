"""Front-end speed: parse, verify and print time for generated modules of N tensor ops.

    python bench/parse_scaling.py [N ...]        (default: 1000 10000 100000)

The module is one function with a GPT-2-like mix of ops (matmul, add, mul, exp, reduce, softmax,
transpose, reshape) over a few shapes, each op using recent values. Prints one row per size
and the growth factor of the total time between successive sizes.
"""

from __future__ import annotations

import platform
import sys
import time

from tgc.parser import parse_module
from tgc.printer import print_module
from tgc.verifier import verify

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
            lines.append(f"  {v} = atomic.reduce_sum {prev} {{axes = [1], keepdims = true}} : ({T}) -> {R}")
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


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [1000, 10000, 100000]
    parse_module(generate(10), "warmup.tg")  # build the Lark parser once, outside the timings
    print(f"# tgc front end, {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'ops':>8} {'parse s':>9} {'verify s':>9} {'print s':>9} {'total s':>9} {'ops/s':>9} {'growth':>7}")
    last = None
    for n in sizes:
        p, v, w = measure(n)
        total = p + v + w
        growth = f"{total / last:.1f}x" if last else ""
        print(f"{n:>8} {p:>9.3f} {v:>9.3f} {w:>9.3f} {total:>9.3f} {n / total:>9.0f} {growth:>7}")
        last = total


if __name__ == "__main__":
    main(sys.argv[1:])

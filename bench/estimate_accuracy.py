"""How well does the database's estimator predict shapes it never measured?

For each kernel family, measures the kernel (through the profiler's own `measure`: checked
against float64, warm-up, median of repeats) on a grid of shapes spanning a 100x range or more,
fits the estimator (`planner.estimate.Curve`) on every other shape and predicts the rest, and
prints the median and worst relative error of the predictions per family, with the curve's own
expected error (leave-one-out) beside them.

    python bench/estimate_accuracy.py [--backend numpy|cuda] [--min-time S] [--seed N] [--markdown]

Families: memory-bound kernels (add, exp, tanh, a row sum) over 2-D shapes whose rows grow
geometrically, and matmul over random (M, K, N). With `--backend numpy` (the default): numpy's
kernels, rows of 512, matmul sides in 48..768 (flops over a range of 4096x). With `--backend
cuda` (a GPU machine): PyTorch's CUDA kernels (torch-cuda) for the memory-bound families, rows
of 4096 (from launch-bound to bandwidth-bound), and cuBLAS (cuda.cublas.gemm) for matmul, sides
in 64..4096; GPU kernels are timed as the profiler times them (CUDA events, planner/profile.py).
The goal (issue 7): median under 15% for memory-bound kernels and GEMMs.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import time

import numpy as np

import tgc
from tgc.diagnostics import TgcError
from tgc.planner import load_backends
from tgc.planner.estimate import Curve, instance_bytes, instance_flops
from tgc.planner.kernel import KERNELS
from tgc.planner.profile import Instance, measure
from tgc.types import TensorType

F32 = "f32"


def t(*shape: int) -> TensorType:
    return TensorType.get(tuple(shape), F32)


def rows_grid(count: int = 16, low: int = 16, high: int = 4096) -> list[int]:
    """Geometric row counts from low to high (distinct, sorted)."""
    values = np.geomspace(low, high, count).round().astype(int)
    return sorted({int(v) for v in values})


# backend -> (the memory-bound kernels' prefix, their row width, the matmul kernel, its sides,
# the memory space of the values)
BACKENDS = {
    "numpy": (
        "numpy",
        512,
        "numpy.atomic.matmul",
        [48, 64, 96, 128, 192, 256, 384, 512, 768],
        None,
    ),
    "cuda": (
        "torch-cuda",
        4096,
        "cuda.cublas.gemm",
        [64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096],
        "cuda",
    ),
}


def memory_bound_families(prefix: str, width: int, space: str | None) -> dict[str, list[Instance]]:
    k = KERNELS
    out: dict[str, list[Instance]] = {"add": [], "exp": [], "tanh": [], "row sum": []}
    for r in rows_grid():
        x, row = t(r, width).with_encoding(space), t(r).with_encoding(space)
        out["add"].append(Instance(k[f"{prefix}.atomic.add"], (x, x), (x,)))
        out["exp"].append(Instance(k[f"{prefix}.atomic.exp"], (x,), (x,)))
        out["tanh"].append(Instance(k[f"{prefix}.hl.tanh"], (x,), (x,)))
        out["row sum"].append(
            Instance(
                k[f"{prefix}.atomic.reduce_sum"], (x,), (row,), {"axes": (1,), "keepdims": False}
            )
        )
    return out


def matmul_family(
    count: int, rng: random.Random, kernel: str, sides: list[int], space: str | None
) -> list[Instance]:
    seen, out = set(), []
    while len(out) < count:
        m, kk, n = (rng.choice(sides) for _ in range(3))
        if (m, kk, n) in seen:
            continue
        seen.add((m, kk, n))
        a, b, c = (t(*s).with_encoding(space) for s in ((m, kk), (kk, n), (m, n)))
        out.append(Instance(KERNELS[kernel], (a, b), (c,)))
    return out


def measured_points(insts: list[Instance], min_time: float) -> list[tuple[float, float, float]]:
    points = []
    for inst in insts:
        m = measure(inst, min_time)
        if not m.ok:
            raise SystemExit(f"{inst.describe()} failed its check: {m.message}")
        b = instance_bytes(inst.operand_types, inst.result_types)
        points.append(
            (b, instance_flops(inst.kernel, inst.operand_types, inst.result_types), m.median)
        )
    return points


def evaluate(points: list[tuple[float, float, float]], order_by_work: bool) -> dict:
    """Fit on every other point (in order of work), predict the others."""
    ordered = sorted(points, key=lambda p: (p[1], p[0])) if order_by_work else list(points)
    fit, held = ordered[0::2], ordered[1::2]
    curve = Curve(fit)
    errors = [abs(curve.predict(b, f)[0] - s) / s for b, f, s in held]
    times = [p[2] for p in points]
    return {
        "points": len(points),
        "fit": len(fit),
        "median": float(np.median(errors)),
        "worst": float(np.max(errors)),
        "expected": curve.error,
        "range": max(times) / min(times),
        "bytes range": max(p[0] for p in points) / min(p[0] for p in points),
    }


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-time", type=float, default=0.05, help="timed seconds per shape")
    ap.add_argument("--seed", type=int, default=0, help="seed of the matmul shapes")
    ap.add_argument("--matmuls", type=int, default=40, help="matmul shapes")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="numpy")
    args = ap.parse_args()
    tgc.load_all()
    prefix, width, matmul, sides, space = BACKENDS[args.backend]
    try:
        load_backends(["numpy"] if args.backend == "numpy" else ["cuda", "torch"], required=True)
    except TgcError as e:
        raise SystemExit(f"estimate_accuracy: {e.message}") from None
    families = memory_bound_families(prefix, width, space)
    families["matmul"] = matmul_family(args.matmuls, random.Random(args.seed), matmul, sides, space)
    start = time.time()
    results = {}
    for name, insts in families.items():
        results[name] = evaluate(measured_points(insts, args.min_time), name == "matmul")
        print(f"measured {name}: {len(insts)} shapes", file=sys.stderr)
    elapsed = time.time() - start
    from tgc.planner.db import cpu_description

    cpu = cpu_description()
    if args.backend == "cuda":
        import torch

        where = f"{torch.cuda.get_device_name()} (torch-cuda and cuBLAS), torch {torch.__version__}"
    else:
        where = (
            f"{cpu['cpu']} ({cpu['cores']} cores available), numpy {cpu['numpy']}, {cpu['blas']}"
        )
    print(
        f"device: {where}; python {platform.python_version()}; commit {commit()}; "
        f"{time.strftime('%Y-%m-%d')}; {elapsed:.0f} s; min-time {args.min_time} s; "
        f"threads {os.environ.get('OPENBLAS_NUM_THREADS', 'default')}"
    )
    header = (
        "family",
        "shapes",
        "fit on",
        "size range",
        "time range",
        "median error",
        "worst error",
        "expected",
    )
    rows = [
        (
            name,
            str(r["points"]),
            str(r["fit"]),
            f"{r['bytes range']:.0f}x",
            f"{r['range']:.0f}x",
            f"{r['median']:.1%}",
            f"{r['worst']:.1%}",
            f"{r['expected']:.1%}",
        )
        for name, r in results.items()
    ]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

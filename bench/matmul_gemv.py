"""tgc's few-rows matmul skeleton (codegen/matmul_gemv.cu.j2) on a decoding step's products,
beside cuBLAS (F.linear), torch.compile and the copy bandwidth, in one run on a GPU (PyTorch,
PyCUDA and nvcc there), from the repository root:

    python3 bench/matmul_gemv.py --commit <hash> [--rows 1,4,8,16] [--variants] [--out DIR]

Each case is C = A B^T, A [rows, k] N(0, 1), B [n, k] (a weight as nn.Linear stores it)
N(0, 1/k), bf16: the linear layers of a 1.1 B Llama (hidden 2048, intermediate 8192, gate and
up as one weight, vocabulary 32000), of a Llama-3-8B-sized one (4096, 14336, 128256) and
GPT-2's (768, c_attn and c_fc transposed). tgc's kernel is the region kernel of the product,
compiled and launched directly through PyCUDA on PyTorch's stream, its result checked against
PyTorch's in f64 (max error over max |reference|). The default column is the skeleton's
defaults (above 8 rows, which only its tensor-core variant takes, that variant's). Times are
medians of 30 CUDA-event timings after 3 warm-ups (`gpu_suite.time_ms`), with L2 holding
whatever the last call left (B is larger than L2 for every case but GPT-2's). Floor: the bytes
of A, B and C over the bandwidth of a 1 GiB device-to-device copy measured in the same run
(`gpu_suite.copy_bandwidth`). Writes <out>/matmul_gemv-<device>-<date>.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_suite import copy_bandwidth, report_start, time_ms, time_region_kernel  # noqa: E402

# (name, k, n)
WEIGHTS = [
    ("llama-1b q/k/v", 2048, 3072),
    ("llama-1b o", 2048, 2048),
    ("llama-1b gate+up", 2048, 16384),
    ("llama-1b down", 8192, 2048),
    ("llama-1b lm head", 2048, 32000),
    ("llama-8b q/k/v", 4096, 6144),
    ("llama-8b gate+up", 4096, 28672),
    ("llama-8b down", 14336, 4096),
    ("llama-8b lm head", 4096, 128256),
    ("gpt2 c_attn", 768, 2304),
    ("gpt2 c_fc", 768, 3072),
]
VARIANTS = [
    {"columns": 1, "unroll": 8},
    {"columns": 2, "unroll": 2},
    {"columns": 2, "unroll": 4},
    {"columns": 4, "unroll": 2},
    {"warps": 8},
    {"warps": 2},
    {"split_k": 1},  # every warp its own column (the default before split_k)
    {"split_k": 2},
    {"split_k": 4},
    {"split_k": 4, "warps": 8},
    {"split_k": 8, "warps": 8},
    {"split_k": 4, "unroll": 8},
    {"columns": 2, "split_k": 1},
    {"columns": 2, "split_k": 2},
    {"columns": 2, "split_k": 4},
    {"columns": 2, "split_k": 4, "warps": 8},
    {"columns": 2, "split_k": 8, "warps": 8},
    {"unroll": 8, "split_k": 2},
    {"unroll": 8, "split_k": 2, "warps": 8},
    {"unroll": 8, "split_k": 4, "warps": 8},
    {"gemv_mma": True},  # the tensor-core variant: 8 columns a block, its warps splitting k
    {"gemv_mma": True, "warps": 8},
    {"gemv_mma": True, "warps": 8, "unroll": 8},
    {"gemv_mma": True, "warps": 2, "unroll": 8},
]


def region_text(rows: int, k: int, n: int) -> str:
    a, b, o = f"tensor<{rows}x{k}xbf16>", f"tensor<{n}x{k}xbf16>", f"tensor<{rows}x{n}xbf16>"
    return "\n".join(
        [
            f"func.func @f(%a: {a}, %b: {b}) -> {o} {{",
            f"  %c = atomic.matmul %a, %b {{transpose_a = false, transpose_b = true}} : ({a}, {b}) -> {o}",
            f"  func.return %c : {o}",
            "}",
        ]
    )  # fmt: skip


def make_kernel(rows: int, k: int, n: int, params: dict):
    """The KernelSource of the product's region kernel (no GPU needed)."""
    import tgc
    from tgc.codegen.kernels import generate_kernel
    from tgc.pass_manager import PassManager
    from tgc.planner.backends.cuda_kernels import fused_from_block

    tgc.load_all()
    module = tgc.parse(region_text(rows, k, n))
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    fused = fused_from_block(func.body, list(func.function_type.results), "matmul", "mm", func.loc)
    return generate_kernel(fused, params)


def default_point(rows: int) -> dict:
    """The default column's parameters: the skeleton's defaults, its tensor-core variant's
    above the rows the CUDA-core one takes."""
    from tgc.codegen.matmul_gemv import GEMV_MAX_ROWS

    return {"gemv_mma": True} if rows > GEMV_MAX_ROWS else {}


def measure(rows, k, n, params, a, b, want) -> tuple[float, float]:
    """(median ms, error) of tgc's kernel with `params`."""
    import torch

    out = torch.empty((rows, n), device="cuda", dtype=a.dtype)
    return time_region_kernel(make_kernel(rows, k, n, params), [a, b], out, want)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", required=True)
    ap.add_argument("--rows", default="1,4,8,16", help="comma-separated row counts (<= 16)")
    ap.add_argument("--variants", action="store_true", help="also time the VARIANTS points")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from tgc.diagnostics import TgcError

    device = torch.cuda.get_device_name()
    bandwidth = copy_bandwidth(torch.cuda.current_stream())
    title = "tgc's few-rows matmul (gemv) vs cuBLAS"
    path, lines = report_start(Path(args.out), "matmul_gemv", title, device, args.commit)
    lines[-1] += f"; torch {torch.__version__}"
    lines += [
        "- method: `bench/matmul_gemv.py` (its doc); C = A B^T bf16, A [rows, k], B [n, k];",
        f"  copy bandwidth measured in the run: {bandwidth / 1e12:.2f} TB/s; floor = bytes / it",
        "",
        "| product | rows | tgc gemv (default) | best variant | cuBLAS (F.linear) | "
        "torch.compile | floor | tgc % of floor / cuBLAS's | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    from tgc.runtime.cuda_compile import load_kernels

    row_counts = [int(r) for r in args.rows.split(",")]
    # every kernel at once: nvcc runs in parallel (the loop below then finds them compiled)
    kernels = []
    for rows in row_counts:
        for point in [default_point(rows)] + (VARIANTS if args.variants else []):
            for _, k, n in WEIGHTS:
                try:
                    kernels.append(make_kernel(rows, k, n, {"gemv": True, **point}))
                except TgcError:  # a point that does not fit these rows: skipped below too
                    pass
    load_kernels(kernels)
    stream = torch.cuda.current_stream()
    for rows in row_counts:
        for name, k, n in WEIGHTS:
            gen = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
            want = F.linear(a.double(), b.double())
            ms, err = measure(rows, k, n, {"gemv": True, **default_point(rows)}, a, b, want)
            best = "-"
            if args.variants:
                timed = []
                for params in VARIANTS:
                    try:
                        timed.append(
                            (measure(rows, k, n, {"gemv": True, **params}, a, b, want), params)
                        )
                    except Exception as e:  # noqa: BLE001  (a point that does not fit: skipped)
                        print(f"{name} rows {rows} {params}: {e}", flush=True)
                (v_ms, v_err), v_params = min(timed, key=lambda t: t[0][0])
                best = f"{v_ms:.4f} ms {v_params} (error {v_err:.1e})"
                # every point's time on stdout (the report keeps the best)
                points = "; ".join(f"{v} {t[0]:.4f}" for t, v in timed)
                print(f"{name} rows {rows}: default {ms:.4f} ms; {points}", flush=True)
            blas = time_ms(lambda: F.linear(a, b), stream)
            compiled = torch.compile(lambda x, w: F.linear(x, w))  # its own cache a case
            compiled(a, b)
            comp = time_ms(lambda: compiled(a, b), stream)
            floor = 2 * (rows * k + n * k + rows * n) / bandwidth * 1e3
            line = (
                f"| {name} ({k} -> {n}) | {rows} | {ms:.4f} ms | {best} | {blas:.4f} ms | "
                f"{comp:.4f} ms | {floor:.4f} ms | {100 * floor / ms:.0f}% / "
                f"{100 * floor / blas:.0f}% | {err:.1e} |"
            )
            print(line, flush=True)
            lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tgc's few-rows matmul with a prologue (codegen/matmul.py `a_prologue`) on a decoding step's
norm-then-product and SiLU(gate) * up-then-down, and with the norm before and SiLU(gate) * up
after the packed gate+up product (its epilogue reading the product's halves, `_halves`), beside
PyTorch eager (the norm's kernels, then cuBLAS), torch.compile and the floor, in one run on a
GPU (PyTorch, PyCUDA and nvcc there), from the repository root:

    python3 bench/matmul_prologue.py --commit <hash> [--rows 1,4] [--out DIR]
    python3 bench/matmul_prologue.py --dry-run   # no GPU: every case's kernel generated

The cases are a 1.1 B Llama's (hidden 2048, intermediate 8192; q/k/v and gate+up packed as tgc
packs them) and a Llama-3-8B-sized one's (4096, 14336), bf16, inputs N(0, 1), weights N(0, 1/k).
tgc's kernel is the region kernel of the whole function (prologue, product, epilogue), launched
directly through PyCUDA on PyTorch's stream, its result checked against the PyTorch formula in
f64 (max error over max |reference|). Times are medians of 30 CUDA-event timings after 3
warm-ups (`gpu_suite.time_ms`). Floor: the bytes of the weight over the bandwidth of a 1 GiB
device-to-device copy measured in the same run. Writes <out>/matmul_prologue-<device>-<date>.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

EPS = 1e-6


def t(shape, dtype: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def rms_norm_text(rows: tuple[int, ...], k: int, n: int, dtype: str = "bf16") -> str:
    """Hugging Face's Llama RMSNorm (in f32, rounded, times its weight), then x @ W^T."""
    x, xf, r = t((*rows, k), dtype), t((*rows, k), "f32"), t((*rows, 1), "f32")
    o = t((*rows, n), dtype)
    return f"""func.func @f(%x: {x}, %w: {t((k,), dtype)}, %wt: {t((n, k), dtype)}) -> {o} {{
  %xf = atomic.cast %x : ({x}) -> {xf}
  %sq = atomic.mul %xf, %xf : ({xf}, {xf}) -> {xf}
  %mean = hl.mean %sq {{axes = [{len(rows)}], keepdims = true}} : ({xf}) -> {r}
  %eps = atomic.constant {{value = dense<{EPS:.1e}> : tensor<f32>}} : () -> tensor<f32>
  %a1 = atomic.add %mean, %eps : ({r}, tensor<f32>) -> {r}
  %rs = atomic.rsqrt %a1 : ({r}) -> {r}
  %n = atomic.mul %xf, %rs : ({xf}, {r}) -> {xf}
  %nb = atomic.cast %n : ({xf}) -> {x}
  %y = atomic.mul %w, %nb : ({t((k,), dtype)}, {x}) -> {x}
  %o = atomic.matmul %y, %wt {{transpose_b = true}} : ({x}, {t((n, k), dtype)}) -> {o}
  func.return %o : {o}
}}"""


def layer_norm_text(rows: tuple[int, ...], k: int, n: int) -> str:
    """A layer norm (two reductions: the mean, then the variance about it) before a product
    with a bias: GPT-2's ln_2 and c_fc at one token."""
    x, r, o = t((*rows, k), "f32"), t((*rows, 1), "f32"), t((*rows, n), "f32")
    g, w, b = t((k,), "f32"), t((n, k), "f32"), t((n,), "f32")
    axis = len(rows)
    return f"""func.func @f(%x: {x}, %g: {g}, %wt: {w}, %b: {b}) -> {o} {{
  %mu = hl.mean %x {{axes = [{axis}], keepdims = true}} : ({x}) -> {r}
  %d = atomic.sub %x, %mu : ({x}, {r}) -> {x}
  %d2 = atomic.mul %d, %d : ({x}, {x}) -> {x}
  %var = hl.mean %d2 {{axes = [{axis}], keepdims = true}} : ({x}) -> {r}
  %eps = atomic.constant {{value = dense<1.0e-05> : tensor<f32>}} : () -> tensor<f32>
  %v1 = atomic.add %var, %eps : ({r}, tensor<f32>) -> {r}
  %rs = atomic.rsqrt %v1 : ({r}) -> {r}
  %xn = atomic.mul %d, %rs : ({x}, {r}) -> {x}
  %y = atomic.mul %xn, %g : ({x}, {g}) -> {x}
  %c = atomic.matmul %y, %wt {{transpose_b = true}} : ({x}, {w}) -> {o}
  %cb = atomic.add %c, %b : ({o}, {b}) -> {o}
  func.return %cb : {o}
}}"""


def swiglu_text(rows: tuple[int, ...], inter: int, n: int) -> str:
    """SiLU(gate) * up from the packed gate+up product's halves, then the down projection and
    the residual add: a Llama MLP's last product at one token."""
    gu, h = t((*rows, 2 * inter), "bf16"), t((*rows, inter), "bf16")
    o, wd = t((*rows, n), "bf16"), t((n, inter), "bf16")
    axis = len(rows)
    return f"""func.func @f(%gu: {gu}, %wd: {wd}, %res: {o}) -> {o} {{
  %g, %u = atomic.split %gu {{axis = {axis}, sizes = [{inter}, {inter}]}} : ({gu}) -> ({h}, {h})
  %s = hl.silu %g : ({h}) -> {h}
  %m = atomic.mul %s, %u : ({h}, {h}) -> {h}
  %d = atomic.matmul %m, %wd {{transpose_b = true}} : ({h}, {wd}) -> {o}
  %r = atomic.add %res, %d : ({o}, {o}) -> {o}
  func.return %r : {o}
}}"""


# (name, kind, k or intermediate, n)
CASES = [
    ("llama-1b norm + q/k/v", "rms", 2048, 3072),
    ("llama-1b norm + gate+up", "rms", 2048, 16384),
    ("llama-1b silu*up + down + residual", "swiglu", 8192, 2048),
    ("llama-8b norm + q/k/v", "rms", 4096, 6144),
    ("llama-8b silu*up + down + residual", "swiglu", 14336, 4096),
    ("llama-1b norm + gate+up + silu*up", "gate_up", 2048, 8192),
    ("llama-8b norm + gate+up + silu*up", "gate_up", 4096, 14336),
]


def gate_up_text(rows: tuple[int, ...], k: int, inter: int) -> str:
    """The RMSNorm, the packed gate+up product and SiLU(gate) * up of its halves: the few-rows
    kernel's prologue and an epilogue reading the halves, one kernel."""
    gu, h = t((*rows, 2 * inter), "bf16"), t((*rows, inter), "bf16")
    norm = rms_norm_text(rows, k, 2 * inter).split("\n")
    return "\n".join(
        [
            norm[0].replace(f"-> {gu} {{", f"-> {h} {{"),
            *norm[1:-2],
            f"  %g, %u = atomic.split %o {{axis = {len(rows)}, sizes = [{inter}, {inter}]}} : "
            f"({gu}) -> ({h}, {h})",
            f"  %s = hl.silu %g : ({h}) -> {h}",
            f"  %m = atomic.mul %s, %u : ({h}, {h}) -> {h}",
            f"  func.return %m : {h}",
            "}",
        ]
    )


def case_text(kind: str, rows: int, k: int, n: int) -> str:
    return {"rms": rms_norm_text, "swiglu": swiglu_text, "gate_up": gate_up_text}[kind](
        (1, rows), k, n
    )


def weight_bytes(kind: str, k: int, n: int) -> int:
    """bf16 bytes of the product's weight: gate and up's two [n, k] for gate_up."""
    return 2 * n * k * (2 if kind == "gate_up" else 1)


def make_kernel(text: str):
    """The region kernel of the whole function on sm_90 (no GPU needed)."""
    import tgc
    from tgc.codegen.kernels import generate_kernel
    from tgc.pass_manager import PassManager
    from tgc.planner.backends.cuda_kernels import fused_from_block

    tgc.load_all()
    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    fused = fused_from_block(func.body, list(func.function_type.results), "matmul", "mm", func.loc)
    return generate_kernel(fused, {"arch": "sm_90"})


def torch_case(kind: str, rows: int, k: int, n: int):
    """(inputs in the function's order, the eager function of them)."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        x = torch.randn(*shape, device="cuda", generator=gen) * scale
        return x.to(torch.bfloat16)

    if kind == "rms":

        def f(x, w, wt):
            xf = x.float()
            y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
            return F.linear(w * y, wt)

        return [randn(1, rows, k), randn(k), randn(n, k, scale=k**-0.5)], f

    if kind == "gate_up":

        def h(x, w, wgu):
            xf = x.float()
            y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)
            gate, up = F.linear(w * y, wgu).split(n, -1)
            return F.silu(gate) * up

        return [randn(1, rows, k), randn(k), randn(2 * n, k, scale=k**-0.5)], h

    def g(gu, wd, res):
        gate, up = gu.split(k, -1)
        return res + F.linear(F.silu(gate) * up, wd)

    return [randn(1, rows, 2 * k), randn(n, k, scale=k**-0.5), randn(1, rows, n)], g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--rows", default="1,4", help="comma-separated row counts (<= 8)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--dry-run", action="store_true", help="generate every kernel, no GPU")
    args = ap.parse_args(argv)
    row_counts = [int(r) for r in args.rows.split(",")]
    kernels = {
        (name, rows): make_kernel(case_text(kind, rows, k, n))
        for name, kind, k, n in CASES
        for rows in row_counts
    }
    if args.dry_run:
        for (name, rows), kernel in kernels.items():
            print(f"{name}, {rows} row(s): {kernel.name} {kernel.params} grid {kernel.grid}")
        return 0
    import torch

    from gpu_suite import copy_bandwidth, report_start, time_ms, time_region_kernel
    from tgc.runtime.cuda_compile import load_kernels

    load_kernels(list(kernels.values()))  # nvcc in parallel
    stream = torch.cuda.current_stream()
    bandwidth = copy_bandwidth(stream)
    device = torch.cuda.get_device_name()
    title = "tgc's few-rows matmul with a prologue vs PyTorch"
    path, lines = report_start(Path(args.out), "matmul_prologue", title, device, args.commit)
    lines[-1] += f"; torch {torch.__version__}"
    lines += [
        "- method: `bench/matmul_prologue.py` (its doc); bf16; copy bandwidth measured in the "
        f"run: {bandwidth / 1e12:.2f} TB/s; floor = the weight's bytes / it",
        "",
        "| case | rows | tgc, one kernel | eager | torch.compile | floor | tgc % of floor | "
        "error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, kind, k, n in CASES:
        for rows in row_counts:
            inputs, f = torch_case(kind, rows, k, n)
            want = f(*[x.double() for x in inputs])
            out = torch.empty(tuple(want.shape), device="cuda", dtype=inputs[0].dtype)
            ms, err = time_region_kernel(kernels[(name, rows)], inputs, out, want)
            eager = time_ms(lambda: f(*inputs), stream)
            compiled = torch.compile(f)
            compiled(*inputs)
            comp = time_ms(lambda: compiled(*inputs), stream)
            weight = weight_bytes(kind, k, n)
            floor = weight / bandwidth * 1e3
            line = (
                f"| {name} ({k} -> {n}) | {rows} | {ms:.4f} ms | {eager:.4f} ms | "
                f"{comp:.4f} ms | {floor:.4f} ms | {100 * floor / ms:.0f}% | {err:.1e} |"
            )
            print(line, flush=True)
            lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Hopper skeleton of tgc's matmul template (codegen/matmul_wgmma.cu.j2) beside cuBLAS
(torch.mm), the mma.sync skeleton, and, for the fused epilogues, PyTorch eager and
torch.compile, in one run on an sm_90 GPU (PyTorch, PyCUDA and nvcc there), from the
repository root:

    python3 bench/matmul_wgmma.py --commit <hash> [--only WORD,...] [--variants] [--no-compile]
        [--out DIR]

Each tgc kernel is the region kernel the planner offers for the whole function (C = A @ B,
row-major, N(0, 1) inputs, then the epilogue), generated for sm_90 with the named template
parameters, compiled and launched directly through PyCUDA on PyTorch's stream (no executor,
no allocation in the timed loop), its output checked against PyTorch in f32 (max error over
max |reference|). Times are medians of 30 CUDA-event timings after 3 warm-ups
(`gpu_suite.time_ms`); TFLOP/s is 2 m n k over the median. Writes
<out>/matmul_wgmma-<device>-<date>.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_suite import report_start, tflops, time_ms, time_region_kernel  # noqa: E402

# (m, k, n): a square GEMM, GPT-2's four linear layers (8 x 1024 tokens), a wide one.
SHAPES = [(4096, 4096, 4096), (8192, 768, 3072), (8192, 3072, 768), (8192, 768, 2304),
          (8192, 768, 768), (2048, 2048, 8192)]  # fmt: skip
# Tile points tried beside the default with --variants.
VARIANTS = [
    {"block_m": 128, "block_n": 256},
    {"block_m": 128, "block_n": 192},
    {"block_m": 128, "block_n": 128},
    {"block_m": 256, "block_n": 128},
]
EPILOGUES = ("bias_gelu_tanh", "bias_gelu_erf", "residual", "residual_cast")
EPILOGUE_SHAPES = [(8192, 768, 3072), (4096, 4096, 4096)]


@dataclass(frozen=True)
class Case:
    m: int
    k: int
    n: int
    dtype: str
    epilogue: str = "none"

    @property
    def name(self) -> str:
        tail = "" if self.epilogue == "none" else f" + {self.epilogue}"
        return f"{self.m}x{self.k} @ {self.k}x{self.n} {self.dtype}{tail}"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def text(self) -> str:
        t = self.dtype
        a, b, o = (
            f"tensor<{self.m}x{self.k}x{t}>",
            f"tensor<{self.k}x{self.n}x{t}>",
            f"tensor<{self.m}x{self.n}x{t}>",
        )
        v = f"tensor<{self.n}x{t}>"
        args = [f"%a: {a}", f"%b: {b}"]
        lines = [
            f"  %c = atomic.matmul %a, %b {{transpose_a = false, transpose_b = false}} : ({a}, {b}) -> {o}"
        ]
        result, rtype = "%c", o
        if self.epilogue.startswith("bias"):
            args.append(f"%bias: {v}")
            approx = "tanh" if "tanh" in self.epilogue else "none"
            lines += [
                f"  %y = atomic.add %c, %bias : ({o}, {v}) -> {o}",
                f'  %g = hl.gelu %y {{approximate = "{approx}"}} : ({o}) -> {o}',
            ]
            result = "%g"
        if self.epilogue.startswith("residual"):
            args.append(f"%res: {o}")
            lines.append(f"  %r = atomic.add %c, %res : ({o}, {o}) -> {o}")
            result = "%r"
        if self.epilogue == "residual_cast":
            rtype = f"tensor<{self.m}x{self.n}xf32>"
            lines.append(f"  %f = atomic.cast %r : ({o}) -> {rtype}")
            result = "%f"
        return "\n".join(
            [f"func.func @f({', '.join(args)}) -> {rtype} {{", *lines, f"  func.return {result} : {rtype}", "}"]
        )  # fmt: skip

    def torch_fn(self, a, b, extra):
        """The same function in PyTorch (eager)."""
        import torch
        import torch.nn.functional as F

        def f(a, b, *extra):
            c = torch.mm(a, b)
            if self.epilogue.startswith("bias"):
                approx = "tanh" if "tanh" in self.epilogue else "none"
                return F.gelu(c + extra[0], approximate=approx)
            if self.epilogue.startswith("residual"):
                c = c + extra[0]
                return c.float() if self.epilogue == "residual_cast" else c
            return c

        return f


def make_kernel(case: Case, params: dict):
    """The KernelSource of the region kernel of `case` on sm_90 (no GPU needed)."""
    import tgc
    from tgc.codegen.kernels import generate_kernel
    from tgc.pass_manager import PassManager
    from tgc.planner.backends.cuda_kernels import fused_from_block

    tgc.load_all()
    module = tgc.parse(case.text())
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    fused = fused_from_block(func.body, list(func.function_type.results), "matmul", "mm", func.loc)
    return generate_kernel(fused, {"arch": "sm_90", **params})


def measure(case: Case, params: dict, inputs, want) -> tuple[float, float, dict]:
    """(median ms, error, the kernel's parameters) of tgc's kernel with `params`."""
    import torch

    kernel = make_kernel(case, {"wgmma": True, **params})
    out_dtype = torch.float32 if case.epilogue == "residual_cast" else inputs[0].dtype
    out = torch.empty((case.m, case.n), device="cuda", dtype=out_dtype)
    ms, error = time_region_kernel(kernel, inputs, out, want)
    chosen = {k: kernel.params[k] for k in ("block_m", "block_n", "stages") if k in kernel.params}
    return ms, error, chosen


def torch_compile_ms(case: Case, inputs) -> float | None:
    import torch

    try:
        fn = torch.compile(case.torch_fn(*inputs[:2], inputs[2:]))
        fn(*inputs)
        return time_ms(lambda: fn(*inputs), torch.cuda.current_stream())
    except Exception as e:  # noqa: BLE001  (a compile failure is a missing column, not a crash)
        print(f"torch.compile failed for {case.name}: {e}", flush=True)
        return None


def make_inputs(case: Case):
    import torch

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[case.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(case.m, case.k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(case.k, case.n, device="cuda", dtype=dtype, generator=gen) / case.k**0.5
    extra = []
    if case.epilogue.startswith("bias"):
        extra.append(torch.randn(case.n, device="cuda", dtype=dtype, generator=gen))
    if case.epilogue.startswith("residual"):
        extra.append(torch.randn(case.m, case.n, device="cuda", dtype=dtype, generator=gen))
    return [a, b, *extra]


def cases(only: str) -> tuple[list[Case], list[Case]]:
    """The plain GEMMs and those with epilogues whose names hold every word of `only`."""
    plain = [Case(m, k, n, "bf16") for m, k, n in SHAPES] + [Case(4096, 4096, 4096, "f16")]
    fused = [Case(m, k, n, "bf16", e) for m, k, n in EPILOGUE_SHAPES for e in EPILOGUES]
    words = set(filter(None, only.split(",")))
    return tuple([c for c in group if all(w in c.name for w in words)] for group in (plain, fused))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", required=True)
    ap.add_argument("--only", default="", help="comma-separated words a case's name must hold")
    ap.add_argument("--variants", action="store_true", help="also time the VARIANTS tiles")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    import torch

    plain, fused = cases(args.only)
    device = torch.cuda.get_device_name()
    title = "tgc's Hopper matmul skeleton (wgmma) vs cuBLAS"
    path, lines = report_start(Path(args.out), "matmul_wgmma", title, device, args.commit)
    lines[-1] += f"; torch {torch.__version__}"
    lines += [
        "- method: `bench/matmul_wgmma.py`; C = A @ B row-major (A N(0, 1), B N(0, 1/k)); tgc's",
        "  region kernel launched directly (PyCUDA, PyTorch's stream); medians of 30 CUDA-event",
        "  timings after 3 warm-ups; error: max |tgc - torch (f64 of its result)| / max |torch|",
        "",
        "## Plain GEMMs",
        "",
        "| GEMM | wgmma, TMA copies (tile, stages) | wgmma, cp.async | mma.sync template | "
        "cuBLAS (torch.mm) | TFLOP/s TMA / cp.async / mma.sync / cuBLAS | TMA % of cuBLAS | "
        "error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    stream = torch.cuda.current_stream()
    for case in plain:
        inputs = make_inputs(case)
        want = torch.mm(*inputs).double()
        blas_ms = time_ms(lambda: torch.mm(*inputs), stream)
        points = [{"tma": True}] + [{"tma": True, **v} for v in VARIANTS if args.variants]
        for i, params in enumerate(points):
            try:
                ms, err, chosen = measure(case, params, inputs, want)
            except Exception as e:  # noqa: BLE001  (a point that does not fit is a row saying so)
                print(f"{case.name} {params}: {e}", flush=True)
                continue
            # the first point beside the cp.async producer and the mma.sync skeleton
            others = [{"tma": False}, {"wgmma": False}] if i == 0 else []
            other_ms = [measure(case, {**params, **o}, inputs, want)[0] for o in others]
            cells = [f"{x:.4f} ms" for x in other_ms] or ["-", "-"]
            rates = " / ".join(f"{tflops(case.flops, x):.0f}" for x in (ms, *other_ms))
            rates += " / - / -" if not other_ms else ""
            tile = f"{chosen['block_m']}x{chosen['block_n']}, {chosen['stages']}"
            line = (
                f"| {case.name}{'' if i == 0 else ' (variant)'} | {ms:.4f} ms ({tile}) | "
                f"{' | '.join(cells)} | {blas_ms:.4f} ms | {rates} / "
                f"{tflops(case.flops, blas_ms):.0f} | {100 * blas_ms / ms:.0f}% | {err:.1e} |"
            )
            print(line, flush=True)
            lines.append(line)
    lines += [
        "",
        "## Fused epilogues (one tgc kernel; PyTorch eager: cuBLAS then elementwise kernels)",
        "",
        "| GEMM + epilogue | tgc wgmma | torch eager | torch.compile | TFLOP/s tgc / eager / "
        "compile | tgc % of eager / of compile | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in fused:
        inputs = make_inputs(case)
        eager = case.torch_fn(*inputs[:2], inputs[2:])
        want = eager(*inputs).double()
        eager_ms = time_ms(lambda: eager(*inputs), stream)
        compile_ms = None if args.no_compile else torch_compile_ms(case, inputs)
        ms, err, chosen = measure(case, {"tma": True}, inputs, want)
        cms = "-" if compile_ms is None else f"{compile_ms:.4f} ms"
        crate = "-" if compile_ms is None else f"{tflops(case.flops, compile_ms):.0f}"
        cpct = "-" if compile_ms is None else f"{100 * compile_ms / ms:.0f}%"
        line = (
            f"| {case.name} | {ms:.4f} ms | {eager_ms:.4f} ms | {cms} | "
            f"{tflops(case.flops, ms):.0f} / {tflops(case.flops, eager_ms):.0f} / {crate} | "
            f"{100 * eager_ms / ms:.0f}% / {cpct} | {err:.1e} |"
        )
        print(line, flush=True)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

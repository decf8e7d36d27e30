"""The generated matmul template (what the standalone .cu runs, without cuBLAS) against
torch.mm, in bf16 and f16 (issue 8: "the standalone .cu must not need cuBLAS to be fast").

On a GPU machine (PyTorch, PyCUDA and nvcc there), from the repository root:

    python3 bench/matmul_tc.py [--only bf16,4096,...] [--params block_k=16,...] [--out DIR]

Each case is C = A @ B (A m x k, B k x n, row-major, N(0, 1)) planned on tgc's generated
kernels alone (`gpu_suite.generated_plan`: no cuBLAS) and run by the planner's executor: the
template's SIMT skeleton (`tensor_cores=false`) and its tensor-core skeleton
(`tensor_cores=true`, plus `--params`). Each result is checked against
torch.mm's (max error relative to the largest |torch result|), then timed by
`gpu_suite.time_ms` (median of 30 CUDA-event timings after 3 warm-ups). TFLOP/s is 2 m n k over
the median. Writes bench/results/matmul_tc-<device>-<date>.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from attention_tc import parse_params  # noqa: E402
from gpu_suite import report_start, tflops  # noqa: E402

# (m, k, n): a square GEMM and the GPT-2 block's four (batch 8 x 1024 tokens).
SHAPES = [(4096, 4096, 4096), (8192, 768, 2304), (8192, 768, 768), (8192, 768, 3072),
          (8192, 3072, 768)]  # fmt: skip


@dataclass(frozen=True)
class Case:
    m: int
    k: int
    n: int
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.m}x{self.k} @ {self.k}x{self.n} {self.dtype}"

    def text(self) -> str:
        a, b, c = (f"tensor<{r}x{s}x{self.dtype}>" for r, s in
                   ((self.m, self.k), (self.k, self.n), (self.m, self.n)))  # fmt: skip
        return (
            f"func.func @mm(%a: {a}, %b: {b}) -> {c} {{\n"
            f"  %c = atomic.matmul %a, %b {{transpose_a = false, transpose_b = false}} : "
            f"({a}, {b}) -> {c}\n"
            f"  func.return %c : {c}\n}}"
        )


def measure(case: Case, params: dict, a, b, want) -> tuple[float, float]:
    """(median ms, max error relative to max |want|) of the template with `params`."""
    import torch
    from gpu_suite import checked_result, generated_plan, time_ms

    from tgc.planner import load_backends
    from tgc.planner.backends import cuda_kernels as ck
    from tgc.planner.executor import PlannedFunction

    load_backends(("cuda",), required=True)
    program = PlannedFunction(generated_plan(case.text(), params, ck.TARGET["arch"]))
    (out,) = program([a, b])
    got = checked_result(out).double()
    error = float((got - want.double()).abs().max() / want.double().abs().max())
    return time_ms(lambda: program([a, b]), torch.cuda.current_stream()), error


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated words a case's name must hold")
    ap.add_argument("--commit", default=os.environ.get("TGC_COMMIT", "unknown"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--params", default="", help="tensor-core template parameters, k=v,k=v")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    cases = [Case(m, k, n, t) for (m, k, n) in SHAPES for t in ("bf16", "f16")]
    cases = [c for c in cases if all(w in c.name.split() or w in c.name for w in only)]

    import torch
    from gpu_suite import time_ms

    device = torch.cuda.get_device_name()
    tc_params = {"tensor_cores": True, **parse_params(args.params)}
    title = "tgc's generated matmul template vs torch.mm"
    path, lines = report_start(Path(args.out), "matmul_tc", title, device, args.commit)
    lines += [
        "- method: `bench/matmul_tc.py`; C = A @ B row-major, N(0, 1) inputs; planned on tgc's",
        "  generated kernels alone (no cuBLAS); medians of 30 CUDA-event timings after 3 warm-ups; error: max",
        "  |tgc - torch.mm| / max |torch.mm|",
        f"- tensor-core parameters: {tc_params}",
        "",
        "| GEMM | SIMT template | tensor-core template | torch.mm | TFLOP/s: SIMT / tc / torch "
        "| tc speed / torch's | error SIMT / tc |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[case.dtype]
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(case.m, case.k, device="cuda", dtype=dtype, generator=gen)
        b = torch.randn(case.k, case.n, device="cuda", dtype=dtype, generator=gen)
        want = a @ b
        stream = torch.cuda.current_stream()
        torch_ms = time_ms(lambda: torch.mm(a, b), stream)
        simt_ms, simt_err = measure(case, {"tensor_cores": False}, a, b, want)
        tc_ms, tc_err = measure(case, tc_params, a, b, want)
        flops = 2.0 * case.m * case.n * case.k
        line = (
            f"| {case.name} | {simt_ms:.4f} ms | {tc_ms:.4f} ms | {torch_ms:.4f} ms | "
            f"{tflops(flops, simt_ms):.0f} / {tflops(flops, tc_ms):.0f} / "
            f"{tflops(flops, torch_ms):.0f} | {100 * torch_ms / tc_ms:.0f}% | "
            f"{simt_err:.1e} / {tc_err:.1e} |"
        )
        print(line, flush=True)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

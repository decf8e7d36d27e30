"""tgc's tensor-core attention kernel against PyTorch's F.scaled_dot_product_attention (issue 8).

On a GPU machine (PyTorch, PyCUDA and nvcc there), from the repository root:

    python3 bench/attention_tc.py [--only bf16,causal,...] [--commit HASH] [--out bench/results]

Shapes B8 H16 S2048 D64 and B4 H32 S4096 D128, causal and not, bf16 and f16: q, k, v drawn once
on the GPU (N(0, 1)), (B, H, S, D) contiguous; tgc runs `hl.attention` as its generated kernel
(planned on tgc's generated kernels alone, `gpu_suite.generated_plan`, for the device) through
the planner's executor (its output checked against SDPA's: relative Frobenius error), then both
are timed by `gpu_suite.time_ms` (CUDA events around each of 30
repetitions after 3 warm-ups, a sleep kernel queued first; the median). TFLOP/s counts
4 B H Sq Sk D flops, half of them for causal. Writes
bench/results/attention_tc-<device>-<date>.md.

    python3 bench/attention_tc.py --dry-run [--arch sm_90]

needs no GPU: generates every kernel and compiles it with nvcc (a CPU test runs this).
`--params rows_per_warp=1,q_in_registers=true` passes template parameters to the kernel;
several sets separated by `;` (`--params "block_n=64;block_n=128,pingpong=true"`) measure
every case with each (a sweep: the report gets a parameters column; not with --decode).

    python3 bench/attention_tc.py --grid [--only D72,...] [--dry-run]

runs issue 24's grid instead: bf16, 32 query heads, head dims 64, 72, 80, 96, 128 and 256,
sequences of 512, 2048 and 8192 positions (batch 16, 4 and 1: 8k tokens each), causal and
full, and at head dims 64 and 128 grouped-query attention over 4 key-value heads (8:1), each
repeated as Hugging Face's `repeat_kv` writes it (SDPA takes them with `enable_gqa=True`).
The report's kernel column says where tgc's kernel is the exact f32 one (no tensor cores).

    python3 bench/attention_tc.py --decode [--dry-run]

times decode attention instead (issue 24, item 2): one new token per sequence against a KV
cache of 2k, 8k and 32k positions, batch 1 and 16, head dims 64 and 128, bf16, 32 query heads
over 8 key-value heads. tgc's `hl.attention` takes each key-value head's 4 query heads as 4
query rows, q (B, 8, 4, D) against k, v (B, 8, S, D), unmasked (the whole cache is the past);
SDPA takes q (B, 32, 1, D) with `enable_gqa=True`. A decode step is memory-bound: the report
gives each time's bandwidth (the bytes of k and v, read once, and of q and o) as a share of the
device-to-device copy bandwidth measured in the same run (`gpu_suite.copy_bandwidth`); the
issue asks 85% on these caches.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# bench/ is on the path only now; the shapes and texts are gpu_suite's attention rows'.
from gpu_suite import ATTENTION_SHAPES as SHAPES  # noqa: E402
from gpu_suite import attention_flops, attention_text, report_start, tflops  # noqa: E402

DECODE_HEADS, DECODE_KV_HEADS = 32, 8
DECODE_CACHES = (2048, 8192, 32768)
# bench/decode_step.py's cache at batch 1 (a prompt of 512 and the calls after it): a launch's
# fixed costs against a read of under a megabyte
STEP_CACHE = 640


@dataclass
class Case:
    b: int
    h: int
    s: int
    d: int
    causal: bool
    dtype: str
    kv_heads: int = 0  # fewer key-value heads than query heads (grouped-query); 0: h

    @property
    def name(self) -> str:
        mode = "causal" if self.causal else "full"
        heads = f"H{self.h}/{self.kv_heads} GQA" if self.kv_heads else f"H{self.h}"
        return f"B{self.b} {heads} S{self.s} D{self.d} {mode} {self.dtype}"

    @property
    def flops(self) -> float:
        return attention_flops(self.b, self.h, self.s, self.d, self.causal)

    def text(self) -> str:
        if not self.kv_heads:
            return attention_text(self.b, self.h, self.s, self.d, self.causal, self.dtype)
        return gqa_text(self.b, self.h, self.kv_heads, self.s, self.d, self.causal, self.dtype)


def gqa_text(b: int, h: int, kv: int, s: int, d: int, causal: bool, dtype: str) -> str:
    """`hl.attention` of h query heads over kv key-value heads, each repeated h // kv times as
    Hugging Face's `repeat_kv` writes it (reshape, broadcast, reshape): the kernels read the
    repeated heads by index, never a copy."""
    g = h // kv
    q, c = f"tensor<{b}x{h}x{s}x{d}x{dtype}>", f"tensor<{b}x{kv}x{s}x{d}x{dtype}>"
    one, many = f"tensor<{b}x{kv}x1x{s}x{d}x{dtype}>", f"tensor<{b}x{kv}x{g}x{s}x{d}x{dtype}>"
    lines = [f"func.func @attention(%q: {q}, %k: {c}, %v: {c}) -> {q} {{"]
    for x in "kv":
        lines += [
            f"  %{x}1 = atomic.reshape %{x} : ({c}) -> {one}",
            f"  %{x}g = atomic.broadcast %{x}1 : ({one}) -> {many}",
            f"  %{x}h = atomic.reshape %{x}g : ({many}) -> {q}",
        ]
    attrs = " {causal = true}" if causal else ""
    lines += [
        f"  %y = hl.attention %q, %kh, %vh{attrs} : ({q}, {q}, {q}) -> {q}",
        f"  func.return %y : {q}",
        "}",
    ]
    return "\n".join(lines)


@dataclass
class DecodeCase:
    """One new token per sequence against a cache of `s` positions (module doc)."""

    b: int
    s: int
    d: int
    dtype: str = "bf16"

    @property
    def group(self) -> int:
        return DECODE_HEADS // DECODE_KV_HEADS

    @property
    def name(self) -> str:
        return (
            f"decode B{self.b} H{DECODE_HEADS}/{DECODE_KV_HEADS} S{self.s} D{self.d} {self.dtype}"
        )

    @property
    def bytes(self) -> float:
        """k and v read once, q read and o written once."""
        item = 2
        cache = 2 * self.b * DECODE_KV_HEADS * self.s * self.d
        return item * (cache + 2 * self.b * DECODE_HEADS * self.d)

    def text(self) -> str:
        q = f"tensor<{self.b}x{DECODE_KV_HEADS}x{self.group}x{self.d}x{self.dtype}>"
        kv = f"tensor<{self.b}x{DECODE_KV_HEADS}x{self.s}x{self.d}x{self.dtype}>"
        return (
            f"func.func @decode(%q: {q}, %k: {kv}, %v: {kv}) -> {q} {{\n"
            f"  %y = hl.attention %q, %k, %v : ({q}, {kv}, {kv}) -> {q}\n"
            f"  func.return %y : {q}\n}}"
        )


def named(found: list, only: set[str]) -> list:
    """The cases of `found` whose names hold every word of `only`."""
    return [c for c in found if all(word in c.name.split() for word in only)]


def decode_cases(only: set[str]) -> list[DecodeCase]:
    found = [DecodeCase(b, s, d) for b in (1, 16) for s in DECODE_CACHES for d in (64, 128)]
    found += [DecodeCase(b, DECODE_CACHES[-1], d, "f16") for b in (1, 16) for d in (64, 128)]
    found.append(DecodeCase(1, STEP_CACHE, 64))
    return named(found, only)


def cases(only: set[str]) -> list[Case]:
    found = [
        Case(b, h, s, d, causal, dtype)
        for (b, h, s, d) in SHAPES
        for causal in (True, False)
        for dtype in ("bf16", "f16")
    ]
    return named(found, only)


# Issue 24's grid: head dims, sequence lengths (each batch making 8k tokens), 32 query heads,
# and grouped-query attention 8:1 at the head dims of Llama-family models
GRID_HEAD_DIMS = (64, 72, 80, 96, 128, 256)
GRID_SEQUENCES = ((16, 512), (4, 2048), (1, 8192))
GRID_HEADS, GRID_GQA_KV_HEADS = 32, 4


def grid_cases(only: set[str]) -> list[Case]:
    found = [
        Case(b, GRID_HEADS, s, d, causal, "bf16", kv)
        for d in GRID_HEAD_DIMS
        for kv in ((0, GRID_GQA_KV_HEADS) if d in (64, 128) else (0,))
        for b, s in GRID_SEQUENCES
        for causal in (True, False)
    ]
    return named(found, only)


def kernels_of(case: Case, params: dict | None = None, arch: str | None = None):
    """The generated kernels of `case`'s plan for a GPU of `arch` (gpu_suite.generated_plan),
    without a GPU."""
    from gpu_suite import generated_plan

    from tgc.codegen.kernels import generate_kernel
    from tgc.planner.backends import cuda_kernels as ck

    func = generated_plan(case.text(), params, arch)
    calls = [op for op in func.body.ops if op.name == "kernel.call"]
    with ck.planning_kernels(arch):  # the templates the calls name
        return [generate_kernel(ck.fused_from_call(op), ck.call_params(op)) for op in calls]


def dry_run(selected: list[Case], arch: str, params: dict) -> int:
    """Generate and compile every kernel (nvcc -cubin, the executor's options)."""
    from tgc.codegen.render import prelude

    nvcc = "nvcc"
    # Planned one after the other (planning registers the CUDA kernels for the while), then
    # compiled in parallel.
    kernels = [kernels_of(case, params, arch)[0] for case in selected]

    def build(item) -> str:
        case, k = item
        with tempfile.TemporaryDirectory(prefix="tgc-attention-tc-") as tmp:
            src = Path(tmp) / "k.cu"
            src.write_text(prelude() + "\n" + k.source)
            proc = subprocess.run(
                [
                    nvcc,
                    "-cubin",
                    *k.nvcc_target(arch),
                    "-O3",
                    "-std=c++17",
                    "-o",
                    f"{tmp}/k.cubin",
                    src,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
        if proc.returncode != 0:
            return f"{case.name}: nvcc failed:\n{proc.stderr[-2000:]}"
        tc = "tensor cores" if k.params.get("tensor_cores") else "f32 kernel"
        return (
            f"{case.name}: compiled for {arch} ({tc}, grid {k.grid[0]}, "
            f"{k.shared_bytes} bytes of shared memory)"
        )

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        lines = list(pool.map(build, zip(selected, kernels)))
    print("\n".join(lines), flush=True)
    return 0 if all("compiled" in line for line in lines) else 1


@dataclass
class Row:
    case: Case | DecodeCase
    tgc_ms: float
    sdpa_ms: float
    error: float
    shared_bytes: int
    tensor_cores: bool
    kernel: str = ""  # what ran, where the report says more than the tensor-core flag
    params: str = ""  # the template parameters of a sweep's row (--params with `;`)


def rel_frobenius(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def compile_all(runs: list[tuple]) -> None:
    """The kernels of every (case, template parameters) of `runs` compiled at once, in parallel,
    into the executor's cache (the cuda backend's compile_regions), so that measuring does not
    wait on nvcc once per case: the grid's 48 kernels took over 5 minutes one after the other."""
    from gpu_suite import generated_plan

    from tgc.planner import load_backends
    from tgc.planner.backends import cuda
    from tgc.planner.backends import cuda_kernels as ck

    load_backends(("cuda",), required=True)
    funcs = [generated_plan(case.text(), params, ck.TARGET["arch"]) for case, params in runs]
    cuda.compile_regions([op for f in funcs for op in f.body.ops if op.name == "kernel.call"])


def measure(case: Case, params: dict) -> Row:
    import torch
    import torch.nn.functional as F
    from gpu_suite import checked_result, generated_plan, time_ms

    from tgc.planner import load_backends
    from tgc.planner.backends import cuda_kernels as ck
    from tgc.planner.executor import PlannedFunction

    load_backends(("cuda",), required=True)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[case.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (case.b, case.h, case.s, case.d)
    kv_shape = (case.b, case.kv_heads or case.h, case.s, case.d)
    q = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(kv_shape, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    gqa = bool(case.kv_heads)
    func = generated_plan(case.text(), params, ck.TARGET["arch"])
    (kernel,) = kernels_of(case, params, ck.TARGET["arch"])
    program = PlannedFunction(func)
    stream = torch.cuda.current_stream()

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    want = sdpa()
    torch.cuda.synchronize()
    (out,) = program([q, k, v])
    error = rel_frobenius(checked_result(out), want)
    tgc_ms = time_ms(lambda: program([q, k, v]), stream)
    sdpa_ms = time_ms(sdpa, stream)
    return Row(
        case, tgc_ms, sdpa_ms, error, kernel.shared_bytes, bool(kernel.params.get("tensor_cores"))
    )


def measure_decode(case: DecodeCase, params: dict) -> Row:
    """tgc's generated kernel and SDPA on one decode case (module doc); Row.case is `case`."""
    import torch
    import torch.nn.functional as F
    from gpu_suite import checked_result, generated_plan, time_ms

    from tgc.planner import load_backends
    from tgc.planner.backends import cuda_kernels as ck
    from tgc.planner.executor import PlannedFunction

    load_backends(("cuda",), required=True)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[case.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((case.b, DECODE_HEADS, 1, case.d), device="cuda", dtype=dtype, generator=gen)
    kv = (case.b, DECODE_KV_HEADS, case.s, case.d)
    k, v = (torch.randn(kv, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    # query head h reads key-value head h // group (SDPA's enable_gqa): the group's heads are
    # the query rows of its key-value head
    rows = q.reshape(case.b, DECODE_KV_HEADS, case.group, case.d).contiguous()
    func = generated_plan(case.text(), params, ck.TARGET["arch"])
    (kernel,) = kernels_of(case, params, ck.TARGET["arch"])
    program = PlannedFunction(func)
    stream = torch.cuda.current_stream()

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    want = sdpa().reshape(rows.shape)
    torch.cuda.synchronize()
    (out,) = program([rows, k, v])
    error = rel_frobenius(checked_result(out), want)
    tgc_ms = time_ms(lambda: program([rows, k, v]), stream)
    sdpa_ms = time_ms(sdpa, stream)
    what = (
        f"decode, {kernel.params['splits']} splits, grid {kernel.grid[0]}"
        if kernel.params.get("decode")
        else f"flash, grid {kernel.grid[0]}"
    )
    return Row(
        case,
        tgc_ms,
        sdpa_ms,
        error,
        kernel.shared_bytes,
        bool(kernel.params.get("tensor_cores")),
        what,
    )


def report_decode(
    rows: list[Row], device: str, commit: str, out: Path, bandwidth: float, params: str
) -> Path:
    title = "Decode attention, tgc's generated kernel vs SDPA"
    path, lines = report_start(out, "attention_decode", title, device, commit)
    lines += [
        "- method: `bench/attention_tc.py --decode` (its doc); medians of 30 repetitions timed",
        "  with CUDA events after 3 warm-ups (`gpu_suite.time_ms`)",
        f"- template parameters: {params or 'defaults'}",
        f"- bandwidth: the bytes of k, v, q and o over the time, as a share of the device's "
        f"copy bandwidth measured in the same run ({bandwidth / 1e12:.2f} TB/s)",
        "",
        "| workload | tgc | of bandwidth | SDPA | of bandwidth | tgc speed / SDPA's | rel. error | "
        "kernel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = [r.case.bytes / (ms * 1e-3) / bandwidth for ms in (r.tgc_ms, r.sdpa_ms)]
        kernel = r.kernel or ("tensor cores" if r.tensor_cores else "f32")
        lines.append(
            f"| {r.case.name} | {r.tgc_ms:.4f} ms | {share[0]:.0%} | {r.sdpa_ms:.4f} ms | "
            f"{share[1]:.0%} | {100 * r.sdpa_ms / r.tgc_ms:.0f}% | {r.error:.1e} | {kernel} |"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def report(
    rows: list[Row],
    device: str,
    commit: str,
    out: Path,
    params: dict | str,
    stem: str = "attention_tc",
) -> Path:
    title = "tgc tensor-core attention vs SDPA"
    path, lines = report_start(out, stem, title, device, commit)
    lines += [
        "- method: `bench/attention_tc.py`; q, k, v N(0, 1), (B, H, S, D) contiguous; medians of 30",
        "  repetitions timed with CUDA events after 3 warm-ups (`gpu_suite.time_ms`); SDPA is",
        "  `F.scaled_dot_product_attention` with PyTorch's own backend choice",
        "- TFLOP/s: 4 B H S^2 D flops (half for causal) over the median time; error: relative",
        "  Frobenius norm of tgc's result minus SDPA's",
        f"- template parameters: {params or 'defaults'}",
        "",
        "| workload | tgc | TFLOP/s | SDPA | TFLOP/s | tgc speed / SDPA's | rel. error | kernel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        kernel = "tensor cores" if r.tensor_cores else "f32"
        name = f"{r.case.name} [{r.params}]" if r.params else r.case.name
        lines.append(
            f"| {name} | {r.tgc_ms:.4f} ms | {tflops(r.case.flops, r.tgc_ms):.0f} | "
            f"{r.sdpa_ms:.4f} ms | {tflops(r.case.flops, r.sdpa_ms):.0f} | "
            f"{100 * r.sdpa_ms / r.tgc_ms:.0f}% | {r.error:.1e} | {kernel}, "
            f"{r.shared_bytes} B shared |"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_params(text: str) -> dict:
    """`k=v,k=v` -> {k: v}: integers as int, true/false as bool."""
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        low = value.strip().lower()
        out[key.strip()] = low == "true" if low in ("true", "false") else int(value)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="generate and compile only (no GPU)")
    ap.add_argument("--arch", default="sm_90", help="nvcc's -arch for --dry-run")
    ap.add_argument("--only", default="", help="comma-separated words a case's name must hold")
    ap.add_argument("--commit", default=os.environ.get("TGC_COMMIT", "unknown"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument(
        "--params", default="", help="template parameters, k=v,k=v; sets separated by ; sweep"
    )
    ap.add_argument("--decode", action="store_true", help="the decode cases (module doc)")
    ap.add_argument("--grid", action="store_true", help="issue 24's grid of cases (module doc)")
    args = ap.parse_args(argv)
    texts = args.params.split(";") if ";" in args.params else [args.params]
    sweep = [(text.strip(), parse_params(text)) for text in texts]
    params = sweep[0][1]
    only = set(filter(None, args.only.split(",")))
    if args.decode and args.grid:
        ap.error("--decode and --grid are two sets of cases: give one")
    if args.decode and len(sweep) > 1:
        ap.error("--params takes one set of template parameters with --decode")
    selected = (decode_cases if args.decode else grid_cases if args.grid else cases)(only)
    if not selected:
        print("no case matches --only", file=sys.stderr)
        return 2
    if args.dry_run:
        return max(dry_run(selected, args.arch, p) for _, p in sweep)

    import torch

    device = torch.cuda.get_device_name()
    print(f"device {device}", flush=True)
    compile_all([(case, p) for _, p in sweep for case in selected])
    if args.decode:
        from gpu_suite import copy_bandwidth

        bandwidth = copy_bandwidth(torch.cuda.current_stream())
        rows = []
        for case in selected:
            rows.append(row := measure_decode(case, params))
            print(
                f"{case.name}: tgc {row.tgc_ms:.4f} ms, SDPA {row.sdpa_ms:.4f} ms, "
                f"rel. error {row.error:.1e}",
                flush=True,
            )
        written = report_decode(rows, device, args.commit, Path(args.out), bandwidth, sweep[0][0])
        print(f"wrote {written}")
        return 0
    rows = []
    for text, params in sweep:
        for case in selected:
            row = measure(case, params)
            row.params = (text or "defaults") if len(sweep) > 1 else ""
            rows.append(row)
            print(
                f"{case.name}{f' [{text}]' if row.params else ''}: tgc {row.tgc_ms:.4f} ms "
                f"({tflops(case.flops, row.tgc_ms):.0f} TFLOP/s), SDPA {row.sdpa_ms:.4f} ms "
                f"({tflops(case.flops, row.sdpa_ms):.0f} TFLOP/s), rel. error {row.error:.1e}",
                flush=True,
            )
    stem = "attention_grid" if args.grid else "attention_tc"
    stem += "-sweep" if len(sweep) > 1 else ""
    shown = params if len(sweep) == 1 else "per row (a sweep)"
    path = report(rows, device, args.commit, Path(args.out), shown, stem)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

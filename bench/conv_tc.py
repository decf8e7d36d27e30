"""The generated implicit-GEMM convolution with its fused epilogue (codegen/conv.py) against
cuDNN: `F.conv2d` and the same epilogue in eager PyTorch, `torch.compile` of that (default
mode), and `F.conv2d` with its bias alone, at ResNet-50 and diffusion-UNet layer shapes in bf16.

    python3 bench/conv_tc.py [--only resnet,unet] [--modes eager,compile] [--commit HASH]
                             [--out bench/results] [--params block_m=128,...]
    python3 bench/conv_tc.py --dry-run   # plan, generate and compile each kernel (no GPU)

Each layer is planned as the standalone file plans it on tgc's generated kernels alone (the
whole layer must be one `cuda.conv` kernel, else the row says what was planned), its kernel
launched directly on PyTorch's tensors (no executor in the timing), timed with CUDA events
(median of 30 after 3 warm-ups, bench/gpu_suite.py's `time_ms`). Every result is compared
with the float32 computation on the same bf16 inputs (max |error| / max |reference|), tgc's and
eager PyTorch's side by side. Writes <out>/conv-<device>-<date>.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench/ is on the path only now
from attention_tc import parse_params  # noqa: E402
from gpu_suite import report_start  # noqa: E402


@dataclass(frozen=True)
class Layer:
    name: str
    n: int
    c: int
    h: int
    w: int
    o: int
    k: int
    stride: int
    pad: int
    epilogue: str  # "+"-joined: bias, residual, relu, silu

    @property
    def out_hw(self) -> tuple[int, int]:
        f = lambda s: (s + 2 * self.pad - self.k) // self.stride + 1  # noqa: E731
        return f(self.h), f(self.w)

    @property
    def flops(self) -> float:
        oh, ow = self.out_hw
        return 2.0 * self.n * self.o * oh * ow * self.c * self.k * self.k

    @property
    def steps(self) -> list[str]:
        return self.epilogue.split("+")

    def text(self) -> str:
        oh, ow = self.out_hw
        x = f"tensor<{self.n}x{self.c}x{self.h}x{self.w}xbf16>"
        w = f"tensor<{self.o}x{self.c}x{self.k}x{self.k}xbf16>"
        b, y = f"tensor<{self.o}xbf16>", f"tensor<{self.n}x{self.o}x{oh}x{ow}xbf16>"
        args = [f"%x: {x}", f"%w: {w}", f"%b: {b}"]
        if "residual" in self.steps:
            args.append(f"%r: {y}")
        pads = ", ".join([str(self.pad)] * 4)
        attrs = f"strides = [{self.stride}, {self.stride}], pads = [{pads}]"
        lines = [f"  %v = hl.conv2d %x, %w, %b {{{attrs}}} : ({x}, {w}, {b}) -> {y}"]
        last = "%v"
        for i, step in enumerate(s for s in self.steps if s != "bias"):
            if step == "residual":
                lines.append(f"  %e{i} = atomic.add {last}, %r : ({y}, {y}) -> {y}")
            else:
                lines.append(f"  %e{i} = hl.{step} {last} : ({y}) -> {y}")
            last = f"%e{i}"
        head = f"func.func @{self.name.replace('.', '_')}({', '.join(args)}) -> {y} {{"
        return "\n".join([head, *lines, f"  func.return {last} : {y}", "}"])


# bf16, batch 8. ResNet-50 (torchvision v1.5: the stride in the 3x3): its stem, a 3x3 and the
# expanding 1x1 with the residual of each stage's shapes; the UNet of bench/real_models.py
# (block_out_channels 64, 128 on 32x32 latents): conv_in, a res-block's second conv (bias and
# the skip added), the downsampler, the 128-channel res-block conv, with SiLU on one.
LAYERS = [
    Layer("resnet.stem", 8, 3, 224, 224, 64, 7, 2, 3, "bias+relu"),
    Layer("resnet.l1.3x3", 8, 64, 56, 56, 64, 3, 1, 1, "bias+relu"),
    Layer("resnet.l1.1x1", 8, 64, 56, 56, 256, 1, 1, 0, "bias+residual+relu"),
    Layer("resnet.l2.3x3s2", 8, 128, 56, 56, 128, 3, 2, 1, "bias+relu"),
    Layer("resnet.l3.3x3", 8, 256, 14, 14, 256, 3, 1, 1, "bias+relu"),
    Layer("resnet.l4.1x1", 8, 512, 7, 7, 2048, 1, 1, 0, "bias+residual+relu"),
    Layer("unet.conv_in", 8, 4, 32, 32, 64, 3, 1, 1, "bias"),
    Layer("unet.res64", 8, 64, 32, 32, 64, 3, 1, 1, "bias+residual"),
    Layer("unet.down", 8, 64, 32, 32, 64, 3, 2, 1, "bias"),
    Layer("unet.res128", 8, 128, 16, 16, 128, 3, 1, 1, "bias+silu"),
]


def generated_kernel(layer: Layer, params: dict, arch: str | None):
    """The one kernel of the layer's plan on generated kernels (gpu_suite.generated_plan), or
    a str naming what was planned instead."""
    from gpu_suite import callees, generated_plan

    from tgc.codegen.kernels import generate_kernel
    from tgc.planner.backends import cuda_kernels as ck

    func = generated_plan(layer.text(), params, arch)
    found = callees(func)
    if found != ["cuda.conv"]:
        return f"planned {found}"
    call = next(op for op in func.body.ops if op.name == "kernel.call")
    with ck.planning_kernels(arch):
        return generate_kernel(ck.fused_from_call(call), ck.call_params(call), "tgc_conv_bench")


def dry_run(layers: list[Layer], arch: str, params: dict) -> int:
    from tgc.codegen.render import prelude

    bad = 0
    for layer in layers:
        k = generated_kernel(layer, params, arch)
        if isinstance(k, str):
            print(f"{layer.name}: {k}")
            bad += 1
            continue
        with tempfile.TemporaryDirectory(prefix="tgc-conv-") as tmp:
            src = Path(tmp) / "k.cu"
            src.write_text(prelude() + "\n" + k.source)
            proc = subprocess.run(
                ["nvcc", "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-Xptxas", "-v",
                 "-o", f"{tmp}/k.cubin", str(src)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
        ok = proc.returncode == 0
        bad += not ok
        regs = [ln.strip() for ln in proc.stderr.splitlines() if "registers" in ln]
        print(f"{layer.name}: {'compiled' if ok else 'FAILED'} {k.params} grid {k.grid} {regs}")
    return 1 if bad else 0


@dataclass
class Row:
    layer: Layer
    params: dict
    tgc_ms: float | None
    eager_ms: float
    compile_ms: float | None
    conv_ms: float
    tgc_err: float | None
    eager_err: float
    note: str = ""


def measure(layer: Layer, params: dict, modes: set[str]) -> Row:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from gpu_suite import time_ms

    from tgc.planner import load_backends
    from tgc.planner.backends import cuda_kernels as ck
    from tgc.runtime.cuda_compile import load_kernels

    load_backends(("cuda",), required=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    oh, ow = layer.out_hw

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    x = rand(layer.n, layer.c, layer.h, layer.w)
    w = rand(layer.o, layer.c, layer.k, layer.k, scale=(layer.c * layer.k * layer.k) ** -0.5)
    b = rand(layer.o, scale=0.1)
    r = rand(layer.n, layer.o, oh, ow) if "residual" in layer.steps else None
    inputs = [x, w, b] + ([r] if r is not None else [])

    def eager(x, w, b, r=None):
        y = F.conv2d(x, w, b, layer.stride, layer.pad)
        for step in layer.steps:
            if step == "residual":
                y = y + r
            elif step == "relu":
                y = F.relu(y)
            elif step == "silu":
                y = F.silu(y)
        return y

    want = eager(*[t.float() for t in inputs])
    scale = want.abs().max().item()
    stream = torch.cuda.current_stream()
    got = eager(*inputs)
    eager_err = (got.float() - want).abs().max().item() / scale
    eager_ms = time_ms(lambda: eager(*inputs), stream)
    conv_ms = time_ms(lambda: F.conv2d(x, w, b, layer.stride, layer.pad), stream)
    compile_ms = None
    if "compile" in modes:
        torch._dynamo.reset()  # one compile per layer: no recompile limit, no eager fallback
        compiled = torch.compile(eager)
        compiled(*inputs)
        compile_ms = time_ms(lambda: compiled(*inputs), stream)
    k = generated_kernel(layer, params, ck.TARGET["arch"])
    if isinstance(k, str):
        return Row(layer, {}, None, eager_ms, compile_ms, conv_ms, None, eager_err, k)
    (function,) = load_kernels([k])
    out = torch.full((layer.n, layer.o, oh, ow), float("nan"), device="cuda", dtype=torch.bfloat16)
    pointers = [np.uintp(t.data_ptr()) for t in [*inputs, out]]

    def launch():
        function.prepared_async_call(k.grid, k.block, None, *pointers, shared_size=0)

    launch()
    torch.cuda.synchronize()
    tgc_err = (out.float() - want).abs().max().item() / scale  # NaN where never written
    tgc_ms = time_ms(launch, stream)
    return Row(layer, dict(k.params), tgc_ms, eager_ms, compile_ms, conv_ms, tgc_err, eager_err)


def report(rows: list[Row], device: str, commit: str, out: Path, modes: set[str]) -> Path:
    title = "Generated implicit-GEMM convolution + epilogue against cuDNN"
    path, lines = report_start(out, "conv", title, device, commit)

    def ms(v):
        return "-" if v is None else f"{v:.4f}"

    lines += [
        "- bf16, batch 8; `python3 bench/conv_tc.py` (its docstring has the method). tgc: the "
        "generated kernel (conv, bias and epilogue in one launch). eager: `F.conv2d` (cuDNN) "
        "then the epilogue as PyTorch ops. compile: `torch.compile` of that, default mode"
        + ("" if "compile" in modes else " (not run)")
        + ". cuDNN conv: `F.conv2d` with its bias alone. Errors: max |error| / max |reference| "
        "against float32 on the same bf16 inputs.",
        "",
        "| layer | x -> y | k/s/p | epilogue | tgc ms | tgc TFLOP/s | eager ms | compile ms | "
        "cuDNN conv ms | tgc / compile | tgc err | eager err | tiles |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ly = row.layer
        oh, ow = ly.out_hw
        tf = "-" if row.tgc_ms is None else f"{ly.flops / row.tgc_ms / 1e9:.0f}"
        best = row.compile_ms if row.compile_ms is not None else row.eager_ms
        ratio = "-" if row.tgc_ms is None else f"{row.tgc_ms / best:.2f}"
        err = "-" if row.tgc_err is None else f"{row.tgc_err:.1e}"
        tiles = row.note or "x".join(str(v) for v in row.params.values())
        lines.append(
            f"| {ly.name} | {ly.c}x{ly.h}x{ly.w} -> {ly.o}x{oh}x{ow} | {ly.k}/{ly.stride}/"
            f"{ly.pad} | {ly.epilogue} | {ms(row.tgc_ms)} | {tf} | {ms(row.eager_ms)} | "
            f"{ms(row.compile_ms)} | {ms(row.conv_ms)} | {ratio} | {err} | "
            f"{row.eager_err:.1e} | {tiles} |"
        )
    lines.append("")
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="plan, generate and compile only")
    ap.add_argument("--arch", default="sm_90", help="nvcc's -arch for --dry-run")
    ap.add_argument("--only", default="", help="comma-separated prefixes of layer names")
    ap.add_argument("--modes", default="eager,compile", help="eager (always), compile")
    ap.add_argument("--commit", default=os.environ.get("TGC_COMMIT", "unknown"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--params", default="", help="template parameters, k=v,k=v")
    args = ap.parse_args(argv)
    params = parse_params(args.params)
    only = [p for p in args.only.split(",") if p]
    layers = [ly for ly in LAYERS if not only or any(ly.name.startswith(p) for p in only)]
    if not layers:
        print("no layer matches --only", file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(layers, args.arch, params)
    import torch

    device = torch.cuda.get_device_name()
    modes = set(args.modes.split(","))
    rows = []
    for layer in layers:
        row = measure(layer, params, modes)
        rows.append(row)
        print(
            f"{layer.name}: tgc {row.tgc_ms} ms (err {row.tgc_err}), eager {row.eager_ms:.4f}, "
            f"compile {row.compile_ms}, cuDNN conv {row.conv_ms:.4f} {row.note}",
            flush=True,
        )
        report(rows, device, args.commit, Path(args.out), modes)  # kept after each row
    print(f"wrote {report(rows, device, args.commit, Path(args.out), modes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

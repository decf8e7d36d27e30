"""Make the small vision ONNX test folders under test/models/ (issue 25, item 5): a ResNet-style
CNN and a diffusion UNet-style block, random weights, exported by PyTorch, saved in the layout of
the ONNX backend tests so that CI, which has no PyTorch, imports and runs them on numpy:

    test/models/<name>/model.onnx
    test/models/<name>/test_data_set_0/input_0.pb          the input image batch (float32)
    test/models/<name>/test_data_set_0/output_0.pb         PyTorch's output, model in float32
    test/models/<name>/test_data_set_0/reference_f64_0.pb  the same model and input in float64
    test/models/<name>/README.md                           what it is, its ops, the recipe

Recipe (where PyTorch is installed; the versions these folders were made with):

    .venv/bin/python bench/make_vision_models.py        # torch 2.13.0+cpu, onnx 1.22.0
    .venv/bin/python bench/make_vision_models.py --out /tmp/models

- tiny_cnn: conv 7x7 stride 2, batch norm, ReLU, max pool 3x3 stride 2, two residual blocks
  (3x3 convolutions with batch norm; the second strided, with a 1x1 strided projection), global
  average pool, a linear layer: ResNet-18's shape at 8 to 16 channels. Exported without
  constant folding, so the BatchNormalization nodes stay (the exporter would fold them into the
  convolutions: tgc's fold-batch-norm does that itself).
- unet_block: a stem convolution, a strided convolution down, a residual block with GroupNorm
  and SiLU (the TorchScript exporter writes GroupNorm as InstanceNormalization of the grouped
  reshape, as models in the wild hold it), nearest upsampling back (Resize), a convolution, a
  skip concatenation, a second residual block, a transposed convolution, average pooling,
  bilinear upsampling and a 1x1 convolution.

Both by the TorchScript exporter (`dynamo=False`, opset 17): onnxscript, which the other
exporter needs, is not installed here. Batch norm statistics and every affine parameter are
drawn at random (a fresh module's mean 0, var 1, gamma 1 and beta 0 would hide a dropped one).
Input: 2 images of 3x32x32 (CNN) and 2 of 3x16x16 (UNet), N(0, 1), seed 0. Each export is
checked before it is written: onnx.checker, then onnx's reference evaluator on the stored input
against PyTorch's float32 output (rtol 1e-4, atol 1e-5 times the largest output). The output
is byte for byte the same on every run with these versions.
"""

from __future__ import annotations

import argparse
import collections
import io
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "test" / "models"
SEED, OPSET = 0, 17


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.project = None
        if stride != 1 or cin != cout:
            self.project = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.project is None else self.project(x)))


class TinyCNN(nn.Module):
    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.block1 = BasicBlock(width, width, 1)
        self.block2 = BasicBlock(width, 2 * width, 2)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.stem(x))))
        x = self.block2(self.block1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class UNetBlock(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.inp = nn.Conv2d(3, channels, 3, padding=1)
        self.down = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.mid = ResBlock(channels, 2 * channels)
        self.up_conv = nn.Conv2d(2 * channels, channels, 3, padding=1)
        self.out = ResBlock(2 * channels, channels)
        self.smooth = nn.ConvTranspose2d(channels, channels, 4, stride=2, padding=1)
        self.final = nn.Conv2d(channels, 3, 1)

    def forward(self, x):
        skip = self.inp(x)
        h = self.mid(self.down(skip))
        h = self.up_conv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        h = self.out(torch.cat([h, skip], dim=1))
        h = F.avg_pool2d(self.smooth(h), 2)
        h = F.interpolate(h, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.final(h)


MODELS = {  # name -> (module factory, input shape, export options)
    "tiny_cnn": (TinyCNN, (2, 3, 32, 32), {"do_constant_folding": False}),
    "unet_block": (UNetBlock, (2, 3, 16, 16), {}),
}


def randomize(model: nn.Module) -> None:
    """Norm statistics and affine parameters at random (see the module doc)."""
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))


def export(name: str) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """(model bytes, input, float32 output, float64 output), checked."""
    factory, shape, options = MODELS[name]
    torch.manual_seed(SEED)
    model = factory().eval()
    randomize(model)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(SEED))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=["image"],
            output_names=["out"],
            **options,
        )
    data = buffer.getvalue()
    with torch.no_grad():
        out32 = model(x).numpy()
        out64 = model.double()(x.double()).numpy()
    proto = onnx.load_from_string(data)
    onnx.checker.check_model(proto)
    (evaluated,) = ReferenceEvaluator(proto).run(None, {"image": x.numpy()})
    scale = float(np.abs(out32).max())
    np.testing.assert_allclose(evaluated, out32, rtol=1e-4, atol=1e-5 * scale)
    return data, x.numpy(), out32, out64


def write(name: str, out: Path) -> None:
    data, x, out32, out64 = export(name)
    folder = out / name
    cases = folder / "test_data_set_0"
    cases.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(data)
    for prefix, array in (("input_0", x), ("output_0", out32), ("reference_f64_0", out64)):
        tensor = numpy_helper.from_array(array, name=prefix)
        (cases / f"{prefix}.pb").write_bytes(tensor.SerializeToString())
    ops = collections.Counter(n.op_type for n in onnx.load_from_string(data).graph.node)
    listed = ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
    (folder / "README.md").write_text(
        f"# {name}\n\nMade by `bench/make_vision_models.py` (its docstring: the model, the "
        f"export, the recipe).\nTorchScript exporter, opset {OPSET}; input {list(x.shape)}, "
        f"output {list(out32.shape)}.\n\nNodes: {listed}.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", choices=sorted(MODELS))
    args = parser.parse_args()
    for name in [args.only] if args.only else sorted(MODELS):
        write(name, args.out)
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()

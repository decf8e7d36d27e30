"""The torch.export importer on vision models (importers/torch/ops_conv.py): a ResNet-18 (the
torchvision architecture, written here: torchvision is not installed), a UNet-like block
(GroupNorm, SiLU, convolutions, a strided convolution down, nearest and bilinear upsampling, a
transposed convolution, a skip concatenation) and single ops, exported in float64, imported,
run on the numpy interpreter on fresh N(0, 1) inputs (batch norm statistics drawn too, variances
in [0.5, 1.5)) and compared with PyTorch in float64: rtol 1e-10, atol 1e-10 (the order of the
sums differs: im2col's one matmul against PyTorch's convolution); also after `-p optimize`
(batch norms folded into the convolutions' weights, decompositions, rewrites); and every
refusal by its message.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is an optional extra (pip install 'tgc[torch]'); CI has none, so the "
    "torch.export importer is tested where it is installed",
)
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import tgc  # noqa: E402
from tgc.diagnostics import TgcError  # noqa: E402
from tgc.importers.torch import import_exported_program, parameter_values  # noqa: E402

TOL = {"rtol": 1e-10, "atol": 1e-10}


def _randomise_statistics(model: nn.Module, seed: int) -> None:
    """Batch norm running statistics drawn (a fresh module has mean 0, var 1: the norm would
    hide a mistake in them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.randn(m.weight.shape, generator=g))
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g))


def check(model: nn.Module, shapes, pipeline: str | None = None, seed: int = 0):
    """Export at `shapes` (float64), import, run on fresh inputs, compare; the module."""
    torch.manual_seed(seed)
    model = model.double().eval()
    _randomise_statistics(model, seed)
    example = tuple(torch.randn(s, dtype=torch.float64) for s in shapes)
    ep = torch.export.export(model, example)
    module = import_exported_program(ep)
    if pipeline:
        tgc.run_pipeline(module, pipeline)
    g = torch.Generator().manual_seed(seed + 1)
    inputs = [torch.randn(s, dtype=torch.float64, generator=g) for s in shapes]
    with torch.no_grad():
        want = model(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = tgc.run(module, parameter_values(ep) + [x.numpy() for x in inputs])
    assert len(got) == len(want)
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w.numpy(), **TOL)
    return module


# -- a ResNet-18 (torchvision's architecture) -----------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's layers at `width` channels in the first stage (64 there)."""

    def __init__(self, width: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for i in range(4):
            cout = width * 2**i
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))
        return self.fc(torch.flatten(x, 1))


def test_resnet18_matches_pytorch():
    module = check(ResNet18(width=8), [(2, 3, 32, 32)])
    names = [op.name for op in module.walk()]
    assert names.count("hl.conv2d") == 20 and names.count("hl.batch_norm") == 20
    assert names.count("hl.max_pool2d") == 1


def test_resnet18_after_optimize_folds_every_batch_norm():
    module = tgc.parse(tgc.print_ir(check(ResNet18(width=8), [(1, 3, 32, 32)])))
    tgc.run_pipeline(module, "fold-batch-norm")
    names = [op.name for op in module.walk()]
    assert names.count("hl.batch_norm") == 0 and names.count("hl.conv2d") == 20
    check(ResNet18(width=8), [(1, 3, 32, 32)], pipeline="optimize", seed=3)


# -- a UNet-like block ----------------------------------------------------------------------------


class ResBlock(nn.Module):
    """A diffusion UNet's residual block: GroupNorm, SiLU, conv, twice, and a 1x1 skip."""

    def __init__(self, cin: int, cout: int, groups: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class UNetBlock(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.inp = nn.Conv2d(3, channels, 3, padding=1)
        self.down = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.mid = ResBlock(channels, 2 * channels)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.up_conv = nn.Conv2d(2 * channels, channels, 3, padding=1)
        self.out = ResBlock(2 * channels, channels)
        self.smooth = nn.ConvTranspose2d(channels, channels, 4, stride=2, padding=1)
        self.final = nn.Conv2d(channels, 3, 1)

    def forward(self, x):
        skip = self.inp(x)
        h = self.mid(self.down(skip))
        h = self.up_conv(self.up(h))
        h = self.out(torch.cat([h, skip], dim=1))
        h = F.avg_pool2d(self.smooth(h), 2)
        h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        return self.final(h)


@pytest.mark.parametrize("pipeline", [None, "optimize"])
def test_unet_block_matches_pytorch(pipeline):
    module = check(UNetBlock(), [(2, 3, 16, 16)], pipeline=pipeline)
    if pipeline is None:
        names = {op.name for op in module.walk()}
        assert {"hl.group_norm", "hl.resize", "hl.conv_transpose2d", "hl.silu"} <= names


# -- single ops -----------------------------------------------------------------------------------


class Lambda(nn.Module):
    def __init__(self, fn, *modules) -> None:
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(modules)

    def forward(self, *xs):
        return self.fn(self, *xs)


CASES = {
    "conv1d_groups": (lambda s, x: s.mods[0](x), [nn.Conv1d(4, 6, 3, stride=2, padding=2, groups=2)], (2, 4, 11)),
    "conv3d_dilated": (lambda s, x: s.mods[0](x), [nn.Conv3d(2, 3, 2, dilation=2, padding=1)], (1, 2, 5, 5, 5)),
    "conv_transpose1d": (lambda s, x: s.mods[0](x), [nn.ConvTranspose1d(4, 2, 3, stride=3, output_padding=2, groups=2)], (1, 4, 5)),
    "depthwise": (lambda s, x: s.mods[0](x), [nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)], (1, 4, 6, 6)),
    "pools_ceil": (lambda s, x: (F.max_pool2d(x, 3, 2, 1, ceil_mode=True), F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), F.max_pool1d(x[:, :, 0], 2)), [], (2, 3, 9, 8)),
    "adaptive": (lambda s, x: F.adaptive_avg_pool2d(x, (2, 4)), [], (1, 3, 8, 8)),
    "upsample": (lambda s, x: (F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True), F.interpolate(x, scale_factor=3, mode="nearest"), F.interpolate(x, size=(7, 9), mode="nearest")), [], (1, 2, 3, 4)),
    "norms_without_affine": (lambda s, x: (s.mods[0](x), s.mods[1](x)), [nn.GroupNorm(2, 4, affine=False), nn.BatchNorm2d(4, affine=False)], (2, 4, 3, 3)),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_ops(case):
    fn, modules, shape = CASES[case]
    check(Lambda(fn, *modules), [shape])


def _refusal(fn, shape, match: str):
    model = Lambda(fn).double().eval()
    ep = torch.export.export(model, (torch.randn(shape, dtype=torch.float64),))
    with pytest.raises(TgcError, match=match) as info:
        import_exported_program(ep)
    assert "\n" not in info.value.message
    assert info.value.loc.file.endswith("test_import_torch_vision.py")  # the model's line


def test_max_pool_indices_are_refused():
    _refusal(
        lambda s, x: F.max_pool2d(x, 2, return_indices=True)[1].double(),
        (1, 2, 4, 4),
        r"max_pool2d_with_indices.*: the indices of a max pool \(argmax positions\) have no tgc op",
    )


def test_uneven_adaptive_pool_is_refused():
    _refusal(
        lambda s, x: F.adaptive_avg_pool2d(x, 3),
        (1, 2, 4, 4),
        r"adaptive average pool from \[4, 4\] to \[3, 3\]: only outputs that divide the input",
    )


def test_fractional_scale_is_refused():
    _refusal(
        lambda s, x: F.interpolate(x, scale_factor=1.5, mode="nearest"),
        (1, 2, 5, 5),
        r"scale factor 1.5 from 5 to 7 is fractional",
    )


def test_divisor_override_is_refused():
    _refusal(
        lambda s, x: F.avg_pool2d(x, 2, divisor_override=3),
        (1, 2, 4, 4),
        "divisor_override is not supported",
    )

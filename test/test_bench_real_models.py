"""bench/real_models.py's vision and diffusion models (issue 25, item 5), checked on the CPU.

The GPU rows (ResNet-50, ViT-base, a diffusers UNet2DConditionModel and AutoencoderKL's decode,
beside eager and torch.compile) need the GPU; what can fail before them is checked here with the
benchmark's own builders at their tiny configs: each model is built with random weights, exported
with torch.export, imported with tgc's torch importer, and run on tgc's numpy interpreter in
float64 on fresh inputs (not the export's), against PyTorch's float64 output: max |tgc - PyTorch|
at most the dry run's tolerance x max |PyTorch| (1e-10; the UNet 1e-6, its timestep embedding
being float32 in diffusers). Each model needs PyTorch and transformers (the UNet and VAE
diffusers), optional extras CI does not install: without them the checks skip with that reason.
The argument checks need none of them.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import real_models  # noqa: E402  (bench/ is on the path only now; it imports torch lazily)


def _absent(*modules: str) -> str | None:
    missing = [m for m in modules if find_spec(m) is None]
    return ", ".join(missing) or None


def _needs(*modules: str):
    missing = _absent(*modules)
    return pytest.mark.skipif(
        missing is not None,
        reason=f"{missing} not installed: PyTorch, transformers and diffusers are optional "
        "extras (CI has none); bench/real_models.py's models are checked where they are",
    )


CASES = [
    pytest.param("vit", 2, {}, marks=_needs("torch", "transformers"), id="vit"),
    pytest.param("resnet50", 2, {"resnet": "hf"}, marks=_needs("torch", "transformers"), id="hf"),
    pytest.param(
        "resnet50", 1, {"resnet": "torchvision"}, marks=_needs("torch", "torchvision"), id="tv"
    ),
    pytest.param("unet", 2, {}, marks=_needs("torch", "diffusers"), id="unet"),
    pytest.param("vae", 2, {}, marks=_needs("torch", "diffusers"), id="vae"),
]


@pytest.mark.parametrize("name, batch, kw", CASES)
def test_tiny_model_float64_matches_pytorch(name: str, batch: int, kw: dict) -> None:
    import tgc

    tgc.load_all()
    case = real_models.dry_case(name, "f64", batch, tiny=True, **kw)
    assert case.want.dtype == np.float64
    (got,) = tgc.run(case.imported, case.arguments)
    assert got.shape == case.want.shape and got.dtype == np.float64
    error = real_models.rel_error(got, case.want)
    tolerance = real_models.dry_tolerance(name, "f64")
    assert error <= tolerance, f"{name}: max error {error:.2e} x max |PyTorch| > {tolerance:g}"
    # the fresh inputs are not the export's: the check is not a replay of the traced values
    first = case.built.inputs(1)[0].numpy()
    assert not np.array_equal(first, case.arguments[-len(case.built.inputs(2))])


def test_batches_and_dtypes_by_model() -> None:
    assert real_models.batches("vit", None, dry=False) == [1, 8]
    assert real_models.batches("unet", None, dry=False) == [2, 8]
    assert real_models.batches("resnet50", None, dry=True) == [1, 2]
    assert real_models.batches("gpt2", None, dry=False) == [4]
    assert real_models.batches("vae", "1,4", dry=False) == [1, 4]
    assert real_models.dry_dtype("vit", None) == "f64"
    assert real_models.dry_dtype("gpt2", None) == "f32"
    assert real_models.dry_tolerance("unet", "f64") == 1e-6
    assert set(real_models.VISION) == {"resnet50", "vit", "unet", "vae"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "resnet", "--dry-run"], "unknown model(s) ['resnet']"),
        (["--vision", "--batch", "1,x", "--dry-run"], "--batch takes comma-separated integers"),
        (["--vision", "--resnet", "keras"], "invalid choice: 'keras'"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        real_models.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@_needs("torch")
def test_a_row_cut_off_by_its_timeout_keeps_what_it_had(tmp_path, monkeypatch) -> None:
    """gpu_session.sh runs each row under `timeout`: its SIGTERM ends the run, but the row is
    saved with the steps it finished and the one it was in (no GPU: the row is a stand-in)."""
    import json
    import os
    import signal

    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    # the run turns cuDNN's TF32 off for its f32 rows: put it back after
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)

    def gpu_one(row, args, db, save):
        row.shape, row.running = "8 x 3 x 224 x 224", "PyTorch eager"
        row.modes["eager"] = {"first_s": 0.1, "ms": 2.0, "error": 0.0, "note": ""}
        row.running = "tgc compile_module (first use) and first call"
        save()
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the row")

    monkeypatch.setattr(real_models, "gpu_one", gpu_one)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = real_models.main(["--only", "vit", "--dtypes", "bf16", "--out", str(tmp_path)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 124
    assert torch.backends.cudnn.allow_tf32 is False
    (store,) = tmp_path.glob("real-models-*.json")
    (row,) = json.loads(store.read_text()).values()
    assert row["modes"]["eager"]["ms"] == 2.0
    assert row["running"] == "tgc compile_module (first use) and first call"
    assert "cut off by SIGTERM (its timeout) during tgc compile_module" in row["note"]
    report = store.with_suffix(".md").read_text()
    assert "| vit | bf16 | 8 x 3 x 224 x 224 |" in report

"""The committed vision models (issue 25, item 5): test/models/tiny_cnn (a ResNet-style CNN with
batch norms) and test/models/unet_block (GroupNorm, SiLU, convolutions, nearest and bilinear
upsampling, a transposed convolution), made by bench/make_vision_models.py (the recipe), imported
and run on the numpy interpreter. Needs onnx only, so it runs in CI.

References and tolerances, relative to the largest output (of order 1 to 10):
- the stored input against PyTorch's float64 output of the same model (reference_f64_0.pb):
  run in float64 (`precision="f64"`, the weights being the float32 values PyTorch's float64 run
  used too), 1e-9 (measured 2e-13 and 1e-12: the order of the sums; the norms' epsilons held
  as float32); run in float32, 1e-4 (measured 1e-7: float32 rounding through a dozen
  convolutions);
- the same after `-p optimize`: the batch norms folded into the convolutions' constant weights,
  which canonicalize computes in the weights' float32 (measured 6e-8 in float64), so 1e-6;
- fresh N(0, 1) inputs against onnx's ReferenceEvaluator on the same file (float32), 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install tgc[onnx])")

from onnx import numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tgc  # noqa: E402
from tgc.importers.onnx import import_onnx  # noqa: E402
from tgc.runtime.interpreter import run_function  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
NAMES = ("tiny_cnn", "unet_block")
# hl ops each model must import as (the new ops, not a spelled-out form)
EXPECTED_OPS = {
    "tiny_cnn": {"hl.conv2d": 6, "hl.batch_norm": 6, "hl.max_pool2d": 1, "hl.avg_pool2d": 1},
    "unet_block": {"hl.conv2d": 10, "hl.conv_transpose2d": 1, "hl.resize": 2, "hl.avg_pool2d": 1},
}


def stored(name: str, prefix: str) -> np.ndarray:
    path = MODELS / name / "test_data_set_0" / f"{prefix}_0.pb"
    return numpy_helper.to_array(onnx.load_tensor(str(path)))


def close(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    error = float(np.abs(got.astype(np.float64) - want).max())
    assert error <= tol * max(1.0, float(np.abs(want).max())), error


@pytest.mark.parametrize("name", NAMES)
def test_imports_as_the_vision_ops(name):
    module = import_onnx(str(MODELS / name / "model.onnx"))
    names = [op.name for op in module.walk()]
    for op, count in EXPECTED_OPS[name].items():
        assert names.count(op) == count, (op, names.count(op))


@pytest.mark.parametrize("pipeline", [None, "optimize"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_pytorch_float64(name, pipeline):
    module = import_onnx(str(MODELS / name / "model.onnx"))
    if pipeline:
        tgc.run_pipeline(module, pipeline)
        assert not any(op.name == "hl.batch_norm" for op in module.walk())
    x, want = stored(name, "input"), stored(name, "reference_f64")
    (exact,) = run_function(module.funcs[0], [x], "f64")
    close(exact, want, 1e-6 if pipeline else 1e-9)
    (native,) = run_function(module.funcs[0], [x], "native")
    assert native.dtype == np.float32
    close(native, want, 1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_fresh_inputs_match_onnx_reference(name):
    path = MODELS / name / "model.onnx"
    module = import_onnx(str(path))
    x = np.random.default_rng(7).standard_normal(stored(name, "input").shape).astype(np.float32)
    (want,) = ReferenceEvaluator(onnx.load(str(path))).run(None, {"image": x})
    (got,) = tgc.run(module, [x])
    close(got, want.astype(np.float64), 1e-4)


def test_the_reference_check_can_fail():
    want = stored("tiny_cnn", "reference_f64")
    with pytest.raises(AssertionError):
        close(want * (1 + 1e-5) + 1e-5, want, 1e-6)

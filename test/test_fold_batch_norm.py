"""fold-batch-norm: the folded convolution computes what the convolution and the norm did.

Random seeded N(0, 1) activations and parameters (variances uniform in [0.5, 2)), run by the
interpreter in float64 before and after the pass (alone and inside `optimize`): |after - before|
<= 1e-12 * max(1, max|before|) (the scale applied to the weights before the sum instead of to
the sum: a few ulps).
"""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.runtime.interpreter import run_function

MODULE = """
func.func @f(%x: tensor<2x4x6x5xf64>, %w: tensor<6x2x3x3xf64> {{tgc.param}}, {bias_arg}%g: tensor<6xf64> {{tgc.param}}, %beta: tensor<6xf64> {{tgc.param}}, %m: tensor<6xf64> {{tgc.param}}, %v: tensor<6xf64> {{tgc.param}}) -> tensor<2x6x3x5xf64> {{
  %c = hl.conv2d %x, %w{bias} {{groups = 2, pads = [1, 1, 1, 1], strides = [2, 1]}} : (tensor<2x4x6x5xf64>, tensor<6x2x3x3xf64>{bias_type}) -> tensor<2x6x3x5xf64>
  %y = hl.batch_norm %c, %g, %beta, %m, %v {{eps = 0.01}} : (tensor<2x6x3x5xf64>, tensor<6xf64>, tensor<6xf64>, tensor<6xf64>, tensor<6xf64>) -> tensor<2x6x3x5xf64>
  func.return %y : tensor<2x6x3x5xf64>
}}
"""


def module(bias: bool):
    return tgc.parse(
        MODULE.format(
            bias_arg="%b: tensor<6xf64> {tgc.param}, " if bias else "",
            bias=", %b" if bias else "",
            bias_type=", tensor<6xf64>" if bias else "",
        )
    )


def inputs(func, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(a.type.shape) for a in func.args]
    out[-1] = rng.uniform(0.5, 2.0, out[-1].shape)  # the variance
    return out


@pytest.mark.parametrize("pipeline", ["fold-batch-norm", "optimize"])
@pytest.mark.parametrize("bias", [True, False])
def test_folding_keeps_the_result(bias, pipeline):
    m = module(bias)
    xs = inputs(m.funcs[0], seed=int(bias))
    (want,) = run_function(m.funcs[0], xs, "f64")
    tgc.run_pipeline(m, pipeline)
    names = [op.name for op in m.walk()]
    assert "hl.batch_norm" not in names
    if pipeline == "fold-batch-norm":
        assert names.count("hl.conv2d") == 1
    (got,) = run_function(m.funcs[0], xs, "f64")
    bound = 1e-12 * max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() <= bound

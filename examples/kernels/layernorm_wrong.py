"""A wrong kernel, refused when it is loaded (docs/kernels.md): it forgets beta."""

import numpy as np

from tgc.planner.kernel import Kernel, Lowered

REFERENCE = """
func.func @layernorm(%x: tensor<4x8xf32>, %gamma: tensor<8xf32>, %beta: tensor<8xf32>) -> tensor<4x8xf32> {
  %y = hl.layernorm %x, %gamma, %beta {axis = -1, eps = 1.0e-05} : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}
"""  # noqa: E501


def forgets_beta(inputs, attrs, result_types):
    x, gamma, beta = inputs
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return [((x - mean) / np.sqrt(variance + 1e-5) * gamma).astype(result_types[0].dtype)]


def tgc_kernels():
    return [
        Kernel(
            "user.layernorm_wrong",
            "numpy",
            reference=Lowered(REFERENCE),
            run=forgets_beta,
            max_rel_error=1e-6,
            shape_constants=True,
        )
    ]

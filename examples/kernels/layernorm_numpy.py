"""A user's kernel plugin: layernorm over the last axis as one numpy expression.

    tgc-run model.tg --backend auto --kernels examples/kernels/layernorm_numpy.py --check

docs/kernels.md walks through it. The reference graph says what the kernel computes; it is
written at 4x8, and `shape_constants=True` says that its constants that are functions of a size
(the mean's divisor, 8 here) stand for that function, so it matches a layernorm of any width.
"""

import numpy as np

from tgc.planner.kernel import Kernel, Lowered

REFERENCE = """
func.func @layernorm(%x: tensor<4x8xf32>, %gamma: tensor<8xf32>, %beta: tensor<8xf32>) -> tensor<4x8xf32> {
  %y = hl.layernorm %x, %gamma, %beta {axis = -1, eps = 1.0e-05} : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}
"""  # noqa: E501


def layernorm(inputs, attrs, result_types):
    """The numpy backend's calling convention: host arrays in, host arrays out."""
    x, gamma, beta = inputs
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    y = centred / np.sqrt(variance + np.float32(1e-5)) * gamma + beta
    return [y.astype(result_types[0].dtype, copy=False)]


def only_floats(types):
    """A constraint, on (operand types, result types): why they are refused, or None."""
    operands, results = types
    if not all(t.element_type in ("f32", "f64") for t in [*operands, *results]):
        return "f32 and f64 only"
    return None


def tgc_kernels():
    return [
        Kernel(
            "user.layernorm",
            "numpy",
            # hl.layernorm as written, and what lower-hl makes of it (the default pipelines
            # lower it before planning)
            reference=(REFERENCE, Lowered(REFERENCE)),
            run=layernorm,
            constraints=only_floats,
            max_rel_error=1e-6,
            shape_constants=True,
            doc="layernorm over the last axis, one numpy expression",
        )
    ]

"""Write one of the small ONNX models the tgc-import lit tests read: make_onnx.py CASE OUT.onnx.

The models are built here with onnx.helper (no binary files in the repository); weights come
from a fixed seed so that CHECK lines can name values.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # test/: the tests' shared helpers
import onnx_testing  # noqa: E402

F32 = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers=(), opset=17, name="main"):
    return onnx_testing.make_model(nodes, inputs, outputs, initializers, opset=opset, name=name)


def weight(name, shape, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return helper.make_tensor(name, F32, list(shape), values.ravel())


def mlp():
    """x @ w1 + b1 -> Relu -> Gemm(transB) with a 64x32 weight: names with '/' and ':'."""
    return model(
        [
            helper.make_node("MatMul", ["input:0", "layer1/w"], ["h"], name="fc1"),
            helper.make_node("Add", ["h", "layer1/b"], ["h_biased"]),
            helper.make_node("Relu", ["h_biased"], ["act"]),
            helper.make_node("Gemm", ["act", "layer2/w", "layer2/b"], ["out"], transB=1),
        ],
        [("input:0", F32, [2, 8])],
        [("out", F32, [2, 32])],
        [
            weight("layer1/w", (8, 64)),
            weight("layer1/b", (64,), 1),
            weight("layer2/w", (32, 64), 2),
            weight("layer2/b", (32,), 3),
        ],
    )


def dynamic():
    return model(
        [helper.make_node("Sigmoid", ["tokens"], ["y"])],
        [("tokens", F32, ["batch", "seq", 4])],
        [("y", F32, ["batch", "seq", 4])],
    )


def unsupported_op():
    return model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Det", ["r"], ["y"], name="det"),
        ],
        [("x", F32, [3, 3])],
        [("y", F32, [])],
    )


def unsupported_attribute():
    return model(
        [helper.make_node("Gelu", ["x"], ["y"], name="act", approximate="erf")],
        [("x", F32, [4])],
        [("y", F32, [4])],
        opset=20,
    )


def unsupported_dtype():
    return model(
        [helper.make_node("Cast", ["x"], ["y"], name="to_u8", to=TensorProto.UINT8)],
        [("x", F32, [4])],
        [("y", TensorProto.UINT8, [4])],
    )


def folding():
    """A shape computed from constants: Cast(Add(c1, c2)) folds to one constant."""
    return model(
        [
            helper.make_node("Constant", [], ["c1"], value_ints=[1, 2, 3]),
            helper.make_node("Add", ["c1", "c2"], ["s"]),
            helper.make_node("Cast", ["s"], ["scale"], to=F32),
            helper.make_node("Mul", ["x", "scale"], ["y"]),
        ],
        [("x", F32, [2, 3])],
        [("y", F32, [2, 3])],
        [helper.make_tensor("c2", TensorProto.INT64, [3], [10, 20, 30])],
    )


def elementwise():
    return model(
        [
            helper.make_node("Gelu", ["x"], ["g"], approximate="tanh"),
            helper.make_node("Less", ["g", "x"], ["lt"]),
            helper.make_node("Where", ["lt", "g", "x"], ["w"]),
            helper.make_node("Cast", ["w"], ["y"], to=TensorProto.BFLOAT16),
            helper.make_node("Max", ["x", "g", "w"], ["m"]),
        ],
        [("x", F32, [4])],
        [("y", TensorProto.BFLOAT16, [4]), ("m", F32, [4])],
        opset=20,
    )


CASES = {
    f.__name__.replace("_", "-"): f
    for f in (
        mlp,
        dynamic,
        unsupported_op,
        unsupported_attribute,
        unsupported_dtype,
        folding,
        elementwise,
    )
}

if __name__ == "__main__":
    case, out = sys.argv[1:]
    onnx.save(CASES[case](), out)

"""tgc.importers.onnx: tiny models built with onnx.helper, imported, run on the numpy interpreter
and compared with onnx's ReferenceEvaluator on fresh random inputs; and every diagnostic.

Tolerances: f32 results rtol 1e-5, atol 1e-6 (one rounding per op against the same f32 math);
f64 rtol 1e-12; integers and booleans exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tgc  # noqa: E402
from tgc.diagnostics import TgcError  # noqa: E402
from tgc.importers.onnx import import_onnx  # noqa: E402

OPSET = 17
RNG = np.random.default_rng()


def make_model(nodes, inputs, outputs, initializers=(), opset=OPSET, name="g"):
    """A model of `nodes`; inputs/outputs are (name, TensorProto type, shape) triples."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def random_input(shape, dtype=np.float32):
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def check_against_reference(model, feeds: dict, rtol=1e-5, atol=1e-6, **options):
    """Import, run on tgc's numpy interpreter and compare with onnx's ReferenceEvaluator."""
    module = import_onnx(model, **options)
    got = tgc.run(module, list(feeds.values()))
    want = ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape
        assert g.dtype == w.dtype
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
    return module


def import_error(model, **options) -> str:
    with pytest.raises(TgcError) as info:
        import_onnx(model, **options)
    return info.value.render()


# -- the framework ---------------------------------------------------------------------------------


def test_matmul_relu_add_with_initializer_and_names():
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], random_input((3, 4)).ravel())
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r.out"]),
            helper.make_node("Add", ["r.out", "h"], ["y"]),
        ],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 4])],
        [w],
    )
    module = check_against_reference(model, {"x": random_input((2, 3))})
    text = tgc.print_ir(module)
    assert "func.func @g(%x: tensor<2x3xf32>) -> tensor<2x4xf32>" in text
    assert "%h = atomic.matmul %x, %w" in text
    assert "%r.out = hl.relu %h" in text
    assert "%y = atomic.add %r.out, %h" in text


def test_weights_as_args_marks_parameters():
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], random_input((3, 4)).ravel())
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 4])],
        [w],
    )
    module = import_onnx(model, weights_as_args=True)
    func = module.funcs[0]
    assert [a.name_hint for a in func.args] == ["x", "w"]
    assert not func.is_param(0) and func.is_param(1)
    x, wv = random_input((2, 3)), onnx.numpy_helper.to_array(w)
    np.testing.assert_allclose(tgc.run(module, [x, wv])[0], x @ wv, rtol=1e-5, atol=1e-6)


def test_unsupported_op_names_the_node():
    model = make_model(
        [helper.make_node("Hardmax", ["x"], ["y"], name="hm")],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 3])],
    )
    assert import_error(model) == (
        "<onnx model>: error: node 'hm' (Hardmax): op type 'Hardmax' is not supported "
        "(docs/onnx.md lists those that are)"
    )


def test_matmul_of_vectors_follows_numpy():
    for a_shape, b_shape in [((3,), (3,)), ((3,), (2, 3, 4)), ((2, 5, 3), (3,)), ((4, 3), (3,))]:
        model = make_model(
            [helper.make_node("MatMul", ["a", "b"], ["y"])],
            [("a", TensorProto.FLOAT, list(a_shape)), ("b", TensorProto.FLOAT, list(b_shape))],
            [("y", TensorProto.FLOAT, list(np.matmul(np.ones(a_shape), np.ones(b_shape)).shape))],
        )
        feeds = {"a": random_input(a_shape), "b": random_input(b_shape)}
        check_against_reference(model, feeds)

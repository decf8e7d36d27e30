"""tgc.importers.onnx: tiny models built with onnx.helper, imported, run on the numpy interpreter
and compared with onnx's ReferenceEvaluator on fresh random inputs; and every diagnostic.

Tolerances: f32 results rtol 1e-5, atol 1e-6 (one rounding per op against the same f32 math);
f64 rtol 1e-12; integers and booleans exactly.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tgc  # noqa: E402
from tgc.diagnostics import TgcError  # noqa: E402
from tgc.importers.onnx import import_model, import_onnx  # noqa: E402

import onnx_testing  # noqa: E402

OPSET = 17
RNG = onnx_testing.RNG


def make_model(nodes, inputs, outputs, initializers=(), opset=OPSET, name="g"):
    return onnx_testing.make_model(nodes, inputs, outputs, initializers, opset=opset, name=name)


random_input = onnx_testing.random_array


def check_against_reference(model, feeds: dict, rtol=1e-5, atol=1e-6, **options):
    """Import, run on tgc's numpy interpreter and compare with onnx's ReferenceEvaluator."""
    module = import_onnx(model, **options)
    got = tgc.run(module, list(feeds.values()))
    want = ReferenceEvaluator(model).run(None, feeds)
    onnx_testing.assert_outputs_match(got, want, rtol, atol)
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


@pytest.fixture
def no_det(monkeypatch):
    """'Det' has no converter (should one be written, these tests still test the error)."""
    from tgc.importers.onnx import registry

    monkeypatch.delitem(registry.CONVERTERS, "Det", raising=False)


def test_unsupported_op_names_the_node(no_det):
    model = make_model(
        [helper.make_node("Det", ["x"], ["y"], name="det")],
        [("x", TensorProto.FLOAT, [3, 3])],
        [("y", TensorProto.FLOAT, [])],
    )
    assert import_error(model) == (
        "<onnx model>: error: node 'det' (Det): op type 'Det' is not supported "
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


# -- elementwise ops against onnx's reference ------------------------------------------------------


def positive(shape):
    return (np.abs(random_input(shape)) + 0.1).astype(np.float32)


UNARY_CASES = [
    ("Neg", {}, random_input),
    ("Abs", {}, random_input),
    ("Exp", {}, random_input),
    ("Log", {}, positive),
    ("Sqrt", {}, positive),
    ("Reciprocal", {}, positive),
    ("Erf", {}, random_input),
    ("Sin", {}, random_input),
    ("Cos", {}, random_input),
    ("Tan", {}, random_input),
    ("Tanh", {}, random_input),
    ("Sigmoid", {}, random_input),
    ("Relu", {}, random_input),
    ("Sign", {}, random_input),
    ("LeakyRelu", {}, random_input),
    ("LeakyRelu", {"alpha": 0.3}, random_input),
    ("Elu", {}, random_input),
    ("Elu", {"alpha": 0.5}, random_input),
    ("Selu", {}, random_input),
    ("Selu", {"alpha": 2.0, "gamma": 3.0}, random_input),
    ("Celu", {}, random_input),
    ("Celu", {"alpha": 2.0}, random_input),
    ("ThresholdedRelu", {}, random_input),
    ("ThresholdedRelu", {"alpha": 0.5}, random_input),
    ("HardSigmoid", {}, random_input),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, random_input),
    ("HardSwish", {}, lambda s: 4 * random_input(s)),
    # Within ±80: onnx's float32 reference computes log(exp(x) + 1), whose exp overflows past 88
    # (test_softplus_stays_finite checks tgc there against float64).
    ("Softplus", {}, lambda s: np.clip(30 * random_input(s), -80, 80)),
    ("Softsign", {}, random_input),
    ("Mish", {}, lambda s: 10 * random_input(s)),
]


@pytest.mark.parametrize(
    ("op", "attrs", "make"), UNARY_CASES, ids=[f"{op}{attrs or ''}" for op, attrs, _ in UNARY_CASES]
)
def test_unary(op, attrs, make):
    model = make_model(
        [helper.make_node(op, ["x"], ["y"], **attrs)],
        [("x", TensorProto.FLOAT, [3, 5])],
        [("y", TensorProto.FLOAT, [3, 5])],
        opset=18,
    )
    check_against_reference(model, {"x": make((3, 5))}, rtol=2e-5, atol=2e-6)


def test_softplus_stays_finite():
    """Softplus on values whose exp overflows float32 matches float64 log(1 + exp(x))."""
    model = make_model(
        [helper.make_node("Softplus", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 8])],
        [("y", TensorProto.FLOAT, [2, 8])],
        opset=18,
    )
    x = (RNG.uniform(89, 1000, (2, 8)) * RNG.choice([-1, 1], (2, 8))).astype(np.float32)
    (got,) = tgc.run(import_onnx(model), [x])
    want = np.logaddexp(0.0, x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-30)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset20(approximate):
    model = make_model(
        [helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)],
        [("x", TensorProto.FLOAT, [4, 6])],
        [("y", TensorProto.FLOAT, [4, 6])],
        opset=20,
    )
    module = check_against_reference(model, {"x": random_input((4, 6))})
    assert f'approximate = "{approximate}"' in tgc.print_ir(module) or approximate == "none"


def test_special_values_of_sign_isnan_isinf():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.5, -3.0], dtype=np.float32)
    for op, attrs, out in [
        ("Sign", {}, TensorProto.FLOAT),
        ("IsNaN", {}, TensorProto.BOOL),
        ("IsInf", {}, TensorProto.BOOL),
        ("IsInf", {"detect_negative": 0}, TensorProto.BOOL),
        ("IsInf", {"detect_positive": 0}, TensorProto.BOOL),
        ("IsInf", {"detect_positive": 0, "detect_negative": 0}, TensorProto.BOOL),
    ]:
        model = make_model(
            [helper.make_node(op, ["x"], ["y"], **attrs)],
            [("x", TensorProto.FLOAT, [7])],
            [("y", out, [7])],
            opset=20,
        )
        check_against_reference(model, {"x": x})


BROADCAST_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((), (2, 3))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCAST_SHAPES)
def test_binary_float_broadcasting(op, a_shape, b_shape):
    out = np.broadcast_shapes(a_shape, b_shape)
    model = make_model(
        [helper.make_node(op, ["a", "b"], ["y"])],
        [("a", TensorProto.FLOAT, list(a_shape)), ("b", TensorProto.FLOAT, list(b_shape))],
        [("y", TensorProto.FLOAT, list(out))],
    )
    a = positive(a_shape) if op == "Pow" else random_input(a_shape)
    b = positive(b_shape) if op in ("Div", "Pow") else random_input(b_shape)
    check_against_reference(model, {"a": a, "b": b}, rtol=2e-5)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_binary_integers(op, dtype):
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model(
        [helper.make_node(op, ["a", "b"], ["y"])],
        [("a", onnx_type, [3, 4]), ("b", onnx_type, [4])],
        [("y", onnx_type, [3, 4])],
    )
    b = random_input((4,), dtype)
    b[b == 0] = 3  # integer division by zero is undefined in ONNX
    check_against_reference(model, {"a": random_input((3, 4), dtype), "b": b})


def test_pow_with_other_exponent_type_and_integer_base():
    for base, exponent in [
        (TensorProto.FLOAT, TensorProto.INT64),
        (TensorProto.INT64, TensorProto.INT64),
        (TensorProto.INT32, TensorProto.FLOAT),
    ]:
        model = make_model(
            [helper.make_node("Pow", ["x", "y"], ["z"])],
            [("x", base, [2, 3]), ("y", exponent, [3])],
            [("z", base, [2, 3])],
        )
        x_dtype = helper.tensor_dtype_to_np_dtype(base)
        y_dtype = helper.tensor_dtype_to_np_dtype(exponent)
        feeds = {
            "x": random_input((2, 3), x_dtype),
            "y": np.array([0, 1, 3]).astype(y_dtype),
        }
        check_against_reference(model, feeds)


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparisons(op, dtype):
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = make_model(
        [helper.make_node(op, ["a", "b"], ["y"])],
        [("a", onnx_type, [3, 4]), ("b", onnx_type, [4])],
        [("y", TensorProto.BOOL, [3, 4])],
    )
    a, b = random_input((3, 4), dtype), random_input((4,), dtype)
    a[0] = b  # some equal elements
    check_against_reference(model, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor", "Not", "Equal"])
def test_logic_on_bools(op):
    inputs = ["a"] if op == "Not" else ["a", "b"]
    model = make_model(
        [helper.make_node(op, inputs, ["y"])],
        [("a", TensorProto.BOOL, [3, 4]), ("b", TensorProto.BOOL, [4])][: len(inputs)],
        [("y", TensorProto.BOOL, [3, 4])],
    )
    feeds = {"a": random_input((3, 4), np.bool_), "b": random_input((4,), np.bool_)}
    check_against_reference(model, {k: feeds[k] for k in inputs})


def test_where_broadcasts_three_ways():
    model = make_model(
        [helper.make_node("Where", ["c", "a", "b"], ["y"])],
        [
            ("c", TensorProto.BOOL, [3, 1]),
            ("a", TensorProto.FLOAT, [4]),
            ("b", TensorProto.FLOAT, [2, 1, 1]),
        ],
        [("y", TensorProto.FLOAT, [2, 3, 4])],
    )
    feeds = {
        "c": random_input((3, 1), np.bool_),
        "a": random_input((4,)),
        "b": random_input((2, 1, 1)),
    }
    check_against_reference(model, feeds)


@pytest.mark.parametrize(
    "bounds",
    [(), ("lo",), ("lo", "hi"), ("", "hi")],
    ids=["none", "min", "min-max", "max"],
)
def test_clip_optional_bounds(bounds):
    inits = [
        helper.make_tensor("lo", TensorProto.FLOAT, [], [-0.5]),
        helper.make_tensor("hi", TensorProto.FLOAT, [], [0.7]),
    ]
    model = make_model(
        [helper.make_node("Clip", ["x", *bounds], ["y"])],
        [("x", TensorProto.FLOAT, [3, 4])],
        [("y", TensorProto.FLOAT, [3, 4])],
        inits,
    )
    check_against_reference(model, {"x": random_input((3, 4))})


def test_prelu_slope_broadcasts():
    slope = helper.make_tensor("s", TensorProto.FLOAT, [4], random_input((4,)).ravel())
    model = make_model(
        [helper.make_node("PRelu", ["x", "s"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 3, 4])],
        [("y", TensorProto.FLOAT, [2, 3, 4])],
        [slope],
    )
    check_against_reference(model, {"x": random_input((2, 3, 4))})


CAST_TYPES = [
    TensorProto.FLOAT,
    TensorProto.DOUBLE,
    TensorProto.FLOAT16,
    TensorProto.BFLOAT16,
    TensorProto.INT8,
    TensorProto.INT32,
    TensorProto.INT64,
    TensorProto.BOOL,
]


@pytest.mark.parametrize("source", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL])
@pytest.mark.parametrize("target", CAST_TYPES, ids=lambda t: TensorProto.DataType.Name(t))
def test_cast(source, target):
    model = make_model(
        [helper.make_node("Cast", ["x"], ["y"], to=target)],
        [("x", source, [3, 4])],
        [("y", target, [3, 4])],
    )
    x = random_input((3, 4), helper.tensor_dtype_to_np_dtype(source))
    if source == TensorProto.FLOAT:
        x = (x * 20).astype(np.float32)  # fractions truncate toward zero; in range of int8
    check_against_reference(model, {"x": x})


def test_cast_like_takes_the_target_type():
    model = make_model(
        [helper.make_node("CastLike", ["x", "t"], ["y"])],
        [("x", TensorProto.FLOAT, [3]), ("t", TensorProto.FLOAT16, [1])],
        [("y", TensorProto.FLOAT16, [3])],
    )
    check_against_reference(
        model, {"x": random_input((3,)), "t": np.zeros(1, np.float16)}, rtol=1e-3
    )


@pytest.mark.parametrize(
    ("attrs", "out_type", "shape"),
    [
        ({"value": helper.make_tensor("v", TensorProto.FLOAT, [2, 2], [1, 2, 3, 4])}, 1, [2, 2]),
        ({"value": helper.make_tensor("v", TensorProto.INT32, [3], [7, 8, 9])}, 6, [3]),
        ({"value_float": 2.5}, TensorProto.FLOAT, []),
        ({"value_floats": [1.5, -2.0]}, TensorProto.FLOAT, [2]),
        ({"value_int": 7}, TensorProto.INT64, []),
        ({"value_ints": [3, 4, 5]}, TensorProto.INT64, [3]),
    ],
    ids=["tensor-f32", "tensor-i32", "value_float", "value_floats", "value_int", "value_ints"],
)
def test_constant_forms(attrs, out_type, shape):
    model = make_model(
        [
            helper.make_node("Constant", [], ["c"], **attrs),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        [("x", out_type, shape)],
        [("y", out_type, shape)],
    )
    x = random_input(tuple(shape), helper.tensor_dtype_to_np_dtype(out_type))
    module = check_against_reference(model, {"x": x})
    assert "%c = atomic.constant" in tgc.print_ir(module)


def test_constant_and_identity_as_graph_outputs():
    model = make_model(
        [
            helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0]),
            helper.make_node("Identity", ["c"], ["k"]),
            helper.make_node("Identity", ["x"], ["y"]),
        ],
        [("x", TensorProto.FLOAT, [2])],
        [("k", TensorProto.FLOAT, [2]), ("y", TensorProto.FLOAT, [2])],
    )
    check_against_reference(model, {"x": random_input((2,))})


VARIADIC_NUMPY = {"Max": np.maximum, "Min": np.minimum, "Sum": np.add, "Mean": np.add}


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_variadic(op, count):
    """Against numpy in float64 (onnx's reference Mean does not broadcast its first input)."""
    shapes = [(3, 4), (4,), (2, 1, 1)][:count]
    out = np.broadcast_shapes(*shapes)
    names = [f"x{i}" for i in range(count)]
    model = make_model(
        [helper.make_node(op, names, ["y"])],
        [(n, TensorProto.FLOAT, list(s)) for n, s in zip(names, shapes)],
        [("y", TensorProto.FLOAT, list(out))],
    )
    xs = [random_input(s) for s in shapes]
    (got,) = tgc.run(import_onnx(model), xs)
    want = functools.reduce(VARIADIC_NUMPY[op], [x.astype(np.float64) for x in xs])
    if op == "Mean":
        want = want / count
    assert got.shape == out and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((3,), (2, 3, 4)),
    ((4, 3), (3,)),
    ((2, 5, 3), (3,)),
    ((2, 4), (4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
]


@pytest.mark.parametrize(("a_shape", "b_shape"), MATMUL_SHAPES, ids=str)
def test_matmul_follows_numpy(a_shape, b_shape):
    out = np.matmul(np.ones(a_shape), np.ones(b_shape)).shape
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [("a", TensorProto.FLOAT, list(a_shape)), ("b", TensorProto.FLOAT, list(b_shape))],
        [("y", TensorProto.FLOAT, list(out))],
    )
    check_against_reference(model, {"a": random_input(a_shape), "b": random_input(b_shape)})


def test_matmul_integers():
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [("a", TensorProto.INT64, [2, 3]), ("b", TensorProto.INT64, [3, 4])],
        [("y", TensorProto.INT64, [2, 4])],
    )
    feeds = {"a": random_input((2, 3), np.int64), "b": random_input((3, 4), np.int64)}
    check_against_reference(model, feeds)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (3, 1), (3, 5)], ids=str)
def test_gemm(trans_a, trans_b, alpha, beta, c_shape):
    a_shape = (4, 3) if trans_a else (3, 4)
    b_shape = (5, 4) if trans_b else (4, 5)
    inputs = [("a", TensorProto.FLOAT, list(a_shape)), ("b", TensorProto.FLOAT, list(b_shape))]
    feeds = {"a": random_input(a_shape), "b": random_input(b_shape)}
    names = ["a", "b"]
    if c_shape is not None:
        inputs.append(("c", TensorProto.FLOAT, list(c_shape)))
        feeds["c"] = random_input(c_shape)
        names.append("c")
    node = helper.make_node(
        "Gemm", names, ["y"], alpha=alpha, beta=beta, transA=trans_a, transB=trans_b
    )
    model = make_model([node], inputs, [("y", TensorProto.FLOAT, [3, 5])])
    module = check_against_reference(model, feeds)
    text = tgc.print_ir(module)
    assert ("transpose_a = true" in text) == bool(trans_a)
    assert ("transpose_b = true" in text) == bool(trans_b)


def test_sixteen_bit_floats():
    for onnx_type, rtol in [(TensorProto.FLOAT16, 2e-3), (TensorProto.BFLOAT16, 2e-2)]:
        model = make_model(
            [
                helper.make_node("Mul", ["a", "b"], ["m"]),
                helper.make_node("Tanh", ["m"], ["y"]),
            ],
            [("a", onnx_type, [3, 4]), ("b", onnx_type, [4])],
            [("y", onnx_type, [3, 4])],
        )
        dtype = helper.tensor_dtype_to_np_dtype(onnx_type)
        a, b = random_input((3, 4)).astype(dtype), random_input((4,)).astype(dtype)
        (got,) = tgc.run(import_onnx(model), [a, b])
        want = np.tanh(a.astype(np.float64) * b.astype(np.float64))
        assert got.dtype == dtype
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol)


# -- import-time values, weights, shapes ----------------------------------------------------------


def test_nodes_on_known_values_fold_to_one_constant():
    """Add and Cast of initializers are computed at import time: the IR holds their result."""
    a = helper.make_tensor("a", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], [0.5, 0.5, 0.5])
    model = make_model(
        [
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Cast", ["s"], ["si"], to=TensorProto.INT64),
            helper.make_node("Cast", ["si"], ["sf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "sf"], ["y"]),
        ],
        [("x", TensorProto.FLOAT, [3])],
        [("y", TensorProto.FLOAT, [3])],
        [a, b],
    )
    module = check_against_reference(model, {"x": random_input((3,))})
    ops = [op.name for op in module.funcs[0].body.ops]
    assert ops == ["atomic.constant", "atomic.mul", "func.return"]
    assert "%sf = atomic.constant {value = dense<[1.0, 2.0, 3.0]>" in tgc.print_ir(module)


def big_linear_model(rows=40, cols=30):
    w = random_input((rows, cols))
    init = helper.make_tensor("fc/w:0", TensorProto.FLOAT, [rows, cols], w.ravel())
    zeros = helper.make_tensor("zeros", TensorProto.FLOAT, [rows, cols], np.zeros(rows * cols))
    model = make_model(
        [
            helper.make_node("Add", ["fc/w:0", "zeros"], ["w2"]),
            helper.make_node("MatMul", ["x", "fc/w:0"], ["h"]),
            helper.make_node("Add", ["h", "bias"], ["y"]),
        ],
        [("x", TensorProto.FLOAT, [2, rows])],
        [("y", TensorProto.FLOAT, [2, cols]), ("w2", TensorProto.FLOAT, [rows, cols])],
        [init, zeros, helper.make_tensor("bias", TensorProto.FLOAT, [cols], np.ones(cols))],
    )
    return model, w


def test_large_constants_go_to_files_and_read_back(tmp_path):
    model, w = big_linear_model()
    result = import_model(model, weights_dir="m.weights", inline_limit=1000)
    text = tgc.print_ir(result.module)
    # Sanitised names: the value %fc_w_0, the file fc_w_0.npy; the bias (30 elements) is inline.
    assert '%fc_w_0 = atomic.constant {value = dense_file<"m.weights/fc_w_0.npy">' in text
    assert "%bias = atomic.constant {value = dense<1.0> : tensor<30xf32>}" in text
    # The folded w + 0 is another constant of 1200 elements: a file of its own.
    assert 'dense_file<"m.weights/w2.npy">' in text
    assert sorted(result.files) == ["m.weights/fc_w_0.npy", "m.weights/w2.npy"]

    from tgc.tools.import_ import write_weights

    write_weights(result.module, tmp_path)
    (tmp_path / "m.tg").write_text(text)
    reread = tgc.parse_file(tmp_path / "m.tg")
    x = random_input((2, 40))
    y, w2 = tgc.run(reread, [x])
    np.testing.assert_allclose(y, x.astype(np.float64) @ w + 1, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(w2, w)


def test_inline_without_weights_dir_and_below_the_limit():
    model, _ = big_linear_model(4, 3)
    assert "dense_file" not in tgc.print_ir(import_onnx(model, weights_dir="w", inline_limit=12))
    model, _ = big_linear_model()
    assert "dense_file" not in tgc.print_ir(import_onnx(model, inline_limit=10))


def test_weights_as_args_keeps_integers_and_scalars_constant():
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], random_input((3, 4)).ravel())
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [2.0])
    shift = helper.make_tensor("shift", TensorProto.INT64, [4], [1, 2, 3, 4])
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], random_input((3,)))
    model = make_model(
        [
            helper.make_node("Add", ["x", "b"], ["xb"]),  # b is read first: the first parameter
            helper.make_node("MatMul", ["xb", "w"], ["h"]),
            helper.make_node("Mul", ["h", "scale"], ["s"]),
            helper.make_node("Cast", ["shift"], ["shift_f"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["s", "shift_f"], ["y"]),
        ],
        [("x", TensorProto.FLOAT, [2, 3])],
        [("y", TensorProto.FLOAT, [2, 4])],
        [w, scale, shift, b],
    )
    module = import_onnx(model, weights_as_args=True)
    func = module.funcs[0]
    assert [a.name_hint for a in func.args] == ["x", "b", "w"]
    assert [func.is_param(i) for i in range(3)] == [False, True, True]
    text = tgc.print_ir(module)
    assert "%b: tensor<3xf32> {tgc.param}, %w: tensor<3x4xf32> {tgc.param}" in text
    assert "%scale = atomic.constant" in text
    assert "%shift_f = atomic.constant" in text  # folded from the integer initializer
    x = random_input((2, 3))
    bv, wv = (onnx.numpy_helper.to_array(t) for t in (b, w))
    (got,) = tgc.run(module, [x, bv, wv])
    want = (x.astype(np.float64) + bv) @ wv * 2 + np.arange(1, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_graph_output_that_is_an_initializer_or_input():
    c = helper.make_tensor("c", TensorProto.FLOAT, [2], [1.0, 2.0])
    model = make_model(
        [], [("x", TensorProto.FLOAT, [2])], [("c", TensorProto.FLOAT, [2]), ("x", 1, [2])], [c]
    )
    x = random_input((2,))
    got = tgc.run(import_onnx(model), [x])
    np.testing.assert_array_equal(got[0], [1.0, 2.0])
    np.testing.assert_array_equal(got[1], x)


def dynamic_model():
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, ["batch", 4])],
        [("y", TensorProto.FLOAT, ["batch", 4])],
    )


def test_input_shapes_fix_symbolic_dims():
    module = import_onnx(dynamic_model(), input_shapes={"x": (3, 4)})
    assert "tensor<3x4xf32>" in tgc.print_ir(module)
    x = random_input((3, 4))
    np.testing.assert_array_equal(tgc.run(module, [x])[0], np.maximum(x, 0))


def test_declared_output_dims_that_are_symbols_are_not_checked():
    module = import_onnx(dynamic_model(), input_shapes={"x": (0, 4)})
    assert "tensor<0x4xf32>" in tgc.print_ir(module)


# -- diagnostics ------------------------------------------------------------------------------------


def one_node(op, inputs=("x",), attrs=None, name="n", in_type=TensorProto.FLOAT, shape=(2, 3)):
    return make_model(
        [helper.make_node(op, list(inputs), ["y"], name=name, **(attrs or {}))],
        [(i, in_type, list(shape)) for i in inputs if i],
        [("y", TensorProto.FLOAT, list(shape))],
    )


def test_dynamic_shape_without_a_shape_is_refused():
    assert import_error(dynamic_model()) == (
        "<onnx model>: error: graph input 'x' has a dynamic shape [batch, 4]; tgc tensors are "
        "static: give the shape with --input-shape x=DIMS (e.g. 1x4)"
    )


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"z": (1,)}, "an input shape is given for 'z', which is not a graph input (inputs: 'x')"),
        ({"x": (2,)}, "the shape given for input 'x' has rank 1, the model's has rank 2"),
        ({"x": (2, 5)}, "the shape given for input 'x' has 5 at dim 1, the model fixes it to 4"),
    ],
)
def test_bad_input_shapes(shapes, message):
    assert import_error(dynamic_model(), input_shapes=shapes) == f"<onnx model>: error: {message}"


def test_unnamed_node_is_named_by_its_position(no_det):
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 2])],
        [("y", TensorProto.FLOAT, [])],
    )
    assert "error: node #1 (Det): op type 'Det' is not supported" in import_error(model)


def test_other_domains_are_refused():
    model = one_node("FusedMatMul", ("x", "z"), name="f")
    model.graph.node[0].domain = "com.microsoft"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert import_error(model) == (
        "<onnx model>: error: node 'f' (FusedMatMul): operator domain 'com.microsoft' is not "
        "supported"
    )


def test_unsupported_attribute_value():
    model = one_node("Gelu", attrs={"approximate": "sigmoid"}, name="g")
    model.opset_import[0].version = 20
    assert import_error(model) == (
        "<onnx model>: error: node 'g' (Gelu): approximate = 'sigmoid' is not supported "
        "(only 'none', 'tanh')"
    )


def test_a_converter_that_leaves_an_attribute_or_input_unread_is_refused(monkeypatch):
    from tgc.importers.onnx import registry

    # Hardmax has an 'axis' attribute; this converter does not read it.
    monkeypatch.setitem(registry.CONVERTERS, "Hardmax", lambda ctx: ctx.b.hl.relu(ctx.input(0)))
    model = one_node("Hardmax", attrs={"axis": 0}, name="h")
    assert import_error(model) == (
        "<onnx model>: error: node 'h' (Hardmax): attribute 'axis' is not supported"
    )
    monkeypatch.setitem(registry.CONVERTERS, "Add", lambda ctx: ctx.b.hl.relu(ctx.input(0)))
    assert import_error(one_node("Add", ("x", "z"), name="a")) == (
        "<onnx model>: error: node 'a' (Add): input #1 ('z') is not supported"
    )


def test_an_output_not_produced_is_refused(monkeypatch):
    from tgc.importers.onnx import registry

    monkeypatch.setitem(registry.CONVERTERS, "Dropout", lambda ctx: [ctx.input(0), None])
    model = make_model(
        [helper.make_node("Dropout", ["x"], ["y", "mask"], name="d")],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2]), ("mask", TensorProto.BOOL, [2])],
    )
    message = import_error(model)
    assert message == "<onnx model>: error: node 'd' (Dropout): output #1 ('mask') is not supported"


def test_require_static_names_the_input(monkeypatch):
    from tgc.importers.onnx import registry

    def needs_constant_slope(ctx):
        ctx.require_static(1, "'slope'")
        return ctx.input(0)

    monkeypatch.setitem(registry.CONVERTERS, "PRelu", needs_constant_slope)
    assert import_error(one_node("PRelu", ("x", "s"), name="p")) == (
        "<onnx model>: error: node 'p' (PRelu): 'slope' ('s') must be a constant (an "
        "initializer or computed from constants): tgc tensors have static shapes"
    )


def test_verifier_errors_are_worded_for_the_node():
    model = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add")],
        [("a", TensorProto.FLOAT, [2, 3]), ("b", TensorProto.FLOAT, [4])],
        [("y", TensorProto.FLOAT, [2, 3])],
    )
    assert import_error(model) == (
        "<onnx model>: error: node 'add' (Add): shapes (2, 3) and (4,) are not broadcast-compatible"
    )


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            lambda: make_model(
                [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                [("a", TensorProto.FLOAT, []), ("b", TensorProto.FLOAT, [3])],
                [("y", TensorProto.FLOAT, [3])],
            ),
            "node 'mm' (MatMul): operands must have rank >= 1, got tensor<f32> and tensor<3xf32>",
        ),
        (
            lambda: make_model(
                [helper.make_node("Gemm", ["a", "b"], ["y"], name="gm")],
                [("a", TensorProto.FLOAT, [2, 2, 3]), ("b", TensorProto.FLOAT, [3, 4])],
                [("y", TensorProto.FLOAT, [2, 4])],
            ),
            "node 'gm' (Gemm): A and B must have rank 2, got tensor<2x2x3xf32> and tensor<3x4xf32>",
        ),
        (
            lambda: make_model(
                [helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gm")],
                [
                    ("a", TensorProto.FLOAT, [2, 3]),
                    ("b", TensorProto.FLOAT, [3, 4]),
                    ("c", TensorProto.FLOAT, [3, 2, 4]),
                ],
                [("y", TensorProto.FLOAT, [2, 4])],
            ),
            "node 'gm' (Gemm): C tensor<3x2x4xf32> does not broadcast to the product's shape "
            "[2, 4]",
        ),
        (
            lambda: make_model(
                [helper.make_node("Clip", ["x", "lo"], ["y"], name="cl")],
                [("x", TensorProto.FLOAT, [2, 3]), ("lo", TensorProto.FLOAT, [2])],
                [("y", TensorProto.FLOAT, [2, 3])],
            ),
            "node 'cl' (Clip): input #1 must be a scalar, got tensor<2xf32>",
        ),
        (
            lambda: make_model(
                [helper.make_node("Softplus", ["x"], ["y"], name="sp")],
                [("x", TensorProto.INT32, [2])],
                [("y", TensorProto.INT32, [2])],
            ),
            "node 'sp' (Softplus): input #0 must have a float element type, got tensor<2xi32>",
        ),
        (
            lambda: make_model(
                [helper.make_node("Where", ["c", "x", "x"], ["y"], name="w")],
                [("c", TensorProto.FLOAT, [2]), ("x", TensorProto.FLOAT, [2])],
                [("y", TensorProto.FLOAT, [2])],
            ),
            "node 'w' (Where): input #0 must be bool, got tensor<2xf32>",
        ),
        (
            lambda: make_model(
                [helper.make_node("Relu", ["x"], ["y"])],
                [("x", TensorProto.FLOAT, [2])],
                [("y", TensorProto.FLOAT, [3])],
            ),
            "graph output 'y' is tensor<2xf32> here, but the model declares float [3]",
        ),
    ],
    ids=["matmul-rank0", "gemm-rank3", "gemm-c", "clip-bound", "float-only", "where-cond", "out"],
)
def test_converter_diagnostics(model, message):
    assert import_error(model()) == f"<onnx model>: error: {message}"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: one_node("Relu", in_type=TensorProto.UINT8),
            "graph input 'x' has element type uint8, which tgc does not support (supported: "
            "float, double, float16, bfloat16, int8, int32, int64, bool)",
        ),
        (
            lambda: make_model(
                [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT16, name="c")],
                [("x", TensorProto.FLOAT, [2])],
                [("y", TensorProto.UINT16, [2])],
            ),
            "node 'c' (Cast): casting to uint16 is not supported (tgc's element types: float, "
            "double, float16, bfloat16, int8, int32, int64, bool)",
        ),
        (
            lambda: make_model(
                [helper.make_node("Identity", ["u"], ["y"])],
                [],
                [("y", TensorProto.UINT8, [2])],
                [helper.make_tensor("u", TensorProto.UINT8, [2], [1, 2])],
            ),
            "initializer 'u' has element type uint8, which tgc does not support (supported: "
            "float, double, float16, bfloat16, int8, int32, int64, bool)",
        ),
        (
            lambda: make_model(
                [helper.make_node("Constant", [], ["y"], value_string="hi", name="k")],
                [],
                [("y", TensorProto.STRING, [])],
            ),
            "node 'k' (Constant): attribute 'value_string' is not supported (no such tgc tensor)",
        ),
        (
            lambda: make_model(
                [
                    helper.make_node(
                        "Constant",
                        [],
                        ["y"],
                        name="k",
                        value=helper.make_tensor("v", TensorProto.INT16, [1], [3]),
                    )
                ],
                [],
                [("y", TensorProto.INT16, [1])],
            ),
            "node 'k' (Constant): attribute 'value' has element type int16, which tgc does not "
            "support (supported: float, double, float16, bfloat16, int8, int32, int64, bool)",
        ),
        (
            lambda: one_node("Relu", name="r").__class__(),
            "not a valid ONNX model: The model does not have an ir_version set properly.",
        ),
    ],
    ids=["input-dtype", "cast-target", "initializer-dtype", "string", "constant-dtype", "empty"],
)
def test_unsupported_types(build, message):
    assert import_error(build()) == f"<onnx model>: error: {message}"


def test_old_opsets_are_refused():
    model = one_node("Relu")
    model.opset_import[0].version = 11
    assert import_error(model) == (
        "<onnx model>: error: the model uses ONNX opset 11; tgc-import reads opset 13 and later "
        "(onnx.version_converter.convert_version can upgrade it)"
    )


def test_files_that_are_not_models(tmp_path):
    assert import_error(tmp_path / "missing.onnx") == (
        f"error: could not open input file '{tmp_path / 'missing.onnx'}': no such file or directory"
    )
    assert import_error(tmp_path) == (
        f"error: could not open input file '{tmp_path}': it is a directory"
    )
    path = tmp_path / "m.onnx"
    path.write_bytes(b"\x08\x07\x12\xff\xff")  # ir_version 7, then a string of absurd length
    assert import_error(path) == (
        f"{path}: error: not a valid ONNX model (the file is not a readable ONNX protobuf: "
        "truncated or corrupt?)"
    )


def test_every_truncation_of_a_model_is_one_clear_error():
    model, _ = big_linear_model(6, 5)
    data = model.SerializeToString()
    messages = set()
    for cut in range(len(data)):
        with pytest.raises(TgcError) as info:
            import_onnx(data[:cut])
        messages.add(info.value.message.split(":")[0])
    assert messages == {
        "not a valid ONNX model (the file is not a readable ONNX protobuf",
        "not a valid ONNX model",
    }


@pytest.mark.parametrize("seed", range(20))
def test_random_bytes_are_one_clear_error(seed):
    rng = np.random.default_rng(seed)
    data = rng.bytes(int(rng.integers(1, 400)))
    with pytest.raises(TgcError) as info:
        import_onnx(data)
    assert info.value.message.startswith("not a valid ONNX model")


# -- the tool ---------------------------------------------------------------------------------------


def run_tool(args, capsys) -> tuple[int, str, str]:
    from tgc.tools.import_ import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_tool_exit_codes_and_outputs(tmp_path, capsys):
    model, w = big_linear_model()
    onnx.save(model, tmp_path / "m.onnx")
    code, out, err = run_tool([tmp_path / "m.onnx", "-o", "-"], capsys)
    assert (code, err) == (0, "")
    assert "func.func @g(" in out and "dense_file" not in out  # stdout: every constant inline

    code, out, err = run_tool([tmp_path / "m.onnx", "-o", tmp_path / "m.tg"], capsys)
    assert (code, out, err) == (0, "", "")
    np.testing.assert_array_equal(np.load(tmp_path / "m.weights" / "fc_w_0.npy"), w)
    assert 'dense_file<"m.weights/fc_w_0.npy">' in (tmp_path / "m.tg").read_text()

    code, out, err = run_tool([tmp_path / "missing.onnx"], capsys)
    assert code == 1 and out == ""
    assert (
        err
        == f"error: could not open input file '{tmp_path / 'missing.onnx'}': no such file or directory\n"
    )

    code, _, err = run_tool([tmp_path / "m.onnx", "--inline-limit", "-3"], capsys)
    assert code == 2 and "N must be a non-negative integer, got '-3'" in err

    code, _, err = run_tool([tmp_path / "m.onnx", "-o", tmp_path / "no" / "such" / "m.tg"], capsys)
    assert code == 1
    assert err == (
        f"error: could not write output file '{tmp_path / 'no' / 'such' / 'm.tg'}': its folder "
        "does not exist\n"
    )
    assert not (tmp_path / "no").exists()


def test_tool_does_not_write_through_a_symbolic_link(tmp_path, capsys):
    model, _ = big_linear_model()
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "m.weights").mkdir()
    victim = tmp_path / "precious.npy"
    victim.write_bytes(b"keep")
    (tmp_path / "m.weights" / "fc_w_0.npy").symlink_to(victim)
    code, _, err = run_tool([tmp_path / "m.onnx", "-o", tmp_path / "m.tg"], capsys)
    assert code == 1
    assert err.strip() == (
        f"error: cannot write weights file '{tmp_path / 'm.weights' / 'fc_w_0.npy'}': something "
        "that is not a regular file is in the way"
    )
    assert victim.read_bytes() == b"keep" and not (tmp_path / "m.tg").exists()


def test_tool_reports_an_unsupported_op_with_exit_1(tmp_path, capsys, no_det):
    onnx.save(one_node("Det", name="det", shape=(2, 2)), tmp_path / "h.onnx")
    code, out, err = run_tool([tmp_path / "h.onnx"], capsys)
    assert (code, out) == (1, "")
    assert err == (
        f"{tmp_path / 'h.onnx'}: error: node 'det' (Det): op type 'Det' is not supported "
        "(docs/onnx.md lists those that are)\n"
    )


def test_external_data_is_read_beside_the_model_file(tmp_path, monkeypatch):
    model, w = big_linear_model()
    for t in model.graph.initializer:  # external data is written for raw_data tensors only
        t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t), t.name))
    onnx.save_model(
        model,
        tmp_path / "m.onnx",
        save_as_external_data=True,
        location="m.bin",
        size_threshold=0,
    )
    monkeypatch.chdir(tmp_path.parent)  # the data file is found beside the model, not here
    x = random_input((2, 40))
    y, _ = tgc.run(import_onnx(tmp_path / "m.onnx"), [x])
    np.testing.assert_allclose(y, x.astype(np.float64) @ w + 1, rtol=1e-5, atol=1e-5)

    data = (tmp_path / "m.onnx").read_bytes()
    assert import_error(data) == (
        "<onnx bytes>: error: initializer 'fc/w:0' keeps its data in an external file: import "
        "the model from its path, so that the file is found beside it"
    )
    (tmp_path / "m.bin").unlink()
    message = import_error(tmp_path / "m.onnx")
    assert message.startswith(
        f"{tmp_path / 'm.onnx'}: error: could not load the model's external data: "
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("../secret.bin", "points outside the directory"),
        ("{outside}", "should be a relative path"),
        ("link.bin", "is a symbolic link"),
    ],
)
def test_external_data_may_not_leave_the_model_folder(tmp_path, location, why):
    """A model names its external data file; one outside the model's folder (by `..`, an
    absolute path or a symbolic link) is never read: one line, and nothing imported."""
    secret = tmp_path / "secret.bin"
    random_input((4,)).tofile(secret)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "link.bin").symlink_to(secret)
    w = onnx.numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", location.format(outside=secret)
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, [4])],
        [("y", TensorProto.FLOAT, [4])],
        [w],
    )
    path = tmp_path / "m" / "m.onnx"
    path.write_bytes(model.SerializeToString())
    message = import_error(path)
    assert message.startswith(f"{path}: error: could not load the model's external data: ")
    assert why in message and "\n" not in message


def test_tool_default_inline_limit_is_the_importers():
    from tgc.importers.onnx import DEFAULT_INLINE_LIMIT
    from tgc.tools import import_

    assert import_.DEFAULT_INLINE_LIMIT == DEFAULT_INLINE_LIMIT
    assert import_.build_arg_parser().parse_args(["m.onnx"]).inline_limit == DEFAULT_INLINE_LIMIT


def test_graphs_tgc_cannot_take():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    no_outputs = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], []),
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    assert import_error(no_outputs) == "<onnx model>: error: the graph has no outputs"
    other_domain_only = helper.make_model(
        helper.make_graph([], "g", [x], [x]),
        opset_imports=[helper.make_opsetid("com.microsoft", 1)],
    )
    assert import_error(other_domain_only) == (
        "<onnx model>: error: the model imports no version of the default ONNX operator set"
    )
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("s", TensorProto.FLOAT, [1], [1.0]),
        helper.make_tensor("i", TensorProto.INT64, [1], [0]),
        [3],
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "s"], ["y"])],
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    assert import_error(model) == "<onnx model>: error: sparse initializer 's' is not supported"

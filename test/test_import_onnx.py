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
    ("Softplus", {}, lambda s: 30 * random_input(s)),
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

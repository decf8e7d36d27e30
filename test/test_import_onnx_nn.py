"""ONNX reductions, ArgMax/ArgMin, softmax, normalisations and Attention through the importer
(importers/onnx/ops_nn.py, ops_attention.py): tiny one-node models on fresh random inputs, run on
tgc's numpy interpreter and compared with onnx's ReferenceEvaluator, or with numpy in float64
where the reference is wrong (noted at the test); and every diagnostic of these converters.

Tolerances: f32 rtol 1e-5, atol 1e-6 (a few roundings against the same f32 math; attention and
the normalisations sum in another order: rtol 1e-4, atol 1e-5); f16 rtol/atol 2e-3; f64 against
float64 numpy rtol 1e-12; integers and booleans exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tgc  # noqa: E402
from tgc.diagnostics import TgcError  # noqa: E402
from tgc.importers.onnx import import_onnx  # noqa: E402

import onnx_testing  # noqa: E402

RNG = onnx_testing.RNG
F32, F16, F64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
I32, I64, BOOL = TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
NP_OF = {F32: np.float32, F16: np.float16, F64: np.float64, I32: np.int32, I64: np.int64}
NP_OF[BOOL] = np.bool_
REDUCTIONS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
]


def make_model(nodes, inputs, outputs, initializers=(), opset=18):
    return onnx_testing.make_model(nodes, inputs, outputs, initializers, opset=opset)


def one_node(op, inputs, outputs, initializers=(), opset=18, **attrs):
    """A model of one node named 'n' reading the graph inputs and initializers, in order."""
    names = [i[0] for i in inputs] + [t.name for t in initializers]
    node = helper.make_node(op, names, [o[0] for o in outputs], name="n", **attrs)
    return make_model([node], inputs, outputs, initializers, opset)


def ints(name, values):
    return helper.make_tensor(name, I64, [len(values)], list(values))


def random(shape, dtype=np.float32):
    return onnx_testing.random_array(shape, dtype, int_range=(-4, 5))


def run_tgc(model, feeds):
    return tgc.run(import_onnx(model), list(feeds.values()))


compare = onnx_testing.assert_outputs_match


def check(model, feeds, rtol=1e-5, atol=1e-6):
    """Import and run on tgc; compare with onnx's ReferenceEvaluator. Returns the IR text."""
    with np.errstate(all="ignore"):
        want = ReferenceEvaluator(model).run(None, feeds)
    compare(run_tgc(model, feeds), want, rtol, atol)
    return tgc.print_ir(import_onnx(model))


def error_of(model) -> str:
    with pytest.raises(TgcError) as info:
        import_onnx(model)
    return info.value.render()


# -- reductions -----------------------------------------------------------------------------------


def reduction_model(op, shape, axes, keepdims=1, dtype=F32, as_input=True, out_shape=None, **kw):
    """`op` over `axes` (None: no axes at all) as an input (opset 18) or attribute (opset 17)."""
    if out_shape is None:
        x = np.zeros(shape)
        reduce_axes = None if not axes else tuple(axes)
        out_shape = np.sum(x, axis=reduce_axes, keepdims=bool(keepdims)).shape
        if kw.get("noop_with_empty_axes") and not axes:
            out_shape = shape
    inits, attrs = [], dict(kw, keepdims=keepdims)
    if axes is not None and as_input:
        inits = [ints("axes", axes)]
    elif axes is not None:
        attrs["axes"] = list(axes)
    opset = 18 if as_input else 17
    return one_node(op, [("x", dtype, shape)], [("y", dtype, out_shape)], inits, opset, **attrs)


def positive_if_log(op, x):
    """ReduceLogSum of a sum that may be negative is NaN: keep its inputs positive."""
    return np.abs(x) + 0.5 if op == "ReduceLogSum" else x


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("axes", [[1], [-1, 0], [0, 1, 2], None])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduction_axes_as_input_f32(op, axes, keepdims):
    x = positive_if_log(op, random((3, 5, 4)))
    text = check(reduction_model(op, (3, 5, 4), axes, keepdims), {"x": x}, rtol=1e-5, atol=1e-5)
    assert "func.func @g(%x: tensor<3x5x4xf32>)" in text


@pytest.mark.parametrize("op", [r for r in REDUCTIONS if r != "ReduceSum"])
def test_reduction_axes_as_attribute_before_opset_18(op):
    x = positive_if_log(op, random((2, 7, 3)))
    check(reduction_model(op, (2, 7, 3), [1, -1], 1, as_input=False), {"x": x}, atol=1e-5)


def test_reduction_of_f64_matches_float64_numpy():
    x = random((4, 6), np.float64)
    model = reduction_model("ReduceLogSumExp", (4, 6), [1], 0, dtype=F64)
    (got,) = run_tgc(model, {"x": x})
    np.testing.assert_allclose(got, np.log(np.sum(np.exp(x), axis=1)), rtol=1e-12)


@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_with_no_axes_and_noop_is_its_elementwise_part(op):
    x = positive_if_log(op, random((2, 3)))
    model = reduction_model(op, (2, 3), [], 1, noop_with_empty_axes=1)
    check(model, {"x": x}, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")
@pytest.mark.parametrize(
    "op, dtype",
    # the mean of no integers is an error (test_reduction_errors)
    [(op, F32) for op in REDUCTIONS] + [(op, I32) for op in REDUCTIONS if op != "ReduceMean"],
)
def test_reduction_over_an_empty_axis_is_the_empty_set_value(op, dtype):
    model = reduction_model(op, (2, 0, 3), [1], 1, dtype=dtype, out_shape=(2, 1, 3))
    x = np.zeros((2, 0, 3), NP_OF[dtype])
    if op == "ReduceSumSquare" and dtype == I32:
        # the reference returns int64 here (its own dtype slip); the values are what ONNX says
        (got,) = run_tgc(model, {"x": x})
        np.testing.assert_array_equal(got, np.zeros((2, 1, 3), np.int32))
        return
    check(model, {"x": x})


def test_reduction_keeping_an_empty_dim_reduces_the_others():
    model = reduction_model("ReduceMax", (2, 0, 4), [2], 1, out_shape=(2, 0, 1))
    (got,) = run_tgc(model, {"x": np.zeros((2, 0, 4), np.float32)})
    assert got.shape == (2, 0, 1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [I32, I64])
def test_reduction_of_integers_is_exact(op, dtype):
    x = random((3, 5), NP_OF[dtype])
    check(reduction_model(op, (3, 5), [1], 0, dtype=dtype), {"x": x})


@pytest.mark.parametrize(
    "op, fn",
    [
        ("ReduceL2", lambda x: np.sqrt(np.sum(x * x, axis=1))),
        ("ReduceLogSum", lambda x: np.log(np.sum(x, axis=1))),
        ("ReduceLogSumExp", lambda x: np.log(np.sum(np.exp(x), axis=1))),
    ],
)
def test_float_only_reductions_of_integers_are_computed_in_f64_and_truncated(op, fn):
    """As the reference's numpy does (its ReduceLogSum fails on integers: compared with numpy)."""
    x = RNG.integers(1, 9, size=(3, 5)).astype(np.int64)
    (got,) = run_tgc(reduction_model(op, (3, 5), [1], 0, dtype=I64), {"x": x})
    np.testing.assert_array_equal(got, fn(x.astype(np.float64)).astype(np.int64))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduction_of_bools_is_any_and_all(op):
    x = random((6, 3), np.bool_)
    check(reduction_model(op, (6, 3), [0], 1, dtype=BOOL), {"x": x})


def test_bool_max_over_nothing_is_false_as_onnx_says():
    """ONNX: the max over no elements is the type's least value (false); the reference casts -inf
    to bool and says true, so this compares with the specification."""
    model = reduction_model("ReduceMax", (2, 0), [1], 0, dtype=BOOL, out_shape=(2,))
    (got,) = run_tgc(model, {"x": np.zeros((2, 0), np.bool_)})
    np.testing.assert_array_equal(got, [False, False])


@pytest.mark.parametrize("n", [1, 2, 5, 7, 8, 13])
def test_product_of_any_length_multiplies_every_element_once(n):
    x = (RNG.random((3, n)) + 0.5).astype(np.float32)
    model = reduction_model("ReduceProd", (3, n), [1], 0)
    (got,) = run_tgc(model, {"x": x})
    np.testing.assert_allclose(got, np.prod(x.astype(np.float64), axis=1), rtol=1e-5)


def test_log_sum_exp_is_stable_for_large_and_infinite_values():
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0, 1]])
    model = reduction_model("ReduceLogSumExp", (3, 3), [1], 0, dtype=F64)
    (got,) = run_tgc(model, {"x": x})
    np.testing.assert_allclose(got, [1000.0 + math.log(2.0), -np.inf, np.inf], rtol=1e-12)


def test_reduction_errors():
    x = ("x", F32, (2, 3))
    dynamic_axes = one_node("ReduceSum", [x, ("a", I64, (1,))], [("y", F32, (2, 1))])
    assert error_of(dynamic_axes) == (
        "<onnx model>: error: node 'n' (ReduceSum): axes ('a') must be a constant (an "
        "initializer or computed from constants): tgc tensors have static shapes"
    )
    out_of_range = reduction_model("ReduceMax", (2, 3), [2], 1, out_shape=(2, 3))
    assert error_of(out_of_range).endswith(
        "node 'n' (ReduceMax): axis 2 is out of range for rank 2"
    )
    repeated = reduction_model("ReduceMax", (2, 3), [1, -1], 1, out_shape=(2, 1))
    assert error_of(repeated).endswith("node 'n' (ReduceMax): axes [1, -1] repeat an axis")
    boolean = reduction_model("ReduceSum", (2, 3), [1], 1, dtype=BOOL)
    assert error_of(boolean).endswith(
        "node 'n' (ReduceSum): ReduceSum of a bool tensor is not supported"
    )
    empty_int_mean = reduction_model("ReduceMean", (2, 0), [1], 1, dtype=I32, out_shape=(2, 1))
    assert error_of(empty_int_mean).endswith(
        "node 'n' (ReduceMean): the mean of no elements is undefined for i32"
    )


# -- ArgMax / ArgMin ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduction_with_ties(op, axis, keepdims, last):
    x = RNG.integers(0, 3, size=(3, 4, 5)).astype(np.float32)  # many ties
    shape = list(x.shape)
    shape[axis] = 1
    if not keepdims:
        del shape[axis]
    model = one_node(
        op,
        [("x", F32, x.shape)],
        [("y", I64, shape)],
        axis=axis,
        keepdims=keepdims,
        select_last_index=last,
    )
    check(model, {"x": x})


@pytest.mark.parametrize("dtype", [I32, BOOL])
def test_arg_reduction_of_integers_and_bools(dtype):
    x = random((4, 6), NP_OF[dtype])
    model = one_node("ArgMax", [("x", dtype, (4, 6))], [("y", I64, (4, 1))], axis=1)
    if dtype == BOOL:  # ONNX's ArgMax takes no bool: compare with numpy
        (got,) = run_tgc(model, {"x": x})
        np.testing.assert_array_equal(got, np.argmax(x, axis=1)[:, None])
        return
    check(model, {"x": x})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduction_returns_the_nan_as_numpy_does(op, last):
    x = random((3, 6))
    x[0, 2] = x[0, 4] = np.nan
    x[2, 5] = np.nan
    model = one_node(
        op, [("x", F32, (3, 6))], [("y", I64, (3,))], axis=1, keepdims=0, select_last_index=last
    )
    (got,) = run_tgc(model, {"x": x})
    fn = np.argmax if op == "ArgMax" else np.argmin
    want = fn(x, axis=1) if not last else 5 - fn(x[:, ::-1], axis=1)
    np.testing.assert_array_equal(got, want)


def test_arg_reduction_over_an_empty_axis_is_an_error():
    model = one_node("ArgMax", [("x", F32, (2, 0))], [("y", I64, (2, 1))], axis=1)
    assert error_of(model).endswith(
        "node 'n' (ArgMax): axis 1 has size 0: there is no position to return"
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_hardmax_is_one_at_the_first_maximum(axis):
    x = RNG.integers(0, 3, size=(3, 4, 5)).astype(np.float32)  # ties: the first one wins
    model = one_node("Hardmax", [("x", F32, x.shape)], [("y", F32, x.shape)], axis=axis)
    check(model, {"x": x})


# -- softmax --------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_softmax_along_one_axis(op, axis):
    attrs = {} if axis is None else {"axis": axis}
    model = one_node(op, [("x", F32, (3, 4, 5))], [("y", F32, (3, 4, 5))], opset=13, **attrs)
    text = check(model, {"x": random((3, 4, 5)) * 10}, rtol=1e-5, atol=1e-5)
    hl = "hl.softmax" if op == "Softmax" else "hl.log_softmax"
    assert f"%y = {hl} %x {{axis = {-1 % 3 if axis is None else axis % 3}}}" in text


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_of_large_numbers_and_f64(op):
    x = np.array([[1000.0, 999.0, -1000.0], [1e300, 0.0, -1e300]])
    model = one_node(op, [("x", F64, (2, 3))], [("y", F64, (2, 3))])
    (got,) = run_tgc(model, {"x": x})
    shifted = x - x.max(axis=1, keepdims=True)
    log_sm = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(got, log_sm if op == "LogSoftmax" else np.exp(log_sm), rtol=1e-12)


def test_softmax_errors():
    model = one_node("Softmax", [("x", F32, (2, 3))], [("y", F32, (2, 3))], axis=2)
    assert error_of(model).endswith("node 'n' (Softmax): axis 2 is out of range for rank 2")
    model = one_node("LogSoftmax", [("x", I32, (2, 3))], [("y", I32, (2, 3))])
    assert error_of(model).endswith(
        "node 'n' (LogSoftmax): input must be a float tensor, got tensor<2x3xi32>"
    )


# -- LayerNormalization, RMSNormalization ---------------------------------------------------------


def norm_model(op, shape, axis, param_shape, with_bias=True, outputs=1, dtype=F32, **attrs):
    names = ["Y", "Mean", "InvStdDev"][:outputs]
    stats = tuple(1 if i >= axis % len(shape) else d for i, d in enumerate(shape))
    outs = [("Y", dtype, shape)] + [(n, F32, stats) for n in names[1:]]
    inputs = [("x", dtype, shape), ("scale", dtype, param_shape)]
    if with_bias:
        inputs.append(("bias", dtype, param_shape))
    return one_node(op, inputs, outs, opset=23, axis=axis, **attrs)


def norm_feeds(shape, param_shape, with_bias=True, dtype=np.float32):
    feeds = {"x": random(shape, dtype) * 3 + 1, "scale": random(param_shape, dtype)}
    if with_bias:
        feeds["bias"] = random(param_shape, dtype)
    return feeds


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm_y_alone_is_hl_layernorm(axis, with_bias):
    shape = (2, 3, 5)
    params = shape[axis % 3 :]
    model = norm_model("LayerNormalization", shape, axis, params, with_bias, epsilon=0.1)
    text = check(model, norm_feeds(shape, params, with_bias), rtol=1e-4, atol=1e-5)
    assert f"hl.layernorm %x, %scale, %{'bias' if with_bias else '0'}" in text or (
        "hl.layernorm %x, %scale" in text
    )
    assert f"axis = {axis % 3}" in text and "eps = 0.1" in text


@pytest.mark.parametrize("axis", [1, -1])
@pytest.mark.parametrize("outputs", [2, 3])
def test_layernorm_mean_and_inv_std_dev_outputs(axis, outputs):
    shape = (2, 3, 4)
    params = shape[axis % 3 :]
    model = norm_model("LayerNormalization", shape, axis, params, outputs=outputs)
    text = check(model, norm_feeds(shape, params), rtol=1e-4, atol=1e-5)
    assert "hl.layernorm" not in text  # the statistics are built from atomic ops and hl.mean


def test_layernorm_inv_std_dev_alone():
    node = helper.make_node(
        "LayerNormalization", ["x", "scale", "bias"], ["Y", "", "InvStdDev"], name="n", axis=-1
    )
    model = make_model(
        [node],
        [("x", F32, (3, 4)), ("scale", F32, (4,)), ("bias", F32, (4,))],
        [("Y", F32, (3, 4)), ("InvStdDev", F32, (3, 1))],
        opset=17,
    )
    check(model, norm_feeds((3, 4), (4,)), rtol=1e-4, atol=1e-5)


def test_layernorm_scale_broadcasting_over_leading_dims_takes_the_atomic_form():
    shape = (2, 3, 4)
    model = norm_model("LayerNormalization", shape, -1, (3, 4))
    text = check(model, norm_feeds(shape, (3, 4)), rtol=1e-4, atol=1e-5)
    assert "hl.layernorm" not in text


def test_layernorm_scale_with_leading_ones_is_reshaped_for_hl():
    shape = (2, 3, 4)
    model = norm_model("LayerNormalization", shape, -1, (1, 1, 4))
    text = check(model, norm_feeds(shape, (1, 1, 4)), rtol=1e-4, atol=1e-5)
    assert "hl.layernorm" in text


def test_layernorm_f16_computes_in_the_f32_stash_type():
    shape = (4, 8)
    model = norm_model("LayerNormalization", shape, -1, (8,), dtype=F16)
    feeds = norm_feeds(shape, (8,), dtype=np.float16)
    text = check(model, feeds, rtol=2e-3, atol=2e-3)
    assert "hl.layernorm" in text and "tensor<4x8xf32>" in text


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_rmsnorm(axis):
    shape = (2, 3, 5)
    params = shape[axis % 3 :]
    model = norm_model("RMSNormalization", shape, axis, params, with_bias=False, epsilon=0.1)
    text = check(model, norm_feeds(shape, params, with_bias=False), rtol=1e-4, atol=1e-5)
    assert "hl.rmsnorm" in text and "eps = 0.1" in text


def test_rmsnorm_scale_broadcasting_over_leading_dims_and_f16():
    shape = (2, 3, 4)
    model = norm_model("RMSNormalization", shape, -1, (3, 1), with_bias=False)
    text = check(model, norm_feeds(shape, (3, 1), with_bias=False), rtol=1e-4, atol=1e-5)
    assert "hl.rmsnorm" not in text
    model = norm_model("RMSNormalization", shape, -1, (4,), with_bias=False, dtype=F16)
    check(model, norm_feeds(shape, (4,), False, np.float16), rtol=2e-3, atol=2e-3)


def test_normalization_errors():
    model = norm_model("LayerNormalization", (2, 3), -1, (2,))
    assert error_of(model).endswith(
        "node 'n' (LayerNormalization): scale tensor<2xf32> does not broadcast to the input "
        "tensor<2x3xf32>"
    )
    model = norm_model("LayerNormalization", (2, 3), 2, (3,))
    assert error_of(model).endswith(
        "node 'n' (LayerNormalization): axis 2 is out of range for rank 2"
    )
    model = norm_model("RMSNormalization", (2, 3), -1, (3,), with_bias=False, stash_type=7)
    assert error_of(model).endswith(
        "node 'n' (RMSNormalization): stash_type int64 is not a float type tgc supports"
    )
    model = norm_model("LayerNormalization", (2, 0), -1, (0,))
    assert error_of(model).endswith(
        "node 'n' (LayerNormalization): the normalised dims of tensor<2x0xf32> (from axis 1) "
        "hold no elements"
    )


# -- MeanVarianceNormalization, InstanceNormalization, BatchNormalization -------------------------


@pytest.mark.parametrize("axes", [None, [1], [0, -1]])
def test_mean_variance_normalization(axes):
    attrs = {} if axes is None else {"axes": axes}
    shape = (2, 3, 4, 2)
    model = one_node("MeanVarianceNormalization", [("x", F32, shape)], [("y", F32, shape)], **attrs)
    # channels 4 apart: over axis 1 alone a variance of 3 random values came near 0 about once
    # in 300 runs, and f32 rounding, divided by its root, failed the tolerance
    x = random(shape) * 2 + 1 + 4 * np.arange(shape[1], dtype=np.float32).reshape(1, -1, 1, 1)
    check(model, {"x": x}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5)])
def test_instance_normalization(shape):
    c = shape[1]
    model = one_node(
        "InstanceNormalization",
        [("x", F32, shape), ("scale", F32, (c,)), ("bias", F32, (c,))],
        [("y", F32, shape)],
        epsilon=0.01,
    )
    feeds = {"x": random(shape) + 2, "scale": random((c,)), "bias": random((c,))}
    check(model, feeds, rtol=1e-4, atol=1e-5)


def batchnorm_model(shape, training=0, outputs=1):
    c = (shape[1],)
    names = ["y", "running_mean", "running_var"][:outputs]
    return one_node(
        "BatchNormalization",
        [("x", F32, shape)] + [(n, F32, c) for n in ("scale", "bias", "mean", "var")],
        [("y", F32, shape)] + [(n, F32, c) for n in names[1:]],
        opset=15,
        epsilon=0.01,
        momentum=0.7,
        training_mode=training,
    )


def batchnorm_feeds(shape):
    c = (shape[1],)
    feeds = {"x": random(shape) + 1, "scale": random(c), "bias": random(c), "mean": random(c)}
    feeds["var"] = RNG.random(c).astype(np.float32) + 0.5
    return feeds


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 4)])
def test_batch_normalization_inference(shape):
    check(batchnorm_model(shape), batchnorm_feeds(shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("outputs", [1, 3])
def test_batch_normalization_training_mode(outputs):
    shape = (3, 2, 4, 2)
    check(batchnorm_model(shape, 1, outputs), batchnorm_feeds(shape), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape, groups", [((3, 4, 2, 2), 2), ((2, 6, 5), 3), ((2, 4, 3), 1)])
def test_group_normalization(shape, groups):
    c = shape[1]
    model = one_node(
        "GroupNormalization",
        [("x", F32, shape), ("scale", F32, (c,)), ("bias", F32, (c,))],
        [("y", F32, shape)],
        opset=21,
        num_groups=groups,
        epsilon=0.01,
    )
    feeds = {"x": random(shape) + 1, "scale": random((c,)), "bias": random((c,))}
    check(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_normalization_against_numpy(p, axis):
    """The reference's p=1 sums x, not |x|: compared with numpy in float64. A zero row stays 0."""
    x = random((3, 4))
    x[1] = 0.0
    model = one_node("LpNormalization", [("x", F32, (3, 4))], [("y", F32, (3, 4))], axis=axis, p=p)
    (got,) = run_tgc(model, {"x": x})
    norm = np.linalg.norm(x.astype(np.float64), ord=p, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        want = np.where(norm == 0, 0.0, x / norm)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 2, 3, 4), (1, 2, 2, 2, 3)])
def test_global_pools(op, shape):
    """Against numpy: the reference's GlobalMaxPool reduces the wrong dims unless x is 4D."""
    out = shape[:2] + (1,) * (len(shape) - 2)
    x = random(shape)
    (got,) = run_tgc(one_node(op, [("x", F32, shape)], [("y", F32, out)]), {"x": x})
    fn = np.mean if op == "GlobalAveragePool" else np.max
    want = fn(x.astype(np.float64), axis=tuple(range(2, len(shape))), keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_channel_normalization_errors():
    model = one_node(
        "InstanceNormalization",
        [("x", F32, (2, 3, 4)), ("scale", F32, (4,)), ("bias", F32, (3,))],
        [("y", F32, (2, 3, 4))],
    )
    assert error_of(model).endswith(
        "node 'n' (InstanceNormalization): scale must have shape [3] (the channels), got "
        "tensor<4xf32>"
    )
    model = one_node(
        "InstanceNormalization",
        [("x", F32, (2, 3)), ("scale", F32, (3,)), ("bias", F32, (3,))],
        [("y", F32, (2, 3))],
    )
    assert error_of(model).endswith(
        "node 'n' (InstanceNormalization): the input must be [N, C, ...] of rank >= 3, got "
        "tensor<2x3xf32>"
    )
    model = one_node(
        "GroupNormalization",
        [("x", F32, (2, 6, 3)), ("scale", F32, (6,)), ("bias", F32, (6,))],
        [("y", F32, (2, 6, 3))],
        opset=21,
        num_groups=4,
    )
    assert error_of(model).endswith(
        "node 'n' (GroupNormalization): num_groups 4 does not divide the 6 channels"
    )
    model = one_node("LpNormalization", [("x", F32, (2, 3))], [("y", F32, (2, 3))], p=3)
    assert error_of(model).endswith("node 'n' (LpNormalization): p = 3 is not supported (1 or 2)")
    model = batchnorm_model((2, 3), 0, 3)
    assert error_of(model).endswith(
        "node 'n' (BatchNormalization): running_mean and running_var are outputs of "
        "training_mode=1 only"
    )


# -- Attention ------------------------------------------------------------------------------------


def attention_numpy(q, k, v, mask=None, causal=False, past=0, scale=None, softcap=0.0):
    """ONNX Attention on 4D float64 arrays (K, V already with the past), as the specification
    says: heads repeated for grouped queries, causal from the top left shifted by the past."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if softcap:
        scores = softcap * np.tanh(scores / softcap)
    bias = np.zeros(scores.shape[-2:])
    if mask is not None:
        if mask.dtype == np.bool_:
            mask = np.where(mask, 0.0, -np.inf)
        pad = scores.shape[-1] - mask.shape[-1]
        mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=-np.inf)
        bias = bias + mask
    if causal:
        seq_q, total = scores.shape[-2:]
        allowed = np.arange(total)[None, :] <= np.arange(seq_q)[:, None] + past
        bias = bias + np.where(allowed, 0.0, -np.inf)
    scores = scores + bias
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def attention_model(q, k, v, extra=(), outputs=(), opset=23, **attrs):
    """Attention of graph inputs `extra` (name, type, shape) after Q, K, V, and of `outputs`
    ('' skips an optional input or output)."""
    inputs = [("Q", F32, q), ("K", F32, k), ("V", F32, v)] + [e for e in extra if e]
    names = ["Q", "K", "V"] + [e[0] if e else "" for e in extra]
    node = helper.make_node(
        "Attention", names, [o[0] if o else "" for o in outputs], name="n", **attrs
    )
    return make_model([node], inputs, [o for o in outputs if o], opset=opset)


def y_shape(q, v, q_heads=None, kv_heads=None):
    if len(q) == 4:
        return (q[0], q[1], q[2], v[3])
    return (q[0], q[1], q_heads * v[2] // kv_heads)


@pytest.mark.parametrize(
    "q, k, v",
    [
        ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)),  # cross attention
        ((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 4)),  # self attention, other value size
        ((1, 6, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)),  # grouped queries
        ((2, 4, 3, 4), (2, 1, 7, 4), (2, 1, 7, 4)),  # one key/value head
    ],
)
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_4d(q, k, v, causal):
    model = attention_model(q, k, v, outputs=[("Y", F32, y_shape(q, v))], is_causal=causal)
    feeds = {"Q": random(q), "K": random(k), "V": random(v)}
    text = check(model, feeds, rtol=1e-4, atol=1e-5)
    assert "hl.attention" in text
    # hl's causal diagonal is aligned to the end: used only where it is ONNX's (seq_q == seq_k)
    assert ("causal = true" in text) == bool(causal and q[2] == k[2])


@pytest.mark.parametrize("q_heads, kv_heads", [(2, 2), (4, 2)])
def test_attention_3d_splits_and_merges_heads(q_heads, kv_heads):
    q, k, v = (2, 3, q_heads * 4), (2, 5, kv_heads * 4), (2, 5, kv_heads * 6)
    model = attention_model(
        q,
        k,
        v,
        outputs=[("Y", F32, y_shape(q, v, q_heads, kv_heads))],
        q_num_heads=q_heads,
        kv_num_heads=kv_heads,
        scale=0.3,
    )
    check(model, {"Q": random(q), "K": random(k), "V": random(v)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 1, 4, 6), (2, 3, 4, 6), (4, 4)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_additive_mask_padded_to_the_keys(mask_shape, causal):
    q, k, v = (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)
    model = attention_model(
        q,
        k,
        v,
        [("mask", F32, mask_shape)],
        outputs=[("Y", F32, y_shape(q, v))],
        is_causal=causal,
    )
    feeds = {"Q": random(q), "K": random(k), "V": random(v), "mask": random(mask_shape)}
    check(model, feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_boolean_mask_against_numpy(causal):
    """The reference turns a True entry of a boolean mask into 0 * -inf = NaN when is_causal is
    set, so this compares with numpy in float64."""
    q, k, v = (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)
    mask = random((1, 1, 4, 4), np.bool_)
    mask[..., 0] = True  # every query keeps key 0, so no row is fully masked
    model = attention_model(
        q, k, v, [("mask", BOOL, mask.shape)], outputs=[("Y", F32, q)], is_causal=causal
    )
    feeds = {"Q": random(q), "K": random(k), "V": random(v), "mask": mask}
    (got,) = run_tgc(model, feeds)
    f64 = [feeds[n].astype(np.float64) for n in "QKV"]
    want = attention_numpy(*f64, mask=mask, causal=bool(causal))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("heads", [(3, 3), (6, 3)])
def test_attention_with_past_and_present(causal, heads):
    q_heads, kv_heads = heads
    q, k, v = (2, q_heads, 3, 4), (2, kv_heads, 3, 4), (2, kv_heads, 3, 5)
    pk, pv = (2, kv_heads, 5, 4), (2, kv_heads, 5, 5)
    model = attention_model(
        q,
        k,
        v,
        [("mask", F32, (3, 8)), ("past_key", F32, pk), ("past_value", F32, pv)],
        outputs=[
            ("Y", F32, y_shape(q, v)),
            ("present_key", F32, (2, kv_heads, 8, 4)),
            ("present_value", F32, (2, kv_heads, 8, 5)),
        ],
        is_causal=causal,
    )
    feeds = {"Q": random(q), "K": random(k), "V": random(v), "mask": random((3, 8))}
    feeds |= {"past_key": random(pk), "past_value": random(pv)}
    text = check(model, feeds, rtol=1e-4, atol=1e-5)
    assert ("causal = true" in text) == bool(causal)  # 3 new keys for 3 queries: diagonals agree


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_causal_with_past_and_more_new_keys_than_queries(causal):
    q, k, v, pk = (1, 2, 2, 4), (1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 4, 4)
    model = attention_model(
        q,
        k,
        v,
        ["", ("past_key", F32, pk), ("past_value", F32, pk)],
        outputs=[("Y", F32, q)],
        is_causal=causal,
    )
    feeds = {"Q": random(q), "K": random(k), "V": random(v)}
    feeds |= {"past_key": random(pk), "past_value": random(pk)}
    (got,) = run_tgc(model, feeds)
    f64 = {n: a.astype(np.float64) for n, a in feeds.items()}
    keys = np.concatenate([f64["past_key"], f64["K"]], axis=2)
    values = np.concatenate([f64["past_value"], f64["V"]], axis=2)
    want = attention_numpy(f64["Q"], keys, values, causal=bool(causal), past=4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_softcap_and_qk_matmul_output(mode):
    q, k, v = (2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8)
    model = attention_model(
        q,
        k,
        v,
        [("mask", F32, (3, 5))],
        outputs=[("Y", F32, y_shape(q, v)), "", "", ("qk", F32, (2, 4, 3, 5))],
        softcap=2.5,
        qk_matmul_output_mode=mode,
        is_causal=1,
    )
    feeds = {"Q": random(q), "K": random(k), "V": random(v), "mask": random((3, 5))}
    if mode != 0:
        check(model, feeds, rtol=1e-4, atol=1e-5)
        return
    # mode 0 is the scores before the softcap (ONNX); the reference softcaps them too
    want_y = ReferenceEvaluator(model).run(None, feeds)[0]
    y, qk = run_tgc(model, feeds)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-5)
    keys = np.repeat(feeds["K"].astype(np.float64), 2, axis=1)
    scores = feeds["Q"].astype(np.float64) @ np.swapaxes(keys, -1, -2) / math.sqrt(8)
    np.testing.assert_allclose(qk, scores, rtol=1e-4, atol=1e-5)


def test_attention_nonpad_kv_seqlen_masks_padding_keys():
    """Against numpy (the reference fails to broadcast its padding mask): batch 1 attends its
    first 2 keys alone."""
    q, k, v = (2, 2, 3, 4), (2, 2, 6, 4), (2, 2, 6, 4)
    model = attention_model(
        q,
        k,
        v,
        ["", "", "", ("lengths", I64, (2,))],
        outputs=[("Y", F32, q)],
        opset=24,
    )
    feeds = {"Q": random(q), "K": random(k), "V": random(v), "lengths": np.array([6, 2])}
    (got,) = run_tgc(model, feeds)
    f64 = [feeds[n].astype(np.float64) for n in "QKV"]
    want = [attention_numpy(*(t[i : i + 1] for t in f64))[0] for i in range(2)]
    want[1] = attention_numpy(*(t[1:2, :, : 2 if t is not f64[0] else None] for t in f64))[0]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-4, atol=1e-5)


def test_attention_f16_and_softmax_precision():
    q = (1, 2, 3, 8)
    model = attention_model(q, q, q, outputs=[("Y", F16, q)], softmax_precision=F32)
    for graph_value in list(model.graph.input) + list(model.graph.output):
        graph_value.type.tensor_type.elem_type = F16
    feeds = {n: random(q, np.float16) for n in "QKV"}
    text = check(model, feeds, rtol=2e-3, atol=2e-3)
    assert "hl.softmax" in text and "tensor<1x2x3x3xf32>" in text


def test_attention_errors():
    q4 = (1, 2, 3, 4)
    no_heads = attention_model((1, 3, 8), (1, 3, 8), (1, 3, 8), outputs=[("Y", F32, (1, 3, 8))])
    assert error_of(no_heads).endswith(
        "node 'n' (Attention): 3D Q, K and V need the q_num_heads and kv_num_heads attributes"
    )
    uneven = attention_model(
        (1, 3, 8),
        (1, 3, 8),
        (1, 3, 8),
        outputs=[("Y", F32, (1, 3, 8))],
        q_num_heads=3,
        kv_num_heads=3,
    )
    assert error_of(uneven).endswith(
        "node 'n' (Attention): Q hidden size 8 is not a multiple of 3 heads"
    )
    past_alone = attention_model(q4, q4, q4, ["", ("pk", F32, q4)], outputs=[("Y", F32, q4)])
    assert error_of(past_alone).endswith(
        "node 'n' (Attention): past_key and past_value must be given together"
    )
    groups = attention_model((1, 3, 3, 4), q4, q4, outputs=[("Y", F32, (1, 3, 3, 4))])
    assert error_of(groups).endswith(
        "node 'n' (Attention): 3 query heads are not a multiple of 2 key/value heads"
    )
    int_mask = attention_model(q4, q4, q4, [("m", I32, (3, 3))], outputs=[("Y", F32, q4)])
    assert error_of(int_mask).endswith(
        "node 'n' (Attention): attn_mask tensor<3x3xi32> must be bool or of Q's element type"
    )
    wide_mask = attention_model(q4, q4, q4, [("m", F32, (3, 5))], outputs=[("Y", F32, q4)])
    assert error_of(wide_mask).endswith(
        "node 'n' (Attention): attn_mask covers 5 keys, more than the 3 there are"
    )
    bad_mask = attention_model(q4, q4, q4, [("m", F32, (2, 3))], outputs=[("Y", F32, q4)])
    assert error_of(bad_mask).endswith(
        "node 'n' (Attention): attn_mask tensor<2x3xf32> does not broadcast to the scores "
        "[1, 2, 3, 3]"
    )


# -- the imported ops survive the optimisation pipeline -------------------------------------------


def _argmax_with_nan():
    model = one_node(
        "ArgMin", [("x", F32, (3, 6))], [("y", I64, (3,))], axis=1, keepdims=0, select_last_index=1
    )
    x = random((3, 6))
    x[1, 2] = x[1, 4] = np.nan
    return model, {"x": x}


def _gqa_causal_with_mask():
    q, k = (1, 4, 3, 8), (1, 2, 5, 8)
    model = attention_model(
        q, k, k, [("mask", F32, (3, 5))], outputs=[("Y", F32, q)], is_causal=1, softcap=3.0
    )
    return model, {"Q": random(q), "K": random(k), "V": random(k), "mask": random((3, 5))}


def _layernorm_three_outputs():
    return norm_model("LayerNormalization", (2, 3, 4), 1, (3, 4), outputs=3), norm_feeds(
        (2, 3, 4), (3, 4)
    )


def _prod_and_log_sum_exp():
    x = ("x", F32, (3, 5, 2))
    nodes = [
        helper.make_node("ReduceProd", ["x", "a"], ["p"], keepdims=0),
        helper.make_node("ReduceLogSumExp", ["x", "a"], ["l"], keepdims=1),
    ]
    model = make_model(
        nodes, [x], [("p", F32, (3, 2)), ("l", F32, (3, 1, 2))], [ints("a", [1])], opset=18
    )
    return model, {"x": random((3, 5, 2)) + 1}


@pytest.mark.parametrize(
    "make",
    [_argmax_with_nan, _gqa_causal_with_mask, _layernorm_three_outputs, _prod_and_log_sum_exp],
)
def test_imported_ops_keep_their_values_through_optimize(make):
    model, feeds = make()
    module = import_onnx(model)
    before = tgc.run(module, list(feeds.values()))
    after = tgc.run(tgc.run_pipeline(module, "optimize"), list(feeds.values()))
    compare(after, before, rtol=1e-5, atol=1e-5)


# -- NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss -------------------------------------------


def nll_numpy(log_prob, target, weight=None, reduction="mean", ignore_index=None):
    """ONNX's definition in float64: -w[t] * log_prob[n, t, d...]; ignored positions weigh 0;
    "mean" divides by the weights applied."""
    classes = log_prob.shape[1]
    kept = np.ones(target.shape, bool) if ignore_index is None else target != ignore_index
    safe = np.where(kept, target, 0)
    picked = np.take_along_axis(log_prob, np.expand_dims(safe, 1), axis=1)[:, 0]
    w = np.ones(classes) if weight is None else weight.astype(np.float64)
    applied = np.where(kept, w[safe], 0.0)
    loss = -picked * applied
    if reduction == "none":
        return loss
    with np.errstate(invalid="ignore"):  # every position ignored: 0/0, NaN as in tgc
        return loss.sum() if reduction == "sum" else loss.sum() / applied.sum()


def loss_model(op, shape, reduction, ignore_index=None, weight=False, log_prob=False):
    target_shape = shape[:1] + shape[2:]
    inputs = [("x", F32, shape), ("t", I64, target_shape)]
    if weight:
        inputs.append(("w", F32, (shape[1],)))
    out = target_shape if reduction == "none" else ()
    outputs = [("loss", F32, out)] + ([("log_prob", F32, shape)] if log_prob else [])
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    return one_node(op, inputs, outputs, opset=22 if op.startswith("Neg") else 13, **attrs)


def loss_feeds(shape, ignore_index=None, weight=False):
    target = RNG.integers(0, shape[1], size=shape[:1] + shape[2:])
    if ignore_index is not None:  # some positions ignored, whatever the index's range
        target = np.where(RNG.random(target.shape) < 0.3, ignore_index, target)
    feeds = {"x": random(shape), "t": target.astype(np.int64)}
    if weight:
        feeds["w"] = RNG.random(shape[1]).astype(np.float32) + 0.5
    return feeds


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore_index", [None, 1, -1, 9])
@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5)])
def test_losses_against_numpy(op, reduction, ignore_index, weight, shape):
    """Against ONNX's definition in numpy: the reference's NLL without weights and with
    ignore_index -1 averages over the ignored positions too."""
    log_prob = op == "SoftmaxCrossEntropyLoss"
    model = loss_model(op, shape, reduction, ignore_index, weight, log_prob)
    feeds = loss_feeds(shape, ignore_index, weight)
    got = run_tgc(model, feeds)
    x = feeds["x"].astype(np.float64)
    if log_prob:
        shifted = x - x.max(axis=1, keepdims=True)
        x = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        np.testing.assert_allclose(got[1], x, rtol=1e-5, atol=1e-6)
    want = nll_numpy(x, feeds["t"], feeds.get("w"), reduction, ignore_index)
    assert got[0].shape == np.shape(want) and got[0].dtype == np.float32
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_softmax_cross_entropy_against_the_reference(reduction):
    shape = (3, 5, 2)
    model = loss_model("SoftmaxCrossEntropyLoss", shape, reduction, 2, True, log_prob=True)
    check(model, loss_feeds(shape, 2, True), rtol=1e-5, atol=1e-6)


def test_loss_errors():
    model = loss_model("NegativeLogLikelihoodLoss", (4, 3), "max")
    assert error_of(model).endswith(
        "node 'n' (NegativeLogLikelihoodLoss): reduction 'max' is not one of 'none', 'sum', 'mean'"
    )
    model = one_node(
        "NegativeLogLikelihoodLoss",
        [("x", F32, (4, 3)), ("t", I64, (3,))],
        [("loss", F32, ())],
    )
    assert error_of(model).endswith(
        "node 'n' (NegativeLogLikelihoodLoss): target tensor<3xi64> does not fit the input "
        "tensor<4x3xf32> ([N, C, ...])"
    )


# -- RotaryEmbedding ------------------------------------------------------------------------------


def rotary_numpy(x, cos, sin, rotary, interleaved):
    """x [b, h, s, d] rotated with cos, sin [b, s, rotary/2] (float64)."""
    half = rotary // 2
    part, rest = x[..., :rotary], x[..., rotary:]
    x1, x2 = (
        (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half], part[..., half:])
    )
    cos, sin = cos[:, None], sin[:, None]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = np.stack([real, imag], axis=-1).reshape(part.shape)
    else:
        rotated = np.concatenate([real, imag], axis=-1)
    return np.concatenate([rotated, rest], axis=-1)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary", [0, 4])
@pytest.mark.parametrize("positions", [True, False])
def test_rotary_embedding_4d(interleaved, rotary, positions):
    shape, half = (2, 3, 5, 8), (rotary or 8) // 2
    cache_shape = (20, half) if positions else (2, 5, half)
    inputs = [("x", F32, shape), ("cos", F32, cache_shape), ("sin", F32, cache_shape)]
    if positions:
        inputs.append(("pos", I64, (2, 5)))
    model = one_node(
        "RotaryEmbedding",
        inputs,
        [("y", F32, shape)],
        opset=23,
        interleaved=interleaved,
        rotary_embedding_dim=rotary,
    )
    feeds = {"x": random(shape), "cos": random(cache_shape), "sin": random(cache_shape)}
    if positions:
        feeds["pos"] = RNG.integers(0, 20, size=(2, 5)).astype(np.int64)
    check(model, feeds)
    (got,) = run_tgc(model, feeds)
    cos, sin = feeds["cos"].astype(np.float64), feeds["sin"].astype(np.float64)
    if positions:
        cos, sin = cos[feeds["pos"]], sin[feeds["pos"]]
    want = rotary_numpy(feeds["x"].astype(np.float64), cos, sin, rotary or 8, interleaved)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rotary_embedding_3d_splits_heads():
    shape = (2, 5, 3 * 8)
    model = one_node(
        "RotaryEmbedding",
        [("x", F32, shape), ("cos", F32, (9, 4)), ("sin", F32, (9, 4)), ("pos", I64, (2, 5))],
        [("y", F32, shape)],
        opset=23,
        num_heads=3,
    )
    feeds = {"x": random(shape), "cos": random((9, 4)), "sin": random((9, 4))}
    feeds["pos"] = RNG.integers(0, 9, size=(2, 5)).astype(np.int64)
    check(model, feeds)


def test_rotary_embedding_errors():
    model = one_node(
        "RotaryEmbedding",
        [("x", F32, (2, 5, 24)), ("cos", F32, (2, 5, 4)), ("sin", F32, (2, 5, 4))],
        [("y", F32, (2, 5, 24))],
        opset=23,
    )
    assert error_of(model).endswith(
        "node 'n' (RotaryEmbedding): a 3D input needs the num_heads attribute"
    )
    model = one_node(
        "RotaryEmbedding",
        [("x", F32, (2, 3, 5, 8)), ("cos", F32, (2, 5, 3)), ("sin", F32, (2, 5, 3))],
        [("y", F32, (2, 3, 5, 8))],
        opset=23,
    )
    assert error_of(model).endswith(
        "node 'n' (RotaryEmbedding): cos_cache must be [2, 5, 4], got tensor<2x5x3xf32>"
    )

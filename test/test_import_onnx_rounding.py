"""Floor, Ceil, Round, Mod, Dropout, Sinh, Cosh, Swish, CumSum and CumProd through the importer
(importers/onnx/ops_rounding.py): tiny one-node models on fresh random inputs, run on tgc's
numpy interpreter and compared with onnx's ReferenceEvaluator, or with numpy in float64 where
the reference computes in the input's precision; and every diagnostic of these converters.

Tolerances: rounding, remainders, Dropout and integer scans exactly (the same IEEE operations);
Sinh/Cosh against float64 numpy: f32 rtol 1e-6, f64 rtol 1e-14, f16 rtol 2e-3 (a few roundings;
the series near 0 does not cancel); Swish against the reference f32 rtol 1e-6, atol 1e-7; float
CumSum/CumProd against float64 numpy rtol 1e-5 (f32) / 1e-12 (f64), atol 1e-5 (f32) / 1e-12
(f64): the scan adds in another order than a running sum.
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
I8, I32, I64, BOOL = TensorProto.INT8, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
NP_OF = {F32: np.float32, F16: np.float16, F64: np.float64, I8: np.int8, I32: np.int32}
NP_OF.update({I64: np.int64, BOOL: np.bool_})


def one_node(op, inputs, outputs, initializers=(), opset=24, **attrs):
    """A model of one node named 'n' reading the graph inputs and initializers, in order."""
    names = [i[0] for i in inputs] + [t.name for t in initializers]
    node = helper.make_node(op, names, [o[0] for o in outputs], name="n", **attrs)
    return onnx_testing.make_model([node], inputs, outputs, initializers, opset=opset)


def run_tgc(model, feeds):
    return tgc.run(import_onnx(model), list(feeds.values()))


def reference(model, feeds):
    with np.errstate(all="ignore"):
        return ReferenceEvaluator(model).run(None, feeds)


def error_of(model) -> str:
    with pytest.raises(TgcError) as info:
        import_onnx(model)
    return info.value.render()


def scalar(name, value, elem=TensorProto.INT64, dims=()):
    return helper.make_tensor(name, elem, list(dims), [value] if not dims else list(value))


# -- Floor, Ceil, Round ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round"])
@pytest.mark.parametrize("elem", [F32, F16, F64])
def test_rounding_matches_the_reference_exactly(op, elem):
    dtype = NP_OF[elem]
    x = (RNG.standard_normal((4, 7)) * 6).astype(dtype)
    x[0, :5] = np.array([2.5, -2.5, 0.5, -0.5, 3.5], dtype)  # ties: Round goes to even
    model = one_node(op, [("x", elem, (4, 7))], [("y", elem, (4, 7))])
    (got,) = run_tgc(model, {"x": x})
    (want,) = reference(model, {"x": x})
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    assert f"atomic.{op.lower()} %x" in tgc.print_ir(import_onnx(model))


def test_round_halves_to_even_and_keeps_special_values():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, np.nan, np.inf, -np.inf, -0.0], np.float32)
    model = one_node("Round", [("x", F32, (9,))], [("y", F32, (9,))])
    (got,) = run_tgc(model, {"x": x})
    np.testing.assert_array_equal(got, [0, 2, 2, -0.0, -2, np.nan, np.inf, -np.inf, -0.0])
    assert np.signbit(got[3]) and np.signbit(got[8])


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sinh", "Cosh", "Swish"])
def test_float_only_ops_refuse_integers(op):
    model = one_node(op, [("x", I32, (3,))], [("y", I32, (3,))])
    assert error_of(model) == (
        f"<onnx model>: error: node 'n' ({op}): {op} of a i32 tensor is not supported "
        "(ONNX defines it on floats)"
    )


# -- Mod ------------------------------------------------------------------------------------------


def c_fmod(p: int, q: int) -> int:
    """C's %: truncated division, the sign of the dividend; 0 for q == 0 (tgc's rule)."""
    if q == 0:
        return 0
    magnitude = abs(p) % abs(q)
    return magnitude if p >= 0 else -magnitude


@pytest.mark.parametrize("elem", [I8, I32, I64])
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5))])
def test_integer_mod_against_python(elem, fmod, shapes):
    dtype = NP_OF[elem]
    a = RNG.integers(-60, 60, shapes[0]).astype(dtype)
    b = RNG.integers(-7, 8, shapes[1]).astype(dtype)
    b.flat[0] = 0  # a remainder by zero is 0 (tgc's rule; numpy's and the reference's value)
    out = np.broadcast_shapes(a.shape, b.shape)
    attrs = {"fmod": 1} if fmod else {}  # absent: the default, 0
    model = one_node(
        "Mod", [("a", elem, shapes[0]), ("b", elem, shapes[1])], [("c", elem, out)], **attrs
    )
    (got,) = run_tgc(model, {"a": a, "b": b})
    ab, bb = np.broadcast_arrays(a, b)
    rule = c_fmod if fmod else (lambda p, q: p % q if q else 0)
    want = np.array([rule(int(p), int(q)) for p, q in zip(ab.flat, bb.flat)], dtype).reshape(out)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    (ref,) = reference(model, {"a": a, "b": b})
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("elem", [F32, F16, F64])
def test_float_fmod_matches_the_reference(elem):
    dtype = NP_OF[elem]
    a = (RNG.standard_normal((5, 6)) * 20).astype(dtype)
    b = (RNG.uniform(0.5, 4, (6,)) * RNG.choice([-1, 1], 6)).astype(dtype)
    model = one_node("Mod", [("a", elem, (5, 6)), ("b", elem, (6,))], [("c", elem, (5, 6))], fmod=1)
    (got,) = run_tgc(model, {"a": a, "b": b})
    (want,) = reference(model, {"a": a, "b": b})
    np.testing.assert_array_equal(got, want)  # fmod is exact
    ab, bb = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))
    exact = np.vectorize(math.fmod)(ab, bb)
    np.testing.assert_array_equal(got.astype(np.float64), exact)


def test_float_fmod_by_zero_is_nan():
    a = np.array([1.5, -2.0, 0.0], np.float32)
    b = np.array([0.0, 0.0, 2.0], np.float32)
    model = one_node("Mod", [("a", F32, (3,)), ("b", F32, (3,))], [("c", F32, (3,))], fmod=1)
    with np.errstate(invalid="ignore"):
        (got,) = run_tgc(model, {"a": a, "b": b})
    np.testing.assert_array_equal(got, [np.nan, np.nan, 0.0])


def test_mod_diagnostics():
    floats = one_node("Mod", [("a", F32, (3,)), ("b", F32, (3,))], [("c", F32, (3,))])
    assert error_of(floats) == (
        "<onnx model>: error: node 'n' (Mod): fmod = 0 on f32 inputs is not supported "
        "(ONNX requires fmod = 1 for floating-point types)"
    )
    bad = one_node("Mod", [("a", I32, (3,)), ("b", I32, (3,))], [("c", I32, (3,))], fmod=2)
    assert error_of(bad).endswith("node 'n' (Mod): fmod = 2 is not supported (only 0 and 1)")
    mixed = one_node("Mod", [("a", I32, (3,)), ("b", I64, (3,))], [("c", I32, (3,))])
    assert error_of(mixed).endswith(
        "node 'n' (Mod): operands must have the same element type, got tensor<3xi32>, tensor<3xi64>"
    )


# -- Dropout --------------------------------------------------------------------------------------


def dropout_model(inputs, initializers=(), mask=False, **attrs):
    outputs = [("y", F32, (3, 4))] + ([("z", BOOL, (3, 4))] if mask else [])
    inputs = [("x", F32, (3, 4))] + list(inputs)
    return one_node("Dropout", inputs, outputs, initializers, opset=22, **attrs)


@pytest.mark.parametrize(
    "inputs, initializers",
    [
        ([], []),  # no ratio, no training_mode: inference
        ([("r", F32, ())], []),  # the ratio as an argument: at inference it does not matter
        ([], [scalar("r", 0.3, F32), scalar("t", False, BOOL)]),
        ([], [scalar("r", 0.0, F32), scalar("t", True, BOOL)]),  # training with ratio 0
    ],
    ids=["plain", "ratio-argument", "training-false", "training-ratio-0"],
)
@pytest.mark.parametrize("mask", [False, True])
def test_dropout_at_inference_is_the_identity(inputs, initializers, mask):
    model = dropout_model(inputs, initializers, mask=mask, seed=3)
    x = onnx_testing.random_array((3, 4))
    feeds = {"x": x, **({"r": np.array(0.25, np.float32)} if inputs else {})}
    got = run_tgc(model, feeds)
    want = reference(model, feeds)
    onnx_testing.assert_outputs_match(got, want, rtol=0, atol=0)
    np.testing.assert_array_equal(got[0], x)
    if mask:
        assert got[1].dtype == np.bool_ and got[1].all()
        assert "dense<true> : tensor<3x4xi1>" in tgc.print_ir(import_onnx(model))


def test_dropout_of_a_constant_folds():
    x = onnx_testing.random_array((3, 4))
    init = helper.make_tensor("x", F32, [3, 4], x.ravel().tolist())
    node = helper.make_node("Dropout", ["x"], ["y"], name="n")
    model = onnx_testing.make_model([node], [], [("y", F32, (3, 4))], [init], opset=22)
    (got,) = tgc.run(import_onnx(model), [])
    np.testing.assert_array_equal(got, x)


def test_dropout_diagnostics():
    runtime_mode = dropout_model([("r", F32, ()), ("t", BOOL, ())])
    assert error_of(runtime_mode) == (
        "<onnx model>: error: node 'n' (Dropout): training_mode ('t') must be a constant: a "
        "dropout decided when the model runs is not supported"
    )
    random = dropout_model([], [scalar("r", 0.5, F32), scalar("t", True, BOOL)])
    assert error_of(random).endswith(
        "node 'n' (Dropout): training_mode = true with ratio 0.5 is not supported (a random "
        "mask; tgc imports inference graphs: export with training_mode false or absent)"
    )
    node = helper.make_node("Dropout", ["x", "", "t"], ["y"], name="n")  # no ratio: 0.5
    default_ratio = onnx_testing.make_model(
        [node], [("x", F32, (3, 4))], [("y", F32, (3, 4))], [scalar("t", True, BOOL)], opset=22
    )
    assert "training_mode = true with ratio 0.5 is not supported" in error_of(default_ratio)
    runtime_ratio = dropout_model([("r", F32, ())], [scalar("t", True, BOOL)])
    assert error_of(runtime_ratio).endswith(
        "node 'n' (Dropout): ratio ('r') must be a constant when training_mode is true"
    )
    two_flags = dropout_model([], [scalar("r", 0.0, F32), scalar("t", [1, 0], BOOL, (2,))])
    assert error_of(two_flags).endswith(
        "node 'n' (Dropout): training_mode must hold one value, got shape [2]"
    )


# -- Sinh, Cosh -----------------------------------------------------------------------------------

# Where the formulas switch (|x| = 1), near 0 (no cancellation), where e^x overflows but the
# result does not (f32: 88.7 < |x| < 89.4), past the overflow, and the special values.
SPECIAL = [0.0, -0.0, 1e-30, -3e-8, 1e-4, 0.999999, 1.0, -1.000001, 88.8, -89.3, 90.0, -95.0]
SPECIAL += [np.inf, -np.inf, np.nan]
TOLERANCE = {F32: 1e-6, F64: 1e-14, F16: 2e-3}


@pytest.mark.parametrize("op", ["Sinh", "Cosh"])
@pytest.mark.parametrize("elem", [F32, F64, F16])
def test_hyperbolic_against_float64_numpy(op, elem):
    dtype = NP_OF[elem]
    x = (RNG.standard_normal(200) * RNG.choice([0.01, 1.0, 6.0], 200)).astype(dtype)
    if elem != F16:  # f16 overflows at 11.1: the special values beyond are f32/f64 ones
        x = np.concatenate([x, np.array(SPECIAL, dtype)])
    model = one_node(op, [("x", elem, x.shape)], [("y", elem, x.shape)])
    with np.errstate(over="ignore"):
        (got,) = run_tgc(model, {"x": x})
        want = getattr(np, op.lower())(x.astype(np.float64)).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[elem], atol=0)


def test_sinh_is_odd_and_exact_near_zero():
    x = np.array([1e-20, 1e-8, 0.3, 0.7, 2.0, 30.0])
    model = one_node("Sinh", [("x", F64, (12,))], [("y", F64, (12,))])
    (got,) = run_tgc(model, {"x": np.concatenate([x, -x])})
    np.testing.assert_array_equal(got[6:], -got[:6])
    assert got[0] == 1e-20 and got[1] == 1e-8  # sinh(x) = x within f64 there


# -- Swish ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.0, 0.5, -1.7])
def test_swish_matches_the_reference(alpha):
    x = onnx_testing.random_array((4, 9)) * 4
    model = one_node("Swish", [("x", F32, (4, 9))], [("y", F32, (4, 9))], alpha=alpha)
    (got,) = run_tgc(model, {"x": x})
    (want,) = reference(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    text = tgc.print_ir(import_onnx(model))
    assert ("hl.silu" in text) == (alpha == 1.0)


# -- CumSum, CumProd ------------------------------------------------------------------------------


def scan_model(op, shape, axis, elem=F32, axis_elem=TensorProto.INT64, **attrs):
    init = [scalar("axis", axis, axis_elem)]
    return one_node(op, [("x", elem, shape)], [("y", elem, shape)], init, opset=26, **attrs)


def numpy_scan(op, x, axis, exclusive, reverse, dtype):
    """The running sum/product in `dtype` (float64 for floats) by numpy, sequentially."""
    x = np.flip(x, axis) if reverse else x
    identity = 0 if op == "CumSum" else 1
    if exclusive:
        pad = np.full_like(np.take(x, [0], axis), identity)
        x = np.concatenate([pad, np.delete(x, -1, axis)], axis)
    y = (np.cumsum if op == "CumSum" else np.cumprod)(x.astype(dtype), axis=axis)
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("shape, axis", [((9,), 0), ((3, 7), 1), ((3, 7), -2), ((2, 5, 4), 1)])
def test_scans_of_floats_against_float64_numpy(op, exclusive, reverse, shape, axis):
    x = RNG.uniform(0.5, 1.5, shape) * RNG.choice([-1, 1], shape)
    for elem, rtol in ((F32, 1e-5), (F64, 1e-12)):
        dtype = NP_OF[elem]
        model = scan_model(op, shape, axis, elem, exclusive=exclusive, reverse=reverse)
        (got,) = run_tgc(model, {"x": x.astype(dtype)})
        want = numpy_scan(op, x.astype(dtype), axis, exclusive, reverse, np.float64)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("elem", [I32, I64])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_scans_of_integers_are_exact(op, elem, exclusive, reverse):
    dtype = NP_OF[elem]
    x = RNG.integers(-3, 4, (4, 13)).astype(dtype)  # 13: not a power of two
    model = scan_model(op, (4, 13), 1, elem, exclusive=exclusive, reverse=reverse)
    (got,) = run_tgc(model, {"x": x})
    np.testing.assert_array_equal(got, numpy_scan(op, x, 1, exclusive, reverse, dtype))
    (want,) = reference(model, {"x": x})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize("size", [0, 1, 2])
@pytest.mark.parametrize("exclusive", [0, 1])
def test_scans_of_short_axes(op, size, exclusive):
    x = onnx_testing.random_array((3, size))
    model = scan_model(op, (3, size), 1, axis_elem=TensorProto.INT32, exclusive=exclusive)
    (got,) = run_tgc(model, {"x": x})
    want = numpy_scan(op, x, 1, exclusive, 0, np.float32) if size else x
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_scan_uses_log_steps():
    """ceil(log2 n) combines for an axis of n: 4 adds for n = 13, each with a shifted copy
    (a concat), and one more shift for `exclusive`."""
    text = tgc.print_ir(import_onnx(scan_model("CumSum", (4, 13), 1, exclusive=1)))
    assert text.count("atomic.add") == 4 and text.count("atomic.concat") == 5


def test_scan_diagnostics():
    dynamic = one_node(
        "CumSum", [("x", F32, (3,)), ("a", TensorProto.INT64, ())], [("y", F32, (3,))], opset=14
    )
    assert error_of(dynamic) == (
        "<onnx model>: error: node 'n' (CumSum): 'axis' ('a') must be a constant (an "
        "initializer or computed from constants): tgc tensors have static shapes"
    )
    two = one_node(
        "CumSum",
        [("x", F32, (3, 2))],
        [("y", F32, (3, 2))],
        [scalar("axis", [0, 1], dims=(2,))],
        opset=14,
    )
    assert error_of(two).endswith("node 'n' (CumSum): 'axis' must hold one integer, got shape [2]")
    out_of_range = scan_model("CumProd", (3, 2), 2)
    assert error_of(out_of_range).endswith("node 'n' (CumProd): axis 2 is out of range for rank 2")
    scalar_input = scan_model("CumSum", (), 0)
    assert error_of(scalar_input).endswith("node 'n' (CumSum): axis 0 is out of range for rank 0")
    booleans = scan_model("CumSum", (3,), 0, BOOL)
    assert error_of(booleans).endswith(
        "node 'n' (CumSum): CumSum of a bool tensor is not supported"
    )

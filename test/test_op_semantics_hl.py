"""The numpy meaning (`reference`) of every hl op, checked against independent formulas.

Same method as test_op_semantics.py (atomic): the op is built and verified through the op
definition API, fed seeded random float64 inputs (never zeros), and compared with a formula
written another way: per-row and per-head loops with math.fsum, identities (0.5 (1 + tanh z) =
sigmoid(2z)), E[x**2] - E[x]**2 for the variance. Lower precisions are checked for dtype and
against float64, and extreme magnitudes must give no NaN or inf.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tgc.dialects  # noqa: F401  (registers the ops)
from tgc.ir import Value
from tgc.opdef import OPS, create, dialect_ops, verify_op
from tgc.types import ELEMENT_TYPE_OF_DTYPE, TensorType

COVERED: set[str] = set()


def covers(*names: str):
    """Mark a test as checking the semantics of the ops `names`."""

    def mark(test):
        COVERED.update(names)
        return test

    return mark


def run(name: str, inputs, attributes=None, result_shape=None):
    """Create and verify op `name` on operands typed like `inputs` (the result of `result_shape`
    for ops that take their result type); return its reference output after checking it has the
    declared shape and dtype."""
    inputs = [np.asarray(a) for a in inputs]
    operands = [Value(TensorType.get(a.shape, ELEMENT_TYPE_OF_DTYPE[a.dtype])) for a in inputs]
    results = None if result_shape is None else [operands[0].type.with_shape(result_shape)]
    op = create(OPS[name], operands, attributes, results)
    verify_op(op)
    out = np.asarray(op.reference(*inputs))
    assert out.shape == op.result.type.shape, (name, out.shape, op.result.type)
    assert out.dtype == op.result.type.dtype, (name, out.dtype, op.result.type)
    return out


def nonzero(rng: np.random.Generator, shape, low=0.2, high=3.0) -> np.ndarray:
    """Random float64 values with |v| in [low, high) and random signs."""
    magnitude = rng.uniform(low, high, shape)
    return np.where(rng.random(shape) < 0.5, -magnitude, magnitude)


def per_element(fn, x: np.ndarray) -> np.ndarray:
    return np.vectorize(fn, otypes=[np.float64])(x)


def rows(x: np.ndarray, axis: int):
    """Yield (index, 1-D row) for every row of x along `axis` (index has `slice(None)` there)."""
    axis %= x.ndim
    others = [n for d, n in enumerate(x.shape) if d != axis]
    for outer in np.ndindex(*others):
        index = outer[:axis] + (slice(None),) + outer[axis:]
        yield index, [float(v) for v in x[index]]


# -- elementwise ----------------------------------------------------------------------------------


def sigmoid_math(v: float) -> float:
    return 1 / (1 + math.exp(-v))


def gelu_exact(v: float) -> float:
    return v * 0.5 * math.erfc(-v / math.sqrt(2))  # x * Phi(x), through erfc instead of erf


def gelu_tanh(v: float) -> float:
    return v * sigmoid_math(2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))


# name -> (attributes, per-element formula); inputs lie in [-6, 6]
UNARY = {
    "hl.tanh": ({}, lambda v: math.expm1(2 * v) / (math.expm1(2 * v) + 2)),
    "hl.sigmoid": ({}, sigmoid_math),
    "hl.relu": ({}, lambda v: (v + abs(v)) / 2),
    "hl.silu": ({}, lambda v: v / (1 + math.exp(-v))),
    "hl.gelu": ({}, gelu_exact),
    "hl.gelu/tanh": ({"approximate": "tanh"}, gelu_tanh),
}


@covers(*{key.split("/")[0] for key in UNARY})
@pytest.mark.parametrize("key", sorted(UNARY))
@pytest.mark.parametrize("shape", [(4, 7), (1, 3, 1), ()])
def test_unary(key, shape):
    attributes, formula = UNARY[key]
    rng = np.random.default_rng(len(key) * 10 + len(shape))
    x = nonzero(rng, shape, 0.01, 6)
    got = run(key.split("/")[0], [x], attributes)
    # rtol 1e-12, atol 1e-15: libm functions against other libm functions, a few ulp apart
    np.testing.assert_allclose(got, per_element(formula, x), rtol=1e-12, atol=1e-15)


def test_gelu_default_is_exact_and_tanh_form_is_close():
    x = nonzero(np.random.default_rng(11), (50,), 0.01, 5)
    assert np.array_equal(run("hl.gelu", [x]), run("hl.gelu", [x], {"approximate": "none"}))
    # the tanh form is a known approximation of the erf form: |difference| < 1e-3 everywhere
    diff = run("hl.gelu", [x], {"approximate": "tanh"}) - run("hl.gelu", [x])
    assert np.max(np.abs(diff)) < 1e-3


@covers("hl.relu")
def test_relu_on_integers():
    x = np.random.default_rng(12).integers(-50, 50, (3, 8)).astype(np.int32)
    x[x == 0] = 3
    assert run("hl.relu", [x]).tolist() == [[max(v, 0) for v in row] for row in x.tolist()]


# -- softmax, log_softmax, mean --------------------------------------------------------------------


def loop_softmax(x: np.ndarray, axis: int, log: bool = False) -> np.ndarray:
    out = np.empty_like(x)
    for index, row in rows(x, axis):
        top = max(row)
        total = math.fsum(math.exp(v - top) for v in row)
        if log:
            out[index] = [v - top - math.log(total) for v in row]
        else:
            out[index] = [math.exp(v - top) / total for v in row]
    return out


@covers("hl.softmax", "hl.log_softmax")
@pytest.mark.parametrize("name", ["hl.softmax", "hl.log_softmax"])
@pytest.mark.parametrize(
    "shape, axis", [((4, 7), -1), ((4, 7), 0), ((2, 3, 5), -2), ((2, 3, 5), 2), ((3, 1), 1)]
)
def test_softmax(name, shape, axis):
    rng = np.random.default_rng(len(shape) * 10 + axis + len(name))
    x = nonzero(rng, shape, 0.1, 5)
    got = run(name, [x], {"axis": axis})
    want = loop_softmax(x, axis, log=name == "hl.log_softmax")
    # rtol 1e-12, atol 1e-15: numpy's exp/sum against math.exp/fsum; row sums of <= 7 terms
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_softmax_default_axis_is_last_and_rows_sum_to_one():
    x = nonzero(np.random.default_rng(13), (3, 4, 5))
    got = run("hl.softmax", [x])
    np.testing.assert_allclose(got, run("hl.softmax", [x], {"axis": 2}), rtol=0, atol=0)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-15, atol=1e-15)


def loop_mean(x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    axes = {a % x.ndim for a in axes}
    groups: dict[tuple, list[float]] = {}
    for index in np.ndindex(*x.shape):
        key = tuple(0 if d in axes else i for d, i in enumerate(index))
        groups.setdefault(key, []).append(float(x[index]))
    out = np.empty([1 if d in axes else n for d, n in enumerate(x.shape)])
    for key, values in groups.items():
        out[key] = math.fsum(values) / len(values)
    return out if keepdims else out.reshape([n for d, n in enumerate(x.shape) if d not in axes])


@covers("hl.mean")
@pytest.mark.parametrize(
    "shape, axes", [((4, 6), [1]), ((4, 6), [-2]), ((2, 3, 4), [0, -1]), ((2, 1, 3), [1, 2])]
)
@pytest.mark.parametrize("keepdims", [False, True])
def test_mean(shape, axes, keepdims):
    rng = np.random.default_rng(len(shape) + 5 * len(axes) + keepdims)
    x = nonzero(rng, shape)
    got = run("hl.mean", [x], {"axes": tuple(axes), "keepdims": keepdims})
    # rtol 1e-14: pairwise summation against fsum over at most 24 terms
    np.testing.assert_allclose(got, loop_mean(x, axes, keepdims), rtol=1e-14, atol=1e-15)


# -- layernorm, rmsnorm ----------------------------------------------------------------------------


def loop_norm(x, gamma, beta, axis: int, eps: float, rms: bool) -> np.ndarray:
    """Normalise each group of trailing dims (axis..end) of x by explicit sums."""
    axis %= x.ndim
    lead, tail = x.shape[:axis], x.shape[axis:]
    gamma = np.broadcast_to(gamma, tail)
    beta = np.broadcast_to(beta, tail) if beta is not None else np.zeros(tail)
    out = np.empty_like(x)
    for outer in np.ndindex(*lead):
        values = [float(v) for v in x[outer].reshape(-1)]
        n = len(values)
        square_mean = math.fsum(v * v for v in values) / n
        if rms:
            shift, scale = 0.0, 1 / math.sqrt(square_mean + eps)
        else:
            mu = math.fsum(values) / n
            var = square_mean - mu * mu  # E[x^2] - E[x]^2: fine in float64 for |x| ~ 1
            shift, scale = mu, 1 / math.sqrt(var + eps)
        for inner in np.ndindex(*tail):
            y = (float(x[outer + inner]) - shift) * scale
            out[outer + inner] = y * float(gamma[inner]) + float(beta[inner])
    return out


NORM_CASES = [  # x shape, axis, gamma shape, beta shape
    ((4, 8), -1, (8,), (8,)),
    ((2, 3, 5), -2, (3, 5), (5,)),  # normalise over the last two dims; beta broadcast
    ((2, 3, 5), 1, (1, 5), ()),  # size-1 gamma dim, scalar beta
    ((3, 6), 0, (3, 6), (1, 1)),
]


@covers("hl.layernorm")
@pytest.mark.parametrize("x_shape, axis, g_shape, b_shape", NORM_CASES)
@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_layernorm(x_shape, axis, g_shape, b_shape, eps):
    rng = np.random.default_rng(len(x_shape) + len(g_shape) * 3 + axis + int(eps * 10))
    x = nonzero(rng, x_shape) + 0.5
    gamma, beta = nonzero(rng, g_shape), nonzero(rng, b_shape)
    got = run("hl.layernorm", [x, gamma, beta], {"axis": axis, "eps": eps})
    # rtol 1e-11, atol 1e-12: two-pass variance against E[x^2] - E[x]^2 (cancellation ~1e-15)
    want = loop_norm(x, gamma, beta, axis, eps, rms=False)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_layernorm_default_eps_and_unit_variance():
    rng = np.random.default_rng(14)
    x = nonzero(rng, (5, 32)) * 10 + 3
    ones, zeros = np.ones(32), np.full(32, 0.0)
    got = run("hl.layernorm", [x, ones, zeros])
    np.testing.assert_allclose(got.mean(axis=-1), 0, atol=1e-14)
    # var / (var + 1e-5) of the default eps: the variance is ~1e2, so within 1e-6 of 1
    np.testing.assert_allclose(got.var(axis=-1), 1, rtol=1e-6)


@covers("hl.rmsnorm")
@pytest.mark.parametrize("x_shape, axis, g_shape, _", NORM_CASES)
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rmsnorm(x_shape, axis, g_shape, _, eps):
    rng = np.random.default_rng(len(x_shape) + len(g_shape) * 7 + axis + int(eps * 10))
    x, gamma = nonzero(rng, x_shape), nonzero(rng, g_shape)
    got = run("hl.rmsnorm", [x, gamma], {"axis": axis, "eps": eps})
    # rtol 1e-13: one mean of squares and one sqrt, against fsum
    want = loop_norm(x, gamma, None, axis, eps, rms=True)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


# -- linear, attention -----------------------------------------------------------------------------


@covers("hl.linear")
@pytest.mark.parametrize(
    "x_shape, w_shape, b_shape",
    [
        ((4, 6), (6, 3), (3,)),
        ((2, 5, 6), (6, 4), None),
        ((6,), (6, 2), (2,)),
        ((3, 6), (6, 5), (1, 5)),
    ],
)
def test_linear(x_shape, w_shape, b_shape):
    rng = np.random.default_rng(len(x_shape) * 3 + (b_shape is None))
    x, w = nonzero(rng, x_shape), nonzero(rng, w_shape)
    inputs = [x, w] if b_shape is None else [x, w, nonzero(rng, b_shape)]
    got = run("hl.linear", inputs)
    out_shape = x_shape[:-1] + (w_shape[1],)
    bias = np.broadcast_to(inputs[2] if b_shape else 0.0, out_shape)
    want = np.empty(out_shape)
    for index in np.ndindex(*out_shape):
        row, j = x[index[:-1]], index[-1]
        want[index] = math.fsum(float(row[i] * w[i, j]) for i in range(w_shape[0])) + bias[index]
    # rtol 1e-13, atol 1e-13: BLAS against fsum, 6-term dot products of values <= 3
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def loop_attention(q, k, v, mask, scale, causal):
    """Per batch index and per query: scores, softmax and the weighted sum of values."""
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    seq_q, seq_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    out = np.empty(batch + (seq_q, d_v))

    def at(a, b):
        return a[tuple(0 if n == 1 else i for i, n in zip(b[len(b) - a.ndim + 2 :], a.shape[:-2]))]

    for b in np.ndindex(*batch):
        qb, kb, vb = at(q, b), at(k, b), at(v, b)
        for i in range(seq_q):
            scores = {}
            for j in range(seq_k):
                if causal and j > i + seq_k - seq_q:
                    continue
                s = scale * math.fsum(float(qb[i, c] * kb[j, c]) for c in range(q.shape[-1]))
                if mask is not None:
                    mb = np.broadcast_to(mask, batch + (seq_q, seq_k))
                    s += float(mb[b + (i, j)])
                scores[j] = s
            top = max(scores.values())
            weights = {j: math.exp(s - top) for j, s in scores.items()}
            total = math.fsum(weights.values())
            for c in range(d_v):
                out[b + (i, c)] = math.fsum(w * float(vb[j, c]) for j, w in weights.items()) / total
    return out


ATTENTION_CASES = [  # q, k, v, mask shapes, attributes
    ((2, 5, 4), (2, 5, 4), (2, 5, 4), None, {}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), None, {}),  # seq_k != seq_q, d_v != d
    ((2, 3, 4, 8), (1, 3, 6, 8), (2, 1, 6, 8), (4, 6), {}),  # broadcast batch dims, 2-D mask
    ((2, 4, 4), (2, 4, 4), (2, 4, 4), (2, 1, 4), {"causal": True}),
    ((1, 3, 4), (1, 7, 4), (1, 7, 2), None, {"causal": True}),  # KV cache: aligned to the end
    ((3, 4), (5, 4), (5, 4), (3, 5), {"scale": 0.3}),
    ((2, 2, 3), (2, 2, 3), (2, 2, 3), (1, 1, 1), {"scale": 2, "causal": True}),
]


@covers("hl.attention")
@pytest.mark.parametrize("q_shape, k_shape, v_shape, mask_shape, attributes", ATTENTION_CASES)
def test_attention(q_shape, k_shape, v_shape, mask_shape, attributes):
    rng = np.random.default_rng(len(q_shape) * 13 + k_shape[-2] + len(attributes))
    q, k, v = nonzero(rng, q_shape), nonzero(rng, k_shape), nonzero(rng, v_shape)
    mask = None if mask_shape is None else nonzero(rng, mask_shape)
    inputs = [q, k, v] if mask is None else [q, k, v, mask]
    got = run("hl.attention", inputs, attributes)
    scale = attributes.get("scale", 1 / math.sqrt(q_shape[-1]))
    want = loop_attention(q, k, v, mask, scale, attributes.get("causal", False))
    # rtol 1e-12, atol 1e-13: matmul + softmax against per-query fsum loops
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_causal_first_query_sees_only_the_first_key():
    rng = np.random.default_rng(15)
    q, k, v = (nonzero(rng, (4, 3)) for _ in range(3))
    got = run("hl.attention", [q, k, v], {"causal": True})
    np.testing.assert_allclose(got[0], v[0], rtol=1e-15)


# -- precision: dtypes kept, extreme magnitudes finite ---------------------------------------------

LOW_PRECISION = {  # dtype -> relative tolerance against the float64 result, per unit of output
    np.float32: 1e-5,
    np.float16: 2e-2,
    ml_dtypes.bfloat16: 1e-1,
}

ALL_CASES = {  # name -> (input shapes, attributes)
    "hl.tanh": ([(3, 8)], {}),
    "hl.sigmoid": ([(3, 8)], {}),
    "hl.relu": ([(3, 8)], {}),
    "hl.silu": ([(3, 8)], {}),
    "hl.gelu": ([(3, 8)], {"approximate": "tanh"}),
    "hl.softmax": ([(3, 8)], {}),
    "hl.log_softmax": ([(3, 8)], {"axis": 0}),
    "hl.mean": ([(3, 8)], {"axes": (-1,)}),
    "hl.layernorm": ([(3, 8), (8,), (8,)], {}),
    "hl.rmsnorm": ([(3, 8), (8,)], {}),
    "hl.linear": ([(3, 8), (8, 4), (4,)], {}),
    "hl.attention": ([(2, 3, 8), (2, 5, 8), (2, 5, 4), (3, 5)], {"causal": True}),
    # the vision ops (their semantics are checked in test_hl_vision.py)
    "hl.conv1d": ([(1, 2, 6), (3, 2, 3)], {"pads": (1, 1)}),
    "hl.conv2d": ([(1, 2, 5, 5), (4, 1, 3, 3), (4,)], {"groups": 2, "strides": (2, 2)}),
    "hl.conv3d": ([(1, 2, 3, 3, 3), (2, 2, 2, 2, 2)], {}),
    "hl.conv_transpose1d": ([(1, 2, 4), (2, 3, 3)], {"strides": (2,)}),
    "hl.conv_transpose2d": ([(1, 2, 3, 3), (2, 2, 3, 3), (2,)], {"strides": (2, 2)}),
    "hl.conv_transpose3d": ([(1, 2, 2, 2, 2), (2, 1, 2, 2, 2)], {}),
    "hl.max_pool1d": ([(1, 2, 7)], {"kernel": (3,), "strides": (2,)}),
    "hl.max_pool2d": ([(1, 2, 5, 5)], {"kernel": (2, 2), "ceil_mode": True, "strides": (2, 2)}),
    "hl.max_pool3d": ([(1, 2, 3, 3, 3)], {"kernel": (2, 2, 2)}),
    "hl.avg_pool1d": ([(1, 2, 7)], {"kernel": (3,), "pads": (1, 1)}),
    "hl.avg_pool2d": ([(1, 2, 5, 5)], {"kernel": (3, 3), "pads": (1, 1, 1, 1)}),
    "hl.avg_pool3d": ([(1, 2, 3, 3, 3)], {"kernel": (2, 2, 2)}),
    "hl.group_norm": ([(2, 4, 3, 3), (4,), (4,)], {"groups": 2}),
    "hl.batch_norm": ([(2, 4, 3, 3), (4,), (4,), (4,), (4,)], {}),
    "hl.resize": ([(1, 2, 3, 4)], {"mode": "linear"}),
}
RESULT_SHAPES = {"hl.resize": (1, 2, 5, 7)}  # ops that take their result type
POSITIVE_OPERAND = {"hl.batch_norm": 4}  # a variance
VISION = ("hl.conv", "hl.max_pool", "hl.avg_pool", "hl.group_norm", "hl.batch_norm", "hl.resize")
COVERED.update(name for name in ALL_CASES if name.startswith(VISION))  # test_hl_vision.py


@pytest.mark.parametrize("name", sorted(ALL_CASES))
@pytest.mark.parametrize("dtype", list(LOW_PRECISION), ids=["f32", "f16", "bf16"])
def test_lower_precision_keeps_dtype_and_agrees(name, dtype):
    shapes, attributes = ALL_CASES[name]
    rng = np.random.default_rng(len(name))
    inputs = [nonzero(rng, s, 0.1, 2) for s in shapes]
    if name in POSITIVE_OPERAND:
        inputs[POSITIVE_OPERAND[name]] = np.abs(inputs[POSITIVE_OPERAND[name]])
    result = RESULT_SHAPES.get(name)
    exact = run(name, inputs, attributes, result)
    got = run(name, [a.astype(dtype) for a in inputs], attributes, result)  # checks the dtype
    bound = LOW_PRECISION[dtype] * np.maximum(1.0, np.abs(exact))
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)


@covers("hl.tanh", "hl.sigmoid", "hl.silu", "hl.gelu", "hl.softmax", "hl.log_softmax")
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, ml_dtypes.bfloat16])
def test_extreme_magnitudes_stay_finite(dtype):
    big = float(ml_dtypes.finfo(dtype).max) / 2
    x = np.array([[-big, -1e3, -30.0, 0.5, 30.0, big]], dtype)  # -big - big is -max: finite
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        tanh = run("hl.tanh", [x]).astype(np.float64)
        sigmoid = run("hl.sigmoid", [x]).astype(np.float64)
        silu = run("hl.silu", [x]).astype(np.float64)
        softmax = run("hl.softmax", [x]).astype(np.float64)
        log_softmax = run("hl.log_softmax", [x]).astype(np.float64)
    with np.errstate(over="ignore", invalid="raise"):  # x**3 may overflow to inf, tanh(inf) = 1
        gelu = run("hl.gelu", [x], {"approximate": "tanh"}).astype(np.float64)
    gelu_exact = run("hl.gelu", [x]).astype(np.float64)
    for out in (tanh, sigmoid, silu, softmax, log_softmax[:, 1:], gelu, gelu_exact):
        assert np.all(np.isfinite(out)), out
    assert tanh[0, 0] == -1 and tanh[0, -1] == 1
    assert sigmoid[0, 0] == 0 and sigmoid[0, -1] == 1
    assert silu[0, 0] == 0 and silu[0, -1] == float(x[0, -1])
    assert gelu[0, 0] == 0 and gelu[0, -1] == float(x[0, -1]) and gelu_exact[0, 0] == 0
    assert softmax[0, -1] == 1 and softmax.sum() == 1
    assert log_softmax[0, -1] == 0


# -- registry coverage ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(op.name for op in dialect_ops("hl")))
def test_hl_op_has_docstring_with_syntax(name):
    doc = OPS[name].__doc__ or ""
    assert doc.strip() and name in doc, f"{name}: the docstring needs a syntax example"


def test_every_hl_op_has_semantics_test():
    missing = {op.name for op in dialect_ops("hl")} - COVERED
    assert not missing, f"hl ops without a semantics test: {sorted(missing)}"


def test_every_hl_op_has_precision_case():
    assert set(ALL_CASES) == {op.name for op in dialect_ops("hl")}


def test_hl_decompose_exists():
    assert all(callable(getattr(op, "decompose", None)) for op in dialect_ops("hl"))

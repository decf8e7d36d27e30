"""The numpy meaning (`reference`) of every atomic op, checked against independent formulas.

Each test builds the op through the op definition API (so inference and verification run too),
feeds it fresh random float64 inputs (a seeded generator per test, never zeros) and compares with
a formula written another way: explicit index loops, Python's math module, series expansions.
`covers` records which ops a test checks; the last tests fail when an atomic op has no test.
The hl ops are checked the same way in test_op_semantics_hl.py.
"""

from __future__ import annotations

import cmath
import itertools
import math
import operator

import numpy as np
import pytest

import tgc.dialects  # noqa: F401  (registers the ops)
from tgc.attributes import DenseAttr
from tgc.diagnostics import TgcError
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


def run(name: str, inputs, attributes=None, result_types=None):
    """Create and verify op `name` on operands typed like `inputs`; return its reference output
    (a tuple for several results), after checking it has the declared shapes and dtypes."""
    inputs = [np.asarray(a) for a in inputs]
    operands = [Value(TensorType.get(a.shape, ELEMENT_TYPE_OF_DTYPE[a.dtype])) for a in inputs]
    op = create(OPS[name], operands, attributes, result_types)
    verify_op(op)
    out = op.reference(*inputs)
    outs = tuple(np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)))
    assert len(outs) == len(op.results)
    for got, result in zip(outs, op.results):
        assert got.shape == result.type.shape, (name, got.shape, result.type)
        assert got.dtype == result.type.dtype, (name, got.dtype, result.type)
    return outs if isinstance(out, tuple) else outs[0]


def bcast_index(index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The element of an operand of `shape` that numpy broadcasting maps to output `index`."""
    tail = index[len(index) - len(shape) :]
    return tuple(0 if d == 1 else i for i, d in zip(tail, shape))


def nonzero(rng: np.random.Generator, shape, low=0.5, high=2.0) -> np.ndarray:
    """Random float64 values with |v| in [low, high) and random signs."""
    magnitude = rng.uniform(low, high, shape)
    return np.where(rng.random(shape) < 0.5, -magnitude, magnitude)


def erf_series(v: float) -> float:
    """erf by its Maclaurin series (|v| <= 3): 2/sqrt(pi) * sum (-1)^n v^(2n+1) / (n! (2n+1))."""
    total, term, n = 0.0, v, 0
    while abs(term) > 1e-18 * max(1.0, abs(total)) or n < 5:
        total += term / (2 * n + 1)
        n += 1
        term *= -v * v / n
    return 2 / math.sqrt(math.pi) * total


# -- elementwise ----------------------------------------------------------------------------------

# name -> (per-element formula, input domain (low, high) of |x|, sign allowed to be negative)
UNARY = {
    "atomic.neg": (lambda v: 0.0 - v, (0.1, 10), True),
    "atomic.exp": (lambda v: math.e**v, (0.1, 5), True),
    "atomic.log": (lambda v: math.log2(v) / math.log2(math.e), (0.01, 100), False),
    "atomic.sqrt": (lambda v: v**0.5, (0.01, 100), False),
    "atomic.rsqrt": (lambda v: math.exp(-0.5 * math.log(v)), (0.01, 100), False),
    "atomic.recip": (lambda v: math.pow(v, -1), (0.01, 100), True),
    "atomic.abs": (lambda v: math.copysign(v, 1.0), (0.1, 10), True),
    "atomic.erf": (erf_series, (0.01, 3), True),
    "atomic.sin": (lambda v: cmath.exp(1j * v).imag, (0.1, 10), True),
    "atomic.cos": (lambda v: cmath.exp(1j * v).real, (0.1, 10), True),
    "atomic.floor": (lambda v: float(math.floor(v)), (0.1, 10), True),
    "atomic.ceil": (lambda v: float(math.ceil(v)), (0.1, 10), True),
    "atomic.round": (lambda v: float(round(v)), (0.1, 10), True),  # Python's round: halves to even
}


@covers(*UNARY)
@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("shape", [(3, 4), (1, 5, 1), ()])
def test_unary(name, shape):
    formula, (low, high), signed = UNARY[name]
    rng = np.random.default_rng(len(name) * 100 + len(shape))
    x = nonzero(rng, shape, low, high) if signed else rng.uniform(low, high, shape)
    want = np.vectorize(formula, otypes=[np.float64])(x)
    # rtol 1e-12: libm and the independent formula differ by a few ulp (the erf series by ~1e-14)
    np.testing.assert_allclose(run(name, [x]), want, rtol=1e-12, atol=1e-14)


@covers("atomic.erf")
def test_erf_limits_and_symmetry():
    x = np.array([-9.0, -6.0, 6.0, 9.0, 1e300])
    np.testing.assert_array_equal(run("atomic.erf", [x]), [-1.0, -1.0, 1.0, 1.0, 1.0])
    y = np.random.default_rng(1).uniform(0.1, 4, 10)
    np.testing.assert_array_equal(run("atomic.erf", [-y]), -run("atomic.erf", [y]))


@covers("atomic.neg", "atomic.abs")
def test_neg_abs_on_integers():
    x = np.random.default_rng(2).integers(-100, 100, (4, 5)).astype(np.int32)
    x[x == 0] = 7
    assert run("atomic.neg", [x]).tolist() == [[-v for v in row] for row in x.tolist()]
    assert run("atomic.abs", [x]).tolist() == [
        [v if v > 0 else -v for v in row] for row in x.tolist()
    ]


BINARY = {
    "atomic.mod": operator.mod,  # Python's float %: the sign of the divisor, as np.mod
    "atomic.add": operator.add,
    "atomic.sub": operator.sub,
    "atomic.mul": operator.mul,
    "atomic.div": operator.truediv,
    "atomic.pow": operator.pow,
    "atomic.max": lambda a, b: max(b, a),
    "atomic.min": lambda a, b: min(b, a),
}

BROADCAST_SHAPES = [
    ((3, 4), (3, 4)),
    ((3, 1, 4), (5, 1)),  # size-1 dims on both sides
    ((), (2, 3)),  # rank 0 against rank 2
    ((2, 1, 3), (1,)),
]


def loop_binary(fn, a: np.ndarray, b: np.ndarray, dtype=np.float64) -> np.ndarray:
    shape = np.broadcast_shapes(a.shape, b.shape)
    out = np.empty(shape, dtype)
    for index in np.ndindex(*shape):
        out[index] = fn(
            a[bcast_index(index, a.shape)].item(), b[bcast_index(index, b.shape)].item()
        )
    return out


@covers(*BINARY)
@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_binary(name, shapes):
    rng = np.random.default_rng(len(name) * 10 + len(shapes[0]))
    a, b = nonzero(rng, shapes[0]), nonzero(rng, shapes[1])
    if name == "atomic.pow":
        a = np.abs(a)  # real powers of negative bases are NaN
    got = run(name, [a, b])
    # rtol 1e-14: one correctly rounded IEEE operation each way (pow: libm, a few ulp)
    np.testing.assert_allclose(got, loop_binary(BINARY[name], a, b), rtol=1e-14, atol=0)


@covers("atomic.div")
def test_integer_division_rounds_toward_zero():
    rng = np.random.default_rng(3)
    a = rng.integers(-50, 50, (6, 7)).astype(np.int32)
    b = rng.integers(1, 9, (6, 7)).astype(np.int32) * rng.choice([-1, 1], (6, 7)).astype(np.int32)

    def c_div(p, q):
        magnitude = abs(p) // abs(q)
        return magnitude if (p < 0) == (q < 0) else -magnitude

    got = run("atomic.div", [a, b])
    assert got.tolist() == loop_binary(c_div, a, b, np.int32).tolist()


@covers("atomic.floor", "atomic.ceil", "atomic.round")
def test_rounding_halves_and_special_values():
    rng = np.random.default_rng(5)
    halves = rng.integers(-20, 20, 40) + 0.5  # exact ties: round goes to the even neighbour
    assert run("atomic.round", [halves]).tolist() == [float(round(v)) for v in halves]
    assert run("atomic.floor", [halves]).tolist() == [float(math.floor(v)) for v in halves]
    assert run("atomic.ceil", [halves]).tolist() == [float(math.ceil(v)) for v in halves]
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 2.0**60 + 2.0**8, -0.4])
    for name in ("atomic.floor", "atomic.ceil", "atomic.round"):
        got = run(name, [special])
        np.testing.assert_array_equal(got[:6], special[:6])  # NaN, infinities, integers stay
        assert np.signbit(got[3]) and not np.signbit(got[4])  # -0 stays -0
    # -0.4 rounds up to -0 (ceil, round) or down to -1 (floor); the sign of zero is kept
    assert run("atomic.floor", [special])[6] == -1.0
    assert np.signbit(run("atomic.ceil", [special])[6])
    assert np.signbit(run("atomic.round", [special])[6])


def c_fmod(p: int, q: int) -> int:
    """C's integer %: truncated division, the sign of the dividend."""
    magnitude = abs(p) % abs(q)
    return magnitude if p >= 0 else -magnitude


@covers("atomic.mod")
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_integer_mod_both_conventions(dtype, shapes):
    rng = np.random.default_rng(np.dtype(dtype).itemsize * 10 + len(shapes[1]))
    a = rng.integers(-100, 100, shapes[0]).astype(dtype)
    b = rng.integers(-9, 10, shapes[1]).astype(dtype)  # zeros included: x mod 0 is 0
    floored = run("atomic.mod", [a, b])
    truncated = run("atomic.mod", [a, b], {"fmod": True})
    want_floored = loop_binary(lambda p, q: p % q if q else 0, a, b, dtype)
    want_truncated = loop_binary(lambda p, q: c_fmod(p, q) if q else 0, a, b, dtype)
    assert floored.tolist() == want_floored.tolist()
    assert truncated.tolist() == want_truncated.tolist()


@covers("atomic.mod")
def test_integer_mod_extremes():
    lowest = np.iinfo(np.int32).min
    a = np.array([lowest, lowest, 7, -7, lowest], np.int32)
    b = np.array([-1, 0, lowest, lowest, 3], np.int32)
    # lowest % -1 is 0 (no overflow); 7 mod lowest keeps the divisor's sign
    assert run("atomic.mod", [a, b]).tolist() == [0, 0, lowest + 7, -7, (lowest % 3)]
    assert run("atomic.mod", [a, b], {"fmod": True}).tolist() == [0, 0, 7, -7, -2]


@covers("atomic.mod")
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_float_fmod(shapes):
    rng = np.random.default_rng(20 + len(shapes[0]))
    a, b = nonzero(rng, shapes[0], 0.1, 50), nonzero(rng, shapes[1], 0.5, 7)
    got = run("atomic.mod", [a, b], {"fmod": True})
    # math.fmod is exact (the remainder of two doubles is a double)
    np.testing.assert_array_equal(got, loop_binary(math.fmod, a, b))


@covers("atomic.mod")
def test_float_mod_special_values():
    a = np.array([5.0, -0.0, 3.0, -3.0, -3.0, np.inf, 6.0, -6.0, np.nan])
    b = np.array([0.0, 3.0, -3.0, np.inf, -np.inf, 2.0, 3.0, 3.0, 2.0])
    with np.errstate(invalid="ignore"):  # the NaNs are the meaning (IEEE), not a warning
        floored = run("atomic.mod", [a, b])
        truncated = run("atomic.mod", [a, b], {"fmod": True})
    # Python's float % and math.fmod as the independent formulas, NaN where they raise
    want_floored = [math.nan, 0.0, -0.0, math.inf, -3.0, math.nan, 0.0, 0.0, math.nan]
    want_truncated = [math.nan, -0.0, 0.0, -3.0, -3.0, math.nan, 0.0, -0.0, math.nan]
    np.testing.assert_array_equal(floored, want_floored)
    np.testing.assert_array_equal(truncated, want_truncated)
    # a zero remainder takes the divisor's sign (np.mod), the dividend's (fmod)
    assert list(np.signbit(floored[1:3])) == [False, True]
    assert list(np.signbit(truncated[1:3])) == [True, False]
    assert list(np.signbit(truncated[6:8])) == [False, True]


@covers("atomic.max", "atomic.min")
def test_max_min_propagate_nan():
    a = np.array([np.nan, 1.0, -2.0])
    b = np.array([3.0, np.nan, -1.0])
    np.testing.assert_array_equal(run("atomic.max", [a, b]), [np.nan, np.nan, -1.0])
    np.testing.assert_array_equal(run("atomic.min", [a, b]), [np.nan, np.nan, -2.0])


PREDICATES = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}


@covers("atomic.cmp")
@pytest.mark.parametrize("pred", sorted(PREDICATES))
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_cmp(pred, shapes):
    rng = np.random.default_rng(len(pred) + 7 * len(shapes[1]))
    # few distinct values, so that ties (eq, le, ge) really occur
    a = rng.integers(1, 4, shapes[0]).astype(np.float64)
    b = rng.integers(1, 4, shapes[1]).astype(np.float64)
    got = run("atomic.cmp", [a, b], {"pred": pred})
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, loop_binary(PREDICATES[pred], a, b, np.bool_))


@covers("atomic.where")
@pytest.mark.parametrize(
    "shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), ()), ((2, 1, 1), (3, 1), (2, 1, 5))]
)
def test_where(shapes):
    rng = np.random.default_rng(sum(map(len, shapes)))
    cond = rng.random(shapes[0]) < 0.5
    a, b = nonzero(rng, shapes[1]), nonzero(rng, shapes[2]) + 10
    out_shape = np.broadcast_shapes(*shapes)
    want = np.empty(out_shape)
    for index in np.ndindex(*out_shape):
        pick = a if cond[bcast_index(index, cond.shape)] else b
        want[index] = pick[bcast_index(index, pick.shape)]
    np.testing.assert_array_equal(run("atomic.where", [cond, a, b]), want)


@covers("atomic.cast")
def test_cast():
    rng = np.random.default_rng(4)
    x = nonzero(rng, (3, 5), 0.5, 100)
    f32 = TensorType.get((3, 5), "f32")
    i32 = TensorType.get((3, 5), "i32")
    bf16 = TensorType.get((3, 5), "bf16")
    i1 = TensorType.get((3, 5), "i1")
    got = run("atomic.cast", [x], result_types=[f32])
    # f64 -> f32 rounds to nearest: within half an f32 ulp (2**-24 relative)
    np.testing.assert_allclose(got.astype(np.float64), x, rtol=2**-24, atol=0)
    assert run("atomic.cast", [x], result_types=[i32]).tolist() == [
        [math.trunc(v) for v in row] for row in x.tolist()
    ]
    # bf16 keeps 8 significant bits: rounding is within 2**-8 relative
    got = run("atomic.cast", [x], result_types=[bf16])
    np.testing.assert_allclose(got.astype(np.float64), x, rtol=2**-8, atol=0)
    x[0, 0] = 0.0  # the one zero: cast to i1 is `x != 0`
    assert run("atomic.cast", [x], result_types=[i1]).tolist() == [
        [v != 0 for v in row] for row in x.tolist()
    ]
    ints = rng.integers(-1000, 1000, (3, 5)).astype(np.int32)
    f64 = TensorType.get((3, 5), "f64")
    assert run("atomic.cast", [ints], result_types=[f64]).tolist() == ints.tolist()


# -- reductions -----------------------------------------------------------------------------------

REDUCE = {"atomic.reduce_sum": math.fsum, "atomic.reduce_max": max, "atomic.reduce_min": min}


def loop_reduce(fn, x: np.ndarray, axes, keepdims: bool) -> np.ndarray:
    """Group the elements of x by their index outside `axes` and apply `fn` to each group."""
    axes = {a % x.ndim for a in axes}
    groups: dict[tuple, list[float]] = {}
    for index in np.ndindex(*x.shape):
        key = tuple(0 if d in axes else i for d, i in enumerate(index))
        groups.setdefault(key, []).append(x[index].item())
    kept = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    out = np.empty(kept)
    for key, values in groups.items():
        out[key] = fn(values)
    return out if keepdims else out.reshape([n for d, n in enumerate(x.shape) if d not in axes])


@covers(*REDUCE)
@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize(
    "shape, axes", [((3, 4), [1]), ((3, 4), [-1, 0]), ((2, 3, 4), [-2]), ((2, 1, 4), [0, 2])]
)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce(name, shape, axes, keepdims):
    rng = np.random.default_rng(len(shape) * 10 + len(axes) + keepdims)
    x = nonzero(rng, shape)
    got = run(name, [x], {"axes": tuple(axes), "keepdims": keepdims})
    # rtol 1e-14: np.sum's pairwise sum against math.fsum (exact, then rounded)
    np.testing.assert_allclose(got, loop_reduce(REDUCE[name], x, axes, keepdims), rtol=1e-14)


# -- linear algebra and data movement -------------------------------------------------------------


def loop_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Batched a @ b by explicit dot products, batch dims broadcast."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = np.empty(batch + (m, n))
    for bi in np.ndindex(*batch):
        ab, bb = a[bcast_index(bi, a.shape[:-2])], b[bcast_index(bi, b.shape[:-2])]
        for i, j in itertools.product(range(m), range(n)):
            out[bi + (i, j)] = math.fsum(ab[i, p] * bb[p, j] for p in range(k))
    return out


@covers("atomic.matmul")
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((1, 4), (4, 1)), ((2, 3, 4), (4, 2))],
)
def test_matmul(transpose_a, transpose_b, a_shape, b_shape):
    rng = np.random.default_rng(len(a_shape) * 4 + 2 * transpose_a + transpose_b)
    a, b = nonzero(rng, a_shape), nonzero(rng, b_shape)
    want = loop_matmul(a, b)
    if transpose_a:
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
    if transpose_b:
        b = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    attributes = {"transpose_a": transpose_a, "transpose_b": transpose_b}
    # rtol 1e-13 / atol 1e-13: BLAS dot products of <= 4 terms of size <= 4 against fsum
    np.testing.assert_allclose(
        run("atomic.matmul", [a, b], attributes), want, rtol=1e-13, atol=1e-13
    )


@covers("atomic.transpose")
@pytest.mark.parametrize("perm", [(1, 0), (2, 0, 1), (0, 2, 1), (0, 1, 2)])
def test_transpose(perm):
    rng = np.random.default_rng(sum(i * p for i, p in enumerate(perm)))
    x = nonzero(rng, (2, 3, 4)[: len(perm)])
    got = run("atomic.transpose", [x], {"perm": perm})
    for index in np.ndindex(*got.shape):
        source = [0] * len(perm)
        for j, p in enumerate(perm):
            source[p] = index[j]
        assert got[index] == x[tuple(source)]


@covers("atomic.reshape")
@pytest.mark.parametrize("src, dst", [((3, 4), (12,)), ((2, 6), (3, 1, 4)), ((12,), (1, 12, 1))])
def test_reshape(src, dst):
    x = nonzero(np.random.default_rng(len(src) + len(dst)), src)
    got = run("atomic.reshape", [x], result_types=[TensorType.get(dst, "f64")])
    assert list(got.flat) == [x[i] for i in itertools.product(*map(range, src))]


@covers("atomic.broadcast")
@pytest.mark.parametrize("src, dst", [((3, 1), (2, 3, 4)), ((), (2, 2)), ((4,), (3, 4))])
def test_broadcast(src, dst):
    x = nonzero(np.random.default_rng(len(src) * 3 + len(dst)), src)
    got = run("atomic.broadcast", [x], result_types=[TensorType.get(dst, "f64")])
    for index in np.ndindex(*dst):
        assert got[index] == x[bcast_index(index, src)]


@covers("atomic.concat")
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_concat(axis):
    rng = np.random.default_rng(axis + 10)
    sizes = [2, 1, 3]
    shapes = [tuple(s if d == axis % 3 else n for d, n in enumerate((4, 5, 6))) for s in sizes]
    xs = [nonzero(rng, s) for s in shapes]
    got = run("atomic.concat", xs, {"axis": axis})
    a = axis % 3
    for index in np.ndindex(*got.shape):
        offset, part = index[a], 0
        while offset >= sizes[part]:
            offset, part = offset - sizes[part], part + 1
        assert got[index] == xs[part][index[:a] + (offset,) + index[a + 1 :]]


@covers("atomic.split")
@pytest.mark.parametrize("axis, sizes", [(0, (1, 3)), (1, (2, 0, 3)), (-1, (6,)), (-2, (4, 1))])
def test_split(axis, sizes):
    rng = np.random.default_rng(len(sizes) + axis + 5)
    shape = [5, 5, 6]
    shape[axis] = sum(sizes)
    x = nonzero(rng, tuple(shape))
    pieces = run("atomic.split", [x], {"axis": axis, "sizes": sizes})
    assert isinstance(pieces, tuple) and len(pieces) == len(sizes)
    a, start = axis % 3, 0
    for piece, size in zip(pieces, sizes):
        assert piece.shape[a] == size
        for index in np.ndindex(*piece.shape):
            assert piece[index] == x[index[:a] + (start + index[a],) + index[a + 1 :]]
        start += size


@covers("atomic.slice")
@pytest.mark.parametrize(
    "start, stop, step",
    [
        ((0, 2), (4, 8), (1, 2)),
        ((1, 0), (3, 8), (3, 8)),
        ((2, 5), (2, 8), (1, 1)),
        ((0, 7), (4, 8), (2, 5)),
    ],
)
def test_slice(start, stop, step):
    x = nonzero(np.random.default_rng(sum(step)), (4, 8))
    got = run("atomic.slice", [x], {"start": start, "stop": stop, "step": step})
    want_shape = tuple(max(0, -(-(hi - lo) // st)) for lo, hi, st in zip(start, stop, step))
    assert got.shape == want_shape
    for index in np.ndindex(*got.shape):
        assert got[index] == x[tuple(lo + i * st for lo, i, st in zip(start, index, step))]


@covers("atomic.gather")
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather(axis, index_dtype):
    rng = np.random.default_rng(axis + 3)
    table = nonzero(rng, (5, 6, 7))
    a = axis % 3
    indices = rng.integers(0, table.shape[a], (2, 3)).astype(index_dtype)
    indices[0, 0] = indices[1, 2]  # a repeated index
    got = run("atomic.gather", [table, indices], {"axis": axis})
    assert got.shape == table.shape[:a] + (2, 3) + table.shape[a + 1 :]
    for index in np.ndindex(*got.shape):
        row = indices[index[a : a + 2]]
        assert got[index] == table[index[:a] + (row,) + index[a + 2 :]]


@covers("atomic.write_rows")
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_write_rows(axis, index_dtype):
    rng = np.random.default_rng(axis + 7)
    x = nonzero(rng, (5, 6, 7))
    a = axis % 3
    indices = rng.permutation(x.shape[a])[:3].astype(index_dtype)
    indices[2] = indices[0]  # a repeated index: the last row given for it is written
    values = nonzero(rng, x.shape[:a] + (3,) + x.shape[a + 1 :], 10, 20)
    got = run("atomic.write_rows", [x, indices, values], {"axis": axis})
    rows = {int(i): j for j, i in enumerate(indices)}  # the last j of each index
    for index in np.ndindex(*got.shape):
        j = rows.get(index[a])
        want = x[index] if j is None else values[index[:a] + (j,) + index[a + 1 :]]
        assert got[index] == want
    assert not np.shares_memory(got, x)  # the meaning is a new tensor; x is unchanged
    bad = indices.copy()
    bad[1] = x.shape[a]
    with pytest.raises(TgcError, match=rf"index {x.shape[a]} \(at \[1\] of the indices\)"):
        run("atomic.write_rows", [x, bad, values], {"axis": axis})


@covers("atomic.constant")
@pytest.mark.parametrize("element_type", ["f64", "f32", "i32", "i1", "bf16"])
def test_constant(element_type):
    rng = np.random.default_rng(len(element_type))
    t = TensorType.get((2, 3), element_type)
    values = nonzero(rng, (2, 3), 1, 50).astype(t.dtype)
    got = run("atomic.constant", [], {"value": DenseAttr(values, t)})
    assert got.tolist() == values.tolist()
    splat = run("atomic.constant", [], {"value": DenseAttr.splat(values[0, 0], t)})
    assert splat.shape == (2, 3) and splat.tolist() == [[values[0, 0].item()] * 3] * 2


@covers("atomic.iota")
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("element_type", ["i32", "i64", "f32"])
def test_iota(axis, element_type):
    t = TensorType.get((3, 4, 5), element_type)
    got = run("atomic.iota", [], {"axis": axis}, result_types=[t])
    for index in np.ndindex(*t.shape):
        assert got[index] == index[axis]


# -- lower precisions ------------------------------------------------------------------------------

LOW_PRECISION_CASES = [(name, 1) for name in sorted(UNARY)] + [(name, 2) for name in sorted(BINARY)]
LOW_PRECISION_CASES += [(name, 1) for name in sorted(REDUCE)] + [("atomic.matmul", 2)]


@pytest.mark.parametrize("name, arity", LOW_PRECISION_CASES)
@pytest.mark.parametrize("element_type", ["f32", "f16", "bf16"])
def test_reference_keeps_the_element_type(name, arity, element_type):
    """A reference computes in its operands' dtype: bf16 stays bf16 (ml_dtypes)."""
    dtype = TensorType.get((), element_type).dtype
    x = np.random.default_rng(arity).uniform(0.5, 2.0, (3, 3)).astype(dtype)
    attributes = {"axes": (0,)} if name in REDUCE else None
    exact = run(name, [x.astype(np.float64)] * arity, attributes)
    got = run(name, [x] * arity, attributes)  # `run` checks the result dtype
    # rtol 2e-2: a handful of roundings at bf16's 2**-8 unit roundoff
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2e-2, atol=1e-3)


# -- registry coverage ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(op.name for op in dialect_ops("atomic")))
def test_atomic_op_has_docstring_with_syntax(name):
    doc = OPS[name].__doc__ or ""
    assert doc.strip() and name in doc, f"{name}: the docstring needs a syntax example"


def test_every_atomic_op_has_semantics_test():
    missing = {op.name for op in dialect_ops("atomic")} - COVERED
    assert not missing, f"atomic ops without a semantics test: {sorted(missing)}"


def test_covered_names_are_registered():
    assert COVERED <= set(OPS), sorted(COVERED - set(OPS))


@pytest.mark.parametrize(
    "view",
    [
        "atomic.broadcast %ids {shape = [4, 5]} : (tensor<1x5xi64>) -> tensor<4x5xi64>",
        "atomic.reshape %ids {shape = [4, 5]} : (tensor<1x5xi64>) -> tensor<4x5xi64>",
    ],
)
def test_random_indices_reach_a_gather_through_views_in_range(view):
    """Token-type ids broadcast to the batch before they index a 2-row table: random inputs
    draw them below 2 (drawn in [0, 4) they failed BERT's first use on the GPU)."""
    if "reshape" in view:
        view = view.replace("tensor<1x5xi64>", "tensor<20xi64>")
    ids_type = view.split("(")[1].split(")")[0]
    text = (
        f"func.func @f(%table: tensor<2x3xf32>, %ids: {ids_type}) -> tensor<4x5x3xf32> {{\n"
        f"  %v = {view}\n"
        "  %y = atomic.gather %table, %v {axis = 0} : (tensor<2x3xf32>, tensor<4x5xi64>)"
        " -> tensor<4x5x3xf32>\n"
        "  func.return %y : tensor<4x5x3xf32>\n"
        "}\n"
    )
    from tgc.dialects.atomic import gather_index_bound
    from tgc.parser import parse_module
    from tgc.runtime.interpreter import random_inputs, run_function

    func = parse_module(text).funcs[0]
    assert gather_index_bound(func.body.args[1]) == 2
    for seed in range(8):
        table, ids = random_inputs(func, seed)
        assert ids.min() >= 0 and ids.max() < 2
        run_function(func, [table, ids], "f64")  # in range: it runs

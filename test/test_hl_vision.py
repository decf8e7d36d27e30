"""The vision ops of hl (dialects/hl_conv.py, hl_pool.py, hl_image.py): convolutions, transposed
convolutions, pools, group and batch norm, resize.

Each case is checked three ways on fresh seeded N(0, 1) inputs (variances uniform in [0.5, 2)):
- its decomposition (`lower-hl`, no hl op left) against its numpy meaning, both run by the
  interpreter in float64: |lowered - reference| <= 1e-12 * max(1, max|reference|) (the two sum
  in different orders: im2col's one matmul against a sum over taps); functions typed f32, run
  in float64 with f32 constants in the decomposition (resize's weights): 1e-6;
- its numpy meaning against a formula written another way, with Python loops over every output
  element and math.fsum (small shapes): 1e-12 relative to the largest output;
- against PyTorch's torch.nn.functional in float64 where PyTorch is installed (skipped in CI,
  which has no PyTorch): 1e-12 relative to the largest output.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import tgc
import tgc.passes  # noqa: F401  (registers the passes)
from tgc.builder import FunctionBuilder
from tgc.runtime.interpreter import run_function
from tgc.types import TensorType

TOL = {"f64": 1e-12, "f32": 1e-6}

# name -> (op, operand shapes, attributes, result shape for ops that take it (resize) or None)
CASES = {
    "conv2d": ("conv2d", [(2, 4, 7, 9), (6, 2, 3, 2), (6,)], dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2], groups=2), None),
    "conv2d_1x1": ("conv2d", [(2, 5, 3, 4), (3, 5, 1, 1)], {}, None),
    "conv2d_depthwise": ("conv2d", [(1, 4, 6, 6), (4, 1, 3, 3), (4,)], dict(pads=[1, 1, 1, 1], groups=4), None),
    "conv1d": ("conv1d", [(2, 3, 11), (4, 3, 3)], dict(strides=[2], pads=[1, 1]), None),
    "conv3d": ("conv3d", [(1, 2, 5, 4, 6), (4, 1, 2, 3, 2)], dict(groups=2, pads=[1, 0, 1, 1, 0, 1]), None),
    "conv_transpose2d": ("conv_transpose2d", [(2, 3, 5, 6), (3, 4, 3, 2), (4,)], dict(strides=[2, 3], pads=[1, 0, 1, 0], dilations=[2, 1], output_padding=[1, 2]), None),
    "conv_transpose2d_groups": ("conv_transpose2d", [(2, 4, 5, 6), (4, 3, 3, 2)], dict(strides=[2, 2], pads=[2, 1, 2, 1], groups=2), None),
    "conv_transpose1d": ("conv_transpose1d", [(1, 4, 5), (4, 1, 2)], dict(strides=[3], groups=2), None),
    "conv_transpose3d": ("conv_transpose3d", [(1, 2, 3, 3, 3), (2, 3, 2, 2, 2)], dict(strides=[2, 2, 2]), None),
    "max_pool2d": ("max_pool2d", [(2, 3, 9, 8)], dict(kernel=[3, 2], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[1, 2], ceil_mode=True), None),
    "max_pool1d": ("max_pool1d", [(2, 3, 9)], dict(kernel=[3], strides=[2]), None),
    "max_pool3d": ("max_pool3d", [(1, 2, 4, 5, 4)], dict(kernel=[2, 2, 2], strides=[2, 2, 2], ceil_mode=True), None),
    "avg_pool2d": ("avg_pool2d", [(2, 3, 9, 8)], dict(kernel=[3, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=True), None),
    "avg_pool2d_include_pad": ("avg_pool2d", [(2, 3, 9, 8)], dict(kernel=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1], count_include_pad=True), None),
    "avg_pool2d_global": ("avg_pool2d", [(2, 3, 5, 4)], dict(kernel=[5, 4]), None),
    "avg_pool1d": ("avg_pool1d", [(2, 3, 9)], dict(kernel=[3], pads=[1, 1]), None),
    "avg_pool3d": ("avg_pool3d", [(1, 2, 4, 4, 4)], dict(kernel=[2, 2, 2], strides=[2, 2, 2]), None),
    "group_norm": ("group_norm", [(2, 6, 4, 5), (6,), (6,)], dict(groups=3), None),
    "batch_norm": ("batch_norm", [(2, 6, 4, 5), (6,), (6,), (6,), (6,)], {}, None),
    "resize_nearest": ("resize", [(2, 3, 4, 5)], dict(mode="nearest", coordinate="asymmetric"), (2, 3, 8, 10)),
    "resize_nearest_down": ("resize", [(2, 3, 4, 5)], dict(mode="nearest", coordinate="asymmetric"), (2, 3, 3, 2)),
    "resize_bilinear": ("resize", [(2, 3, 4, 5)], dict(mode="linear"), (2, 3, 8, 7)),
    "resize_bilinear_corners": ("resize", [(2, 3, 4, 5)], dict(mode="linear", coordinate="align_corners"), (2, 3, 3, 9)),
}  # fmt: skip


def build(case: str, dt: str = "f64"):
    op, shapes, attributes, result = CASES[case]
    types = [TensorType.get(s, dt) for s in shapes]
    fb = FunctionBuilder("f", types)
    extra = {"result_type": TensorType.get(result, dt)} if result else {}
    return fb.ret(getattr(fb.hl, op)(*fb.args, **extra, **attributes))


def inputs(case: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(s) for s in CASES[case][1]]
    if CASES[case][0] == "batch_norm":
        out[4] = rng.uniform(0.5, 2.0, out[4].shape)  # a variance
    return out


def reference(case: str, xs) -> np.ndarray:
    (y,) = run_function(build(case).funcs[0], xs, "f64")
    return y


def close(got, want, tol: float = 1e-12) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    bound = tol * max(1.0, float(np.max(np.abs(want), initial=0)))
    assert np.max(np.abs(got - want), initial=0) <= bound, np.max(np.abs(got - want))


@pytest.mark.parametrize("dt", ["f64", "f32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_decomposition_computes_the_meaning(case, dt):
    module = build(case, dt)
    xs = inputs(case, seed=len(case))
    (want,) = run_function(module.funcs[0], xs, "f64")
    tgc.run_pipeline(module, "lower-hl")
    left = [op.name for op in module.walk() if op.name.startswith("hl.")]
    assert not left
    (got,) = run_function(module.funcs[0], xs, "f64")
    close(got, want, TOL[dt])


def test_a_1x1_convolution_is_a_matmul():
    module = build("conv2d_1x1")
    tgc.run_pipeline(module, "lower-hl")
    names = [op.name for op in module.funcs[0].body.ops]
    assert names == ["atomic.reshape", "atomic.reshape", "atomic.matmul", "atomic.reshape"] + [
        "func.return"
    ]


def test_a_global_pool_is_one_reduction_per_dim():
    module = build("avg_pool2d_global")
    tgc.run_pipeline(module, "lower-hl")
    names = [op.name for op in module.funcs[0].body.ops]
    assert names.count("atomic.reduce_sum") == 2 and "atomic.slice" not in names


# -- the meanings against loops -------------------------------------------------------------------


def window_attrs(attributes: dict, k: int):
    strides = attributes.get("strides", [1] * k)
    dilations = attributes.get("dilations", [1] * k)
    pads = attributes.get("pads", [0] * 2 * k)
    return strides, dilations, pads[:k]


def conv_loops(x, w, b, attributes, out_shape):
    """y[n, o, i...] = sum over c in o's group and taps t of x[n, c, i*s - p + t*d] w[o, c, t]."""
    k = x.ndim - 2
    strides, dilations, begins = window_attrs(attributes, k)
    groups = attributes.get("groups", 1)
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    y = np.zeros(out_shape)
    for n, o, *pos in itertools.product(*map(range, out_shape)):
        terms = []
        for c, *tap in itertools.product(range(cg), *map(range, w.shape[2:])):
            src = [i * s - p + t * d for i, s, p, t, d in zip(pos, strides, begins, tap, dilations)]
            if all(0 <= v < length for v, length in zip(src, x.shape[2:])):
                terms.append(x[(n, (o // og) * cg + c, *src)] * w[(o, c, *tap)])
        y[(n, o, *pos)] = math.fsum(terms) + (b[o] if b is not None else 0.0)
    return y


def conv_transpose_loops(x, w, b, attributes, out_shape):
    """y[n, o, i...] = sum over input positions j and taps t with j*s - p + t*d = i."""
    k = x.ndim - 2
    strides, dilations, begins = window_attrs(attributes, k)
    groups = attributes.get("groups", 1)
    cg, og = x.shape[1] // groups, w.shape[1]
    terms = {}
    for n, c, *j in itertools.product(*map(range, x.shape)):
        for o_in, *tap in itertools.product(range(og), *map(range, w.shape[2:])):
            i = tuple(
                a * s - p + t * d for a, s, p, t, d in zip(j, strides, begins, tap, dilations)
            )
            o = (c // cg) * og + o_in
            terms.setdefault((n, o, *i), []).append(x[(n, c, *j)] * w[(c, o_in, *tap)])
    y = np.zeros(out_shape)
    for index in itertools.product(*map(range, out_shape)):
        y[index] = math.fsum(terms.get(index, [])) + (b[index[1]] if b is not None else 0.0)
    return y


def pool_loops(x, attributes, out_shape, kind):
    k = x.ndim - 2
    strides, dilations, begins = window_attrs(attributes, k)
    ends = attributes.get("pads", [0] * 2 * k)[k:]
    y = np.zeros(out_shape)
    for n, c, *pos in itertools.product(*map(range, out_shape)):
        values, count = [], 0
        for tap in itertools.product(*map(range, attributes["kernel"])):
            src = [i * s - p + t * d for i, s, p, t, d in zip(pos, strides, begins, tap, dilations)]
            inside = all(0 <= v < length for v, length in zip(src, x.shape[2:]))
            in_pads = all(
                -p <= v < length + e for v, p, e, length in zip(src, begins, ends, x.shape[2:])
            )
            if inside:
                values.append(x[(n, c, *src)])
            count += inside or (in_pads and attributes.get("count_include_pad", False))
        y[(n, c, *pos)] = max(values) if kind == "max" else math.fsum(values) / count
    return y


def group_norm_loops(x, gamma, beta, attributes):
    groups, eps = attributes["groups"], 1e-5
    y = np.empty_like(x)
    per = x.shape[1] // groups
    for n, g in itertools.product(range(x.shape[0]), range(groups)):
        block = x[n, g * per : (g + 1) * per]
        values = [float(v) for v in block.reshape(-1)]
        mean = math.fsum(values) / len(values)
        var = math.fsum((v - mean) ** 2 for v in values) / len(values)
        for c in range(per):
            ch = g * per + c
            y[n, ch] = (x[n, ch] - mean) / math.sqrt(var + eps) * gamma[ch] + beta[ch]
    return y


def resize_loops(x, attributes, out_shape):
    """Per output element: PyTorch's formulas for nearest (asymmetric, floor) and bilinear."""
    mode, corners = attributes["mode"], attributes.get("coordinate") == "align_corners"
    y = np.zeros(out_shape)
    (h, w), (oh, ow) = x.shape[2:], out_shape[2:]

    def source(i, n_in, n_out):
        if corners:
            return i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        return max(0.0, (i + 0.5) * n_in / n_out - 0.5)

    for n, c, i, j in itertools.product(*map(range, out_shape)):
        if mode == "nearest":
            y[n, c, i, j] = x[n, c, min(h - 1, i * h // oh), min(w - 1, j * w // ow)]
            continue
        si, sj = source(i, h, oh), source(j, w, ow)
        i0, j0 = int(si), int(sj)
        i1, j1 = min(i0 + 1, h - 1), min(j0 + 1, w - 1)
        fi, fj = si - i0, sj - j0
        top = x[n, c, i0, j0] * (1 - fj) + x[n, c, i0, j1] * fj
        bottom = x[n, c, i1, j0] * (1 - fj) + x[n, c, i1, j1] * fj
        y[n, c, i, j] = top * (1 - fi) + bottom * fi
    return y


def loops(case: str, xs) -> np.ndarray:
    op, _, attributes, result = CASES[case]
    out_shape = reference(case, xs).shape  # the shapes are the verifier's (tested in lit)
    if op.startswith("conv_transpose"):
        return conv_transpose_loops(
            xs[0], xs[1], xs[2] if len(xs) > 2 else None, attributes, out_shape
        )
    if op.startswith("conv"):
        return conv_loops(xs[0], xs[1], xs[2] if len(xs) > 2 else None, attributes, out_shape)
    if "pool" in op:
        return pool_loops(xs[0], attributes, out_shape, op[:3])
    if op == "group_norm":
        return group_norm_loops(*xs, attributes)
    if op == "batch_norm":
        x, gamma, beta, mean, var = xs
        c = (slice(None), None, None)
        return (x - mean[c]) / np.sqrt(var[c] + 1e-5) * gamma[c] + beta[c]
    return resize_loops(xs[0], attributes, result)


@pytest.mark.parametrize("case", sorted(CASES))
def test_meaning_matches_loops(case):
    xs = inputs(case, seed=1)
    close(reference(case, xs), loops(case, xs))


def test_the_loops_can_fail():
    xs = inputs("conv2d", seed=1)
    want = reference("conv2d", xs)
    xs[1][0, 0, 0, 0] += 1.0  # one weight changed: the loops see it
    with pytest.raises(AssertionError):
        close(want, loops("conv2d", xs))


# -- against PyTorch ------------------------------------------------------------------------------


def torch_result(case: str, xs):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI has none)")
    F = torch.nn.functional
    op, _, a, result = CASES[case]
    t = [torch.tensor(v) for v in xs]
    k = t[0].dim() - 2
    pads = a.get("pads", [0] * 2 * k)
    # F.pad takes (last dim begin, end, ..., first spatial dim begin, end)
    pairs = [p for i in reversed(range(k)) for p in (pads[i], pads[k + i])]
    if op.startswith("conv_transpose"):
        fn = getattr(F, op)
        assert pads[:k] == pads[k:], "torch pads transposed convolutions symmetrically"
        return fn(
            *t,
            stride=a.get("strides", 1),
            padding=pads[:k],
            dilation=a.get("dilations", 1),
            groups=a.get("groups", 1),
            output_padding=a.get("output_padding", 0),
        )
    if op.startswith("conv"):
        x = F.pad(t[0], pairs)
        return getattr(F, op)(
            x,
            *t[1:],
            stride=a.get("strides", 1),
            dilation=a.get("dilations", 1),
            groups=a.get("groups", 1),
        )
    if op.startswith("max_pool"):
        assert pads[:k] == pads[k:]
        return getattr(F, op)(
            t[0],
            a["kernel"],
            a.get("strides", 1),
            pads[:k],
            dilation=a.get("dilations", 1),
            ceil_mode=a.get("ceil_mode", False),
        )
    if op.startswith("avg_pool"):
        assert pads[:k] == pads[k:]
        return getattr(F, op)(
            t[0],
            a["kernel"],
            a.get("strides", 1),
            pads[:k],
            ceil_mode=a.get("ceil_mode", False),
            count_include_pad=a.get("count_include_pad", False),
        )
    if op == "group_norm":
        return F.group_norm(t[0], a["groups"], t[1], t[2])
    if op == "batch_norm":
        return F.batch_norm(t[0], t[3], t[4], t[1], t[2])
    if a["mode"] == "nearest":
        return F.interpolate(t[0], size=result[2:], mode="nearest")
    corners = a.get("coordinate") == "align_corners"
    return F.interpolate(t[0], size=result[2:], mode="bilinear", align_corners=corners)


@pytest.mark.parametrize("case", sorted(CASES))
def test_meaning_matches_torch(case):
    xs = inputs(case, seed=2)
    want = torch_result(case, xs).numpy()
    close(reference(case, xs), want)

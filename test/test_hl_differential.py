"""Differential tests: random graphs mixing hl and atomic ops keep their float64 results through
`lower-hl` and through the whole `optimize` pipeline.

`graphs()` is a hypothesis strategy that builds a random valid function: two to four arguments
whose shapes broadcast against one another ([R, C], [C], [R, 1], [] and a [C, C] weight), then
up to twelve ops drawn from the atomic elementwise and reduction ops, matmul and every hl op,
each reading values already built (so subexpressions are shared), and returning the last one and
a random subset of the other unused ones (so some values are dead). Each value carries a bound on its magnitude; an op is only drawn
where its result stays below 1e6, so no case overflows float64 and every comparison means
something. Arguments are uniform in [-s, s] with s drawn from {1, 3, 30} (|x| up to 30 feeds the
activations and softmaxes their large-magnitude branches; products of such values go higher).

Graphs are typed f64, so the decompositions' constants are exact and only rounding differs:
|after - before| <= 1e-8 * |before| + 1e-8 * max(1, bound of the output), NaN equal to NaN.
(The 1e-8 is far above f64 rounding but far below any real error, which would be O(1).)

On failure hypothesis prints the function text and the input seed (and, with print_blob, the
`@reproduce_failure` line that replays it); `replay(text, seed, pipeline)` reruns one case.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

import tgc
import tgc.passes  # registers the passes
from tgc.builder import FunctionBuilder, tensor
from tgc.pass_manager import PASSES
from tgc.runtime.interpreter import random_inputs, run_function

LIMIT = 1e6
TOLERANCE = 1e-8


class NoChoice(Exception):
    """No value fits the step being drawn: the step is skipped."""


class Graph:
    """A function under construction: values with their magnitude bounds."""

    def __init__(self, draw, rows: int, cols: int) -> None:
        self.draw, self.rows, self.cols = draw, rows, cols
        shapes = {
            "full": f"{rows}x{cols}xf64",
            "row": f"{cols}xf64",
            "col": f"{rows}x1xf64",
            "scalar": "f64",
            "weight": f"{cols}x{cols}xf64",
        }
        kinds = (
            ["full"]
            + draw(
                st.lists(st.sampled_from(["row", "col", "scalar", "full"]), min_size=1, max_size=2)
            )
            + ["weight"]
        )
        names = [f"a{i}" for i in range(len(kinds) - 1)] + ["w"]  # replay() scales all but %w
        self.fb = FunctionBuilder("g", [tensor(shapes[k]) for k in kinds], names)
        self.scale = draw(st.sampled_from([1.0, 3.0, 30.0]))
        self.pool = [(v, 1.0 if k == "weight" else self.scale) for v, k in zip(self.fb.args, kinds)]

    def pick(self, predicate=lambda v: True):
        choices = [(v, b) for v, b in self.pool if predicate(v)]
        if not choices:
            raise NoChoice
        return self.draw(st.sampled_from(choices))

    def add(self, value, bound: float) -> None:
        self.pool.append((value, bound))


def _shape(v):
    return v.type.shape


def _is_full(g: Graph):
    return lambda v: _shape(v) == (g.rows, g.cols)


def _broadcasts_into(target):
    def ok(v):
        s = _shape(v)
        if len(s) > len(target):
            return False
        return all(d in (1, t) for d, t in zip(reversed(s), reversed(target)))

    return ok


def _keeps_set(g: Graph):
    """Shapes every binary op result may have (all broadcast with one another)."""
    allowed = {(g.rows, g.cols), (g.cols,), (g.rows, 1), (), (1, g.cols)}
    return lambda v: _shape(v) in allowed


# -- one step per op family: returns (value, bound) or None when the step does not apply --------


def step_binary(g: Graph, b):
    a, ba = g.pick(_keeps_set(g))
    c, bc = g.pick(_keeps_set(g))
    op = g.draw(st.sampled_from(["add", "sub", "mul", "max", "min"]))
    bound = {"add": ba + bc, "sub": ba + bc, "mul": ba * bc}.get(op, max(ba, bc))
    return getattr(b.atomic, op)(a, c), bound


def step_unary(g: Graph, b):
    x, bx = g.pick(_keeps_set(g))
    op = g.draw(
        st.sampled_from(
            [
                "neg",
                "abs",
                "sin",
                "cos",
                "erf",
                "exp",
                "tanh",
                "sigmoid",
                "relu",
                "silu",
                "gelu",
                "gelu_tanh",
            ]
        )
    )
    if op == "exp":
        return (b.atomic.exp(x), math.exp(bx)) if bx < 13 else None
    if op in ("neg", "abs", "sin", "cos", "erf"):
        return getattr(b.atomic, op)(x), (bx if op in ("neg", "abs") else 1.0)
    if op == "gelu_tanh":
        return b.hl.gelu(x, approximate="tanh"), bx
    return getattr(b.hl, op)(x), (1.0 if op in ("tanh", "sigmoid") else bx)


def step_softmax(g: Graph, b):
    x, bx = g.pick(lambda v: _keeps_set(g)(v) and v.type.rank >= 1)
    axis = g.draw(st.integers(-x.type.rank, x.type.rank - 1))
    if g.draw(st.booleans()):
        return b.hl.softmax(x, axis=axis), 1.0
    return b.hl.log_softmax(x, axis=axis), 2 * bx + math.log(max(2, x.type.num_elements))


def step_reduce(g: Graph, b):
    x, bx = g.pick(_is_full(g))
    kind = g.draw(st.sampled_from(["mean", "mean", "reduce_sum", "reduce_max"]))
    axes, keepdims = g.draw(
        st.sampled_from([((1,), True), ((-1,), True), ((0,), False), ((0,), True), ((0, 1), True)])
    )
    keep = {"keepdims": True} if keepdims else {}
    if kind == "mean":
        return b.hl.mean(x, axes=axes, **keep), bx
    n = math.prod(x.type.shape[a] for a in axes)
    return getattr(b.atomic, kind)(x, axes=axes, **keep), bx * (n if kind == "reduce_sum" else 1)


def step_norm(g: Graph, b):
    x, _ = g.pick(_is_full(g))
    axis = g.draw(st.sampled_from([-1, 0]))
    normalised = x.type.shape[axis % 2 :]
    gamma, bg = g.pick(_broadcasts_into(normalised))
    n = math.prod(normalised)
    if g.draw(st.booleans()):
        return b.hl.rmsnorm(x, gamma, axis=axis), math.sqrt(n) * bg
    beta, bb = g.pick(_broadcasts_into(normalised))
    return b.hl.layernorm(x, gamma, beta, axis=axis), math.sqrt(n) * bg + bb


def step_linear(g: Graph, b):
    x, bx = g.pick(lambda v: _shape(v) in ((g.rows, g.cols), (g.cols,)))
    w, bw = g.pick(lambda v: _shape(v) == (g.cols, g.cols))
    bound = bx * bw * g.cols
    kind = g.draw(st.sampled_from(["linear", "linear_bias", "matmul"]))
    if kind == "matmul":
        return (b.atomic.matmul(x, w), bound) if x.type.rank == 2 else None
    if kind == "linear":
        return b.hl.linear(x, w), bound
    bias, bb = g.pick(_broadcasts_into((g.cols,)))
    return b.hl.linear(x, w, bias), bound + bb


def step_attention(g: Graph, b):
    q, _ = g.pick(_is_full(g))
    k, _ = g.pick(_is_full(g))
    v, bv = g.pick(_is_full(g))
    attributes = {}
    if g.draw(st.booleans()):
        attributes["causal"] = True
    if g.draw(st.booleans()):
        attributes["scale"] = g.draw(st.sampled_from([0.5, 0.01]))
    operands = (q, k, v)
    if g.draw(st.booleans()):
        operands += (g.pick(_broadcasts_into((g.rows, g.rows)))[0],)
    return b.hl.attention(*operands, **attributes), bv


STEPS = [
    step_binary,
    step_unary,
    step_unary,
    step_softmax,
    step_reduce,
    step_norm,
    step_linear,
    step_attention,
]


@st.composite
def graphs(draw) -> str:
    """The text of a random function @g (see the module docstring)."""
    g = Graph(draw, draw(st.integers(1, 5)), draw(st.integers(1, 6)))
    b = g.fb
    for _ in range(draw(st.integers(1, 12))):
        try:
            built = draw(st.sampled_from(STEPS))(g, b)
        except NoChoice:
            continue
        if built is None or built[1] > LIMIT:
            continue  # a step that does not apply, or could overflow: ops left unused are dead
        g.add(*built)
    # Return the last value and a random subset of the other values nobody uses: the rest of
    # those stay dead.
    last, bound = g.pool[-1]
    results = [last]
    for value, value_bound in g.pool[:-1]:
        if value.defining_op is not None and not value.uses and draw(st.booleans()):
            results.append(value)
            bound = max(bound, value_bound)
    module = b.ret(*results)
    return f"// scale {g.scale} bound {bound}\n" + tgc.print_ir(module)


def replay(text: str, seed: int, pipeline: str) -> None:
    """Run one case: `text` from graphs(), inputs from `seed`; raises on a mismatch."""
    _, _, scale, _, bound = text.split("\n", 1)[0].split()
    scale, bound = float(scale), float(bound)
    module = tgc.parse(text, "graph.tg")
    func = module.funcs[0]
    rng = np.random.default_rng(seed)
    inputs = [
        rng.uniform(-1.0, 1.0, a.type.shape) * (1.0 if a.name_hint == "w" else scale)
        for a in func.args
    ]
    before = run_function(func, inputs, "f64")
    tgc.run_pipeline(module, pipeline)
    after = run_function(module.funcs[0], inputs, "f64")
    assert not any(op.name.startswith("hl.") for op in module.walk())
    for want, got in zip(before, after):
        np.testing.assert_allclose(
            got, want, rtol=TOLERANCE, atol=TOLERANCE * max(1.0, bound), equal_nan=True
        )


PIPELINES = ["lower-hl", "optimize", "lower-hl,canonicalize,cse,dce", "lower-hl,algebraic"]
EXAMPLES = 300  # per pipeline

# Cases this test once found, (text, seed), replayed first on every run (each pipeline) so that a
# found failure stays found: add the `replay(...)` note of a new failure here.
PAST_FAILURES = [
    # issue 27: dead matmuls sharing %w made `algebraic` crash (KeyError: None in find_moves)
    (
        "// scale 1.0 bound 1.0\n"
        "func.func @g(%a0: tensor<2x1xf64>, %a1: tensor<1xf64>, %w: tensor<1x1xf64>)"
        " -> tensor<2x1xf64> {\n"
        "  %0 = atomic.neg %a0 : (tensor<2x1xf64>) -> tensor<2x1xf64>\n"
        "  %1 = atomic.neg %0 : (tensor<2x1xf64>) -> tensor<2x1xf64>\n"
        "  %2 = atomic.neg %a0 : (tensor<2x1xf64>) -> tensor<2x1xf64>\n"
        "  %3 = hl.linear %a0, %w : (tensor<2x1xf64>, tensor<1x1xf64>) -> tensor<2x1xf64>\n"
        "  %4 = atomic.add %a0, %a0 : (tensor<2x1xf64>, tensor<2x1xf64>) -> tensor<2x1xf64>\n"
        "  %5 = atomic.add %a0, %1 : (tensor<2x1xf64>, tensor<2x1xf64>) -> tensor<2x1xf64>\n"
        "  %6 = atomic.neg %a0 : (tensor<2x1xf64>) -> tensor<2x1xf64>\n"
        "  %7 = hl.linear %2, %w : (tensor<2x1xf64>, tensor<1x1xf64>) -> tensor<2x1xf64>\n"
        "  %8 = hl.linear %a0, %w : (tensor<2x1xf64>, tensor<1x1xf64>) -> tensor<2x1xf64>\n"
        "  func.return %8 : tensor<2x1xf64>\n"
        "}\n",
        0,
    ),
]


def _with_past_failures(test):
    for text, seed in reversed(PAST_FAILURES):
        test = example(text=text, seed=seed)(test)
    return test


@pytest.mark.parametrize("pipeline", PIPELINES)
@_with_past_failures
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(text=graphs(), seed=st.integers(0, 2**32 - 1))
def test_pipeline_keeps_float64_results(pipeline, text, seed):
    missing = [p for p in ("canonicalize", "cse", "algebraic", "dce") if p not in PASSES]
    if pipeline != "lower-hl" and missing:
        pytest.skip(f"passes not written yet: {missing}")
    note(f"replay: replay({text!r}, {seed}, {pipeline!r})")
    replay(text, seed, pipeline)


# -- every example and every lit test module ---------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
SPLIT = re.compile(r"^// -----.*$", re.MULTILINE)


def modules_in_the_repository():
    """(name, text) of every function-bearing chunk of examples/*.tg and test/lit/**/*.tg that
    parses and verifies (the diagnostics tests' chunks do not)."""
    files = sorted(ROOT.glob("examples/*.tg")) + sorted((ROOT / "test" / "lit").rglob("*.tg"))
    for path in files:
        if "Output" in path.parts:
            continue
        for i, chunk in enumerate(SPLIT.split(path.read_text())):
            try:
                module = tgc.parse(chunk, str(path))
            except tgc.TgcError:
                continue
            if module.funcs:
                yield f"{path.relative_to(ROOT)}#{i}", chunk


CASES = list(modules_in_the_repository())


# Modules of GPU size (x 8192x1024, attention scores 8x16x1024x1024: up to 940 million values
# once lowered, 7 GB in float64) are optimised at their own size, where the cost model makes
# the choices their lit tests check, and then both the module and its optimised form are run at
# smaller dims: every dim `d` of SMALLER_DIMS in a tensor type or a split's sizes becomes its
# value, in both texts alike, so the ops, their order and their attributes stay those chosen at
# full size. A module over FULL_SIZE_BUDGET whose dims none of the maps shrinks below it fails
# (give it its own list of substitutions in SHRINK_BY_NAME).
FULL_SIZE_BUDGET = 16_000_000  # values of the lowered module (128 MB in float64)
SMALLER_DIMS = [{8192: 64, 1024: 8}, {8192: 64}, {4096: 64}, {4096: 64, 1024: 64}, {1024: 64}]
SHRINK_BY_NAME = {
    # 1024 is both the sequence (8x1024 rows of x) and the model dim (16 heads x 64): substitute
    # the sequence in whole type prefixes; the weights (1024x1024xbf16) stay as they are
    "test/lit/cuda/params.tg#0": [
        ("8192x", "64x"),
        ("8x1024x16x64", "8x8x16x64"),
        ("8x16x1024x", "8x16x8x"),
        ("8x16x8x1024x", "8x16x8x8x"),
        ("tensor<1024x1024xi", "tensor<8x8xi"),
    ],
}
SHRINK_BY_NAME["test/lit/cuda/params.tg#1"] = SHRINK_BY_NAME["test/lit/cuda/params.tg#0"]
_TYPE_OR_SIZES = re.compile(r"tensor<[^>]*>|sizes = \[[^\]]*\]")


def lowered_size(text: str, name: str) -> int:
    module = tgc.parse(text, name)
    tgc.run_pipeline(module, "lower-hl")
    return sum(
        math.prod(r.type.shape)
        for op in module.walk()
        for r in op.results
        if hasattr(r.type, "shape")
    ) + sum(math.prod(a.type.shape) for f in module.funcs for a in f.args)


def shrink(text: str, dims) -> str:
    """`text` with SMALLER_DIMS-style `dims` (or a list of substring substitutions) applied."""
    if isinstance(dims, list):
        for old, new in dims:
            text = text.replace(old, new)
        return text
    number = re.compile(r"(?<![0-9.])(" + "|".join(map(str, dims)) + r")(?![0-9.])")
    return _TYPE_OR_SIZES.sub(
        lambda m: number.sub(lambda n: str(dims[int(n.group(1))]), m.group(0)), text
    )


def smaller_pair(name: str, before: str, after: str) -> tuple[str, str]:
    """(before, after) shrunk below FULL_SIZE_BUDGET by the first map under which both parse
    and verify."""
    for dims in [SHRINK_BY_NAME[name]] if name in SHRINK_BY_NAME else SMALLER_DIMS:
        small = shrink(before, dims), shrink(after, dims)
        try:
            sizes = [lowered_size(t, name) for t in small]
        except tgc.TgcError:
            continue
        if max(sizes) <= FULL_SIZE_BUDGET:
            return small
    raise AssertionError(f"{name}: no smaller dims verify; add its substitutions to SHRINK_BY_NAME")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # log, sqrt, pow of negative inputs
@pytest.mark.parametrize("name, text", CASES, ids=[name for name, _ in CASES])
def test_optimize_keeps_the_results_of_every_module(name, text):
    """float64 before and after `optimize`, seeded N(0, 1) inputs (at smaller dims for modules
    of GPU size, above). The decompositions' constants have the module's float type (see
    test_lower_hl.py), so the tolerance follows the narrowest float type present: |after -
    before| <= tol (|before| + max(1, max |before|)), tol = 1e-6 for f32 (and f64), 4e-3 for
    f16, 3e-2 for bf16."""
    tol = 3e-2 if "bf16" in text else 4e-3 if "f16" in text else 1e-6
    module = tgc.parse(text, name)
    tgc.run_pipeline(module, "optimize")
    optimized = tgc.print_ir(module)
    if lowered_size(text, name) > FULL_SIZE_BUDGET:
        text, optimized = smaller_pair(name, text, optimized)
    original, module = tgc.parse(text, name), tgc.parse(optimized, name)
    for before_func, func in zip(original.funcs, module.funcs):
        inputs = random_inputs(before_func, 0)
        before = run_function(before_func, inputs, "f64")
        after = run_function(func, inputs, "f64")
        for want, got in zip(before, after):
            big = max(1.0, float(np.max(np.abs(want[np.isfinite(want)]), initial=0)))
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * big, equal_nan=True)


def test_shrinking_keeps_the_ops_and_fits_the_budget():
    """The smaller-dims check is not vacuous: every module over the budget gets a pair that
    verifies, below the budget, with the optimised ops unchanged in name and order."""
    shrunk = 0
    for name, text in CASES:
        if lowered_size(text, name) <= FULL_SIZE_BUDGET:
            continue
        module = tgc.parse(text, name)
        tgc.run_pipeline(module, "optimize")
        big_ops = [op.name for op in module.walk()]
        small_before, small_after = smaller_pair(name, text, tgc.print_ir(module))
        assert [op.name for op in tgc.parse(small_after, name).walk()] == big_ops
        assert len(list(tgc.parse(small_before, name).walk())) == len(
            list(tgc.parse(text, name).walk())
        )
        shrunk += 1
    assert shrunk >= 20

"""Differential tests: canonicalize, cse and dce never change what a function computes.

A hypothesis strategy builds random valid functions from atomic ops through the FunctionBuilder:
arguments whose shapes broadcast against each other (size-1 dims, lower ranks), unary and
broadcasting binary ops, comparisons and selects, reductions with negative axes, transposes,
reshapes, broadcasts, matmuls (with transposed operands), constants (0, -0, 1, -1, powers of two,
random), shared subexpressions (an op repeated, commutative ones with swapped operands), shapes
the canonicalizer rewrites (x+x+x, --x, chains with constants, transposes of transposes) and dead
values. Each pipeline runs on a fresh parse of the printed function; the float64 interpreter must
give the same results before and after, on inputs that include NaN, ±inf and ±0.

Tolerance: NaN and ±inf positions must agree exactly; elsewhere
|after - before| <= 1e-9 * scale + 1e-9 * |before| (f64 graphs; 1e-5 for f32 graphs, whose
constants fold in f32), where scale is the largest finite magnitude of any intermediate value
of the original (reassociating a sum moves its cancellation). Signs of zeros are not compared:
numpy's maximum/minimum are not commutative on ±0, yet they carry the COMMUTATIVE trait.

A failure prints the function (`.tg` text, replayable with tgc-opt) and the input seed;
hypothesis prints the reproduction blob.
"""

from __future__ import annotations

import cProfile
import pstats

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import tgc.passes  # noqa: F401
from tgc.attributes import DenseAttr
from tgc.builder import FunctionBuilder, tensor
from tgc.builtin import ReturnOp
from tgc.diagnostics import VerifyError
from tgc.ir import Operation
from tgc.opdef import Operand
from tgc.parser import parse_module
from tgc.pass_manager import PassManager, parse_pipeline
from tgc.printer import print_module
from tgc.runtime.interpreter import run_function
from tgc.types import TensorType
from tgc.verifier import verify

PIPELINES = ["canonicalize", "cse", "dce", "canonicalize,cse,dce", "cse,canonicalize,dce,cse"]
UNARY = ["neg", "exp", "abs", "sin", "cos", "sqrt", "log", "recip", "rsqrt", "erf"]
BINARY = ["add", "sub", "mul", "div", "max", "min", "pow"]
COMMUTATIVE = {"add", "mul", "max", "min"}
CONSTANTS = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, 4.0]
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0])
KINDS = [
    "unary",
    "binary",
    "binary",
    "binary",
    "constant",
    "repeat",
    "select",
    "reduce",
    "transpose",
    "reshape",
    "broadcast",
    "matmul",
    "idiom",
]


class Case:
    """A random function and the seed of its inputs; its repr is replayable text."""

    def __init__(self, module, seed: int) -> None:
        self.text = print_module(module)
        self.seed = seed
        self.element_type = module.funcs[0].args[0].type.element_type

    def __repr__(self) -> str:
        return f"Case(seed={self.seed}):\n{self.text}"


class _GraphBuilder:
    def __init__(self, draw, element_type: str) -> None:
        self.draw = draw
        self.element_type = element_type
        rank = draw(st.integers(0, 3))
        self.universe = tuple(draw(st.sampled_from([1, 2, 3, 4])) for _ in range(rank))
        n_args = draw(st.integers(1, 4))
        types = [self.tensor(self.subshape()) for _ in range(n_args)]
        self.fb = FunctionBuilder("f", types, [f"a{i}" for i in range(n_args)])
        self.pool = list(self.fb.args)

    def tensor(self, shape) -> TensorType:
        return TensorType.get(tuple(shape), self.element_type)

    def subshape(self) -> tuple[int, ...]:
        keep = self.draw(st.integers(0, len(self.universe)))
        shape = self.universe[len(self.universe) - keep :]
        return tuple(
            1 if self.draw(st.booleans()) and self.draw(st.booleans()) else d for d in shape
        )

    def pick(self):
        recent = self.pool[-6:]
        return self.draw(st.sampled_from(recent if self.draw(st.booleans()) else self.pool))

    def constant(self, shape=None):
        t = self.tensor(self.subshape() if shape is None else shape)
        if self.draw(st.booleans()):
            value = np.full(t.shape, self.draw(st.sampled_from(CONSTANTS)))
        else:
            seed = self.draw(st.integers(0, 2**16))
            value = np.random.default_rng(seed).standard_normal(t.shape)
        return self.fb.atomic.constant(value=DenseAttr(value.astype(t.dtype), t), result_type=t)

    def step(self) -> None:
        kind = self.draw(st.sampled_from(KINDS))
        a = self.fb.atomic
        try:
            value = getattr(self, "make_" + kind)(a)
        except VerifyError:
            return
        if value is not None:
            self.pool.append(value)

    def make_unary(self, a):
        return getattr(a, self.draw(st.sampled_from(UNARY)))(self.pick())

    def make_binary(self, a):
        other = self.constant() if self.draw(st.integers(0, 3)) == 0 else self.pick()
        x = self.pick()
        if self.draw(st.booleans()):
            x, other = other, x
        return getattr(a, self.draw(st.sampled_from(BINARY)))(x, other)

    def make_constant(self, a):
        return self.constant()

    def make_repeat(self, a):
        """Repeat an existing op (operands swapped when commutative): CSE's food."""
        ops = [v.defining_op for v in self.pool if v.defining_op is not None]
        if not ops:
            return None
        op: Operation = self.draw(st.sampled_from(ops))
        operands = list(op.operands)
        short = op.name.split(".")[1]
        if short in COMMUTATIVE and self.draw(st.booleans()):
            operands.reverse()
        types = [r.type for r in op.results]
        new = self.fb.create(op.name, operands, dict(op.attributes), types)
        return new.results[0]

    def make_select(self, a):
        pred = self.draw(st.sampled_from(["lt", "le", "gt", "ge", "eq", "ne"]))
        cond = a.cmp(self.pick(), self.pick(), pred=pred)
        return a.where(cond, self.pick(), self.pick())

    def make_reduce(self, a):
        x = self.pick()
        rank = x.type.rank
        if rank == 0:
            return None
        axes = self.draw(
            st.lists(
                st.integers(-rank, rank - 1),
                min_size=1,
                max_size=rank,
                unique_by=lambda i: i % rank,
            )
        )
        op = self.draw(st.sampled_from(["reduce_sum", "reduce_max", "reduce_min"]))
        return getattr(a, op)(x, axes=tuple(axes), keepdims=self.draw(st.booleans()))

    def make_transpose(self, a):
        x = self.pick()
        perm = self.draw(st.permutations(range(x.type.rank)))
        return a.transpose(x, perm=tuple(perm))

    def make_reshape(self, a):
        x = self.pick()
        shape = list(x.type.shape)
        choice = self.draw(st.integers(0, 3))
        if choice == 0:
            shape = [x.type.num_elements]
        elif choice == 1:
            shape = shape[::-1]
        elif choice == 2:
            shape.insert(self.draw(st.integers(0, len(shape))), 1)
        return a.reshape(x, result_type=x.type.with_shape(shape))

    def make_broadcast(self, a):
        x = self.pick()
        shape = [d if d != 1 or not self.draw(st.booleans()) else 2 for d in x.type.shape]
        if self.draw(st.booleans()):
            shape.insert(0, self.draw(st.sampled_from([1, 2, 3])))
        return a.broadcast(x, result_type=x.type.with_shape(shape))

    def make_matmul(self, a):
        x, y = self.pick(), self.pick()
        if x.type.rank < 2 or y.type.rank < 2:
            return None
        if self.draw(st.booleans()):
            perm = tuple(range(x.type.rank - 2)) + (x.type.rank - 1, x.type.rank - 2)
            x = a.transpose(x, perm=perm)
        ta, tb = self.draw(st.booleans()), self.draw(st.booleans())
        return a.matmul(x, y, transpose_a=ta, transpose_b=tb)

    def make_idiom(self, a):
        """Shapes the canonicalizer rewrites."""
        x = self.pick()
        which = self.draw(st.integers(0, 5))
        if which == 0:
            return a.add(a.add(x, x), x)  # x+x+x
        if which == 1:
            return a.neg(a.neg(x))  # --x
        if which == 2:
            return a.add(a.add(x, self.constant()), self.constant())  # (x+c1)+c2
        if which == 3:
            return a.mul(self.constant(()), a.mul(x, self.constant()))  # c*(x*c)
        if which == 4:
            perm = tuple(self.draw(st.permutations(range(x.type.rank))))
            inverse = tuple(int(i) for i in np.argsort(perm))
            return a.transpose(a.transpose(x, perm=perm), perm=inverse)
        return a.sub(x, self.constant())  # x-c


@st.composite
def cases(draw) -> Case:
    element_type = draw(st.sampled_from(["f64", "f64", "f64", "f32"]))
    g = _GraphBuilder(draw, element_type)
    for _ in range(draw(st.integers(1, 20))):
        g.step()
    results = [g.pool[-1]]
    results += draw(st.lists(st.sampled_from(g.pool), max_size=2))
    module = g.fb.ret(*results)
    return Case(module, draw(st.integers(0, 2**32 - 1)))


# -- running and comparing -------------------------------------------------------------------------


def random_inputs(func, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for arg in func.args:
        values = rng.standard_normal(arg.type.shape) * rng.choice([0.5, 1.0, 3.0])
        special = rng.random(arg.type.shape) < 0.1
        values = np.where(special, rng.choice(SPECIALS, size=arg.type.shape), values)
        out.append(np.asarray(values, dtype=arg.type.dtype))
    return out


def intermediate_scale(func, inputs) -> float:
    """The largest finite magnitude of any value the original computes (f64)."""
    env = dict(zip(func.args, [np.asarray(i, dtype=np.float64) for i in inputs]))
    scale = 1.0
    for op in func.body.ops:
        if isinstance(op, ReturnOp):
            break
        outs = op.reference(*[env[v] for v in op.operands])
        outs = outs if isinstance(outs, tuple) else (outs,)
        for r, o in zip(op.results, outs):
            o = np.asarray(o)
            env[r] = o.astype(np.float64) if r.type.is_float else o
            finite = np.abs(env[r][np.isfinite(env[r])]) if r.type.is_float else np.abs(o)
            if finite.size:
                scale = max(scale, float(finite.max()))
    return scale


def assert_same(before, after, scale: float, rel: float, where: str) -> None:
    for i, (b, a) in enumerate(zip(before, after)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{where}: result #{i} type changed"
        if b.dtype.kind != "f":
            assert np.array_equal(a, b), f"{where}: result #{i} differs"
            continue
        assert np.array_equal(np.isnan(a), np.isnan(b)), f"{where}: NaN positions of #{i} differ"
        assert np.array_equal(np.isposinf(a), np.isposinf(b)), f"{where}: +inf of #{i} differs"
        assert np.array_equal(np.isneginf(a), np.isneginf(b)), f"{where}: -inf of #{i} differs"
        finite = np.isfinite(b)
        err = np.abs(a[finite] - b[finite])
        bound = rel * scale + rel * np.abs(b[finite])
        assert np.all(err <= bound), (
            f"{where}: result #{i} differs by up to {err.max()} (bound {bound.min()})\n"
            f"before: {b!r}\nafter:  {a!r}"
        )


def run_pipeline(text: str, pipeline: str):
    module = parse_module(text, "case.tg")
    PassManager(parse_pipeline(pipeline)).run(module)
    verify(module)
    return module


@settings(
    max_examples=400,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases())
def test_passes_keep_results(case: Case):
    note(f"input seed {case.seed}; replay: save the text below and run tgc-opt -p <pipeline>")
    original = parse_module(case.text, "case.tg")
    func = original.funcs[0]
    inputs = random_inputs(func, case.seed)
    with np.errstate(all="ignore"):
        before = run_function(func, inputs, "f64")
        scale = intermediate_scale(func, inputs)
    rel = 1e-9 if case.element_type == "f64" else 1e-5
    ops_before = sum(1 for _ in func.walk())
    for pipeline in PIPELINES:
        module = run_pipeline(case.text, pipeline)
        after_func = module.funcs[0]
        with np.errstate(all="ignore"):
            after = run_function(after_func, inputs, "f64")
        assert_same(before, after, scale, rel, f"after {pipeline}")
        if pipeline in ("cse", "dce"):
            assert sum(1 for _ in after_func.walk()) <= ops_before


# -- contracts random graphs of atomic ops cannot show ---------------------------------------------


class EffectOp(Operation):
    """A side-effecting op (not registered): neither CSE nor DCE may touch it."""

    name = "test.effect"
    operand_defs = (Operand("x"),)
    traits = frozenset()

    def infer(self):
        return [self.operands[0].type]


def _with_effects():
    fb = FunctionBuilder("f", [tensor("4xf32")], ["x"])
    x = fb.args[0]
    for _ in range(2):
        fb.insert(EffectOp([x], [x.type]))
    return fb.ret(fb.atomic.exp(x))


def test_cse_and_dce_keep_ops_without_the_pure_trait():
    for pipeline in ("cse", "dce", "canonicalize"):
        module = _with_effects()
        PassManager(parse_pipeline(pipeline)).run(module)
        names = [op.name for op in module.funcs[0].body.ops]
        assert names.count("test.effect") == 2, pipeline


def test_every_pass_is_registered_under_its_name():
    from tgc.pass_manager import PASSES

    for name in ("canonicalize", "cse", "dce"):
        assert PASSES[name].name == name
        assert PASSES[name].__doc__ and "Contract" in PASSES[name].__doc__


# -- speed: linear time ----------------------------------------------------------------------------


def count_calls(work) -> int:
    """The number of Python function calls `work()` makes: a deterministic measure of work."""
    profiler = cProfile.Profile()
    profiler.runcall(work)
    return pstats.Stats(profiler).total_calls


def long_chain(n_ops: int):
    """A function of about `n_ops` ops: a residual chain with redundancies every few ops."""
    fb = FunctionBuilder("big", [tensor("8x16xf32"), tensor("16xf32")], ["x", "b"])
    x, b = fb.args
    a = fb.atomic
    one = a.constant(value=DenseAttr.splat(1.0, tensor("f32")), result_type=tensor("f32"))
    h = x
    while len(fb.func.body) < n_ops:
        t = a.mul(a.add(h, b), one)  # (h+b)*1
        u = a.neg(a.neg(a.exp(t)))  # --exp(t)
        v = a.add(b, h)  # commuted duplicate of h+b
        h = a.add(a.add(u, a.mul(v, one)), h)
    return fb.ret(h)


@pytest.mark.parametrize("n_ops", [1_000, 2_000])
def test_passes_run_in_linear_time(n_ops):
    """Work per op must not grow with the module: Python function calls are counted (not
    seconds, which a loaded CI machine would make flaky); quadratic behaviour would show 4x."""
    per_op = []
    for n in (n_ops, 4 * n_ops):
        module = long_chain(n)
        pm = PassManager(parse_pipeline("canonicalize,cse,dce"))
        per_op.append(count_calls(lambda: pm.run(module)) / n)
    assert per_op[1] < 1.5 * per_op[0], per_op

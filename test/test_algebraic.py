"""The `algebraic` pass: every rule and random combinations keep float64 results; the cost model.

- Rule verification (TASO-style random testing): random graphs built so that each rule has
  places to apply; every match the rule finds is applied alone to a copy, which must verify and
  compute the same results as the original in float64 (relative tolerance 1e-9).
- Differential testing of the whole pass: random graphs mixing all the patterns (shared
  operands, broadcasting, transpose flags, batch dims, reused values) run through the pass with
  varied options (alpha, budget, window, cost weights); results must agree (1e-9) and the
  model's cost must not grow.
- The cost model's numbers on small graphs computed by hand, the chain DP against brute
  force, locations, and the speed on GPT-2-like graphs.
"""

from __future__ import annotations

import cProfile
import itertools
import pstats

import numpy as np
import pytest

import tgc.dialects  # noqa: F401  (registers the ops)
from tgc.attributes import DenseAttr, FunctionTypeAttr
from tgc.builder import FunctionBuilder, tensor
from tgc.builtin import PARAM_ATTR, FuncOp
from tgc.parser import parse_module
from tgc.pass_manager import PassManager, PipelineError, parse_pipeline
from tgc.passes.algebraic.cost import (
    IN_PLACE_ATTR,
    Cost,
    CostWeights,
    is_fixed,
    is_result,
    op_cost,
    ops_cost,
    ops_seconds,
)
from tgc.passes.algebraic.graph import UndoRewriter, clone_func, extract_window, fingerprint
from tgc.passes.algebraic.rules import RULE_NAMES, RULES, _best_tree, _chain, _tree_cost
from tgc.passes.algebraic.search import apply_move, find_moves, replay, search
from tgc.printer import print_op
from tgc.rewriter import Rewriter
from tgc.runtime.interpreter import run_function
from tgc.types import TensorType
from tgc.verifier import verify

RTOL = 1e-9  # float64; reassociation and distribution only change rounding
WEIGHTS = CostWeights()


# -- random graphs ---------------------------------------------------------------------------------


class RandomGraph:
    """Builds a random function from templates, each a place where some rule applies.

    Operands are fresh arguments or, half of the time, earlier values of the right shape, so
    templates interact (a chain factor may be a merged projection, a sum may feed a chain).
    """

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.fb = FunctionBuilder("random", [])
        self.values = []

    def dim(self) -> int:
        return int(self.rng.choice([1, 2, 3, 4, 5, 6]))

    def arg(self, shape) -> object:
        return self.fb.func.body.add_arg(TensorType.get(tuple(shape), "f64"))

    def operand(self, shape):
        shape = tuple(shape)
        pool = [v for v in self.values + list(self.fb.func.body.args) if v.type.shape == shape]
        if pool and self.rng.random() < 0.5:
            return pool[int(self.rng.integers(len(pool)))]
        return self.arg(shape)

    def stored(self, batch, rows, cols):
        """A matrix operand meaning rows x cols, stored transposed half of the time."""
        flag = bool(self.rng.random() < 0.5)
        shape = tuple(batch) + ((cols, rows) if flag else (rows, cols))
        return self.operand(shape), flag

    def batch(self):
        return tuple(self.dim() for _ in range(int(self.rng.choice([0, 0, 0, 1]))))

    def matmul(self, a, b):
        (x, tx), (y, ty) = a, b
        return self.fb.atomic.matmul(x, y, transpose_a=tx or None, transpose_b=ty or None)

    def keep(self, v):
        self.values.append(v)
        return v

    # templates

    def distribute_matmul(self):
        m, k, n = self.dim(), self.dim(), self.dim()
        batch = self.batch()
        shared = self.stored(batch, m, k)
        b = self.stored((), k, n)
        c = self.stored(self.batch() if not batch else (), k, 1 if self.rng.random() < 0.2 else n)
        if self.rng.random() < 0.5:  # shared on the right: transpose the picture
            shared = self.stored(batch, k, m)
            b, c = self.stored((), n, k), self.stored((), n, k)
            left, right = self.matmul(b, shared), self.matmul(c, shared)
        else:
            left, right = self.matmul(shared, b), self.matmul(shared, c)
        op = "add" if self.rng.random() < 0.7 else "sub"
        return self.keep(getattr(self.fb.atomic, op)(left, right))

    def distribute_mul(self):
        shape = (self.dim(), self.dim())
        x = self.operand(shape)
        a = self.operand(shape if self.rng.random() < 0.5 else (shape[1],))
        b = self.operand(shape if self.rng.random() < 0.5 else (shape[0], 1))
        xa = self.fb.atomic.mul(x, a) if self.rng.random() < 0.5 else self.fb.atomic.mul(a, x)
        xb = self.fb.atomic.mul(b, x) if self.rng.random() < 0.5 else self.fb.atomic.mul(x, b)
        op = "add" if self.rng.random() < 0.7 else "sub"
        return self.keep(getattr(self.fb.atomic, op)(xa, xb))

    def chain(self):
        n = int(self.rng.integers(3, 6))
        dims = [self.dim() for _ in range(n + 1)]
        factors = [self.stored((), dims[i], dims[i + 1]) for i in range(n)]

        def build(lo, hi):  # a random parenthesisation of factors[lo:hi]
            if hi - lo == 1:
                return factors[lo]
            cut = int(self.rng.integers(lo + 1, hi))
            return self.matmul(build(lo, cut), build(cut, hi)), False

        return self.keep(build(0, n)[0])

    def merge(self):
        batch = self.batch()
        k, m = self.dim(), self.dim()
        side = int(self.rng.integers(2))
        tx, tw = bool(self.rng.random() < 0.3), bool(self.rng.random() < 0.3)
        x = self.operand(batch + ((k, m) if tx == (side == 0) else (m, k)))
        outs = []
        for _ in range(int(self.rng.integers(2, 5))):
            n = self.dim()
            if side == 0:
                w = self.operand((n, k) if tw else (k, n))
                outs.append(self.matmul((x, tx), (w, tw)))
            else:
                w = self.operand((k, n) if tw else (n, k))
                outs.append(self.matmul((w, tw), (x, tx)))
        # Most products are read in place (by an exp), the rest returned: a returned piece of a
        # merge's split is copied out (cost.py), so those merge less often.
        for v in outs:
            self.keep(self.fb.atomic.exp(v) if self.rng.random() < 0.75 else v)
        return outs[0]

    def stack(self):
        """X@W1, .., X@Wn with one weight shape and X a matrix, some products returned: the
        stack rule's case (a batched matmul whose pieces are contiguous)."""
        k, m, n = self.dim(), self.dim(), self.dim()
        tx, tw = bool(self.rng.random() < 0.3), bool(self.rng.random() < 0.3)
        x = self.operand((k, m) if tx else (m, k))
        outs = [
            self.matmul((x, tx), (self.operand((n, k) if tw else (k, n)), tw))
            for _ in range(int(self.rng.integers(2, 5)))
        ]
        for i, v in enumerate(outs):
            self.keep(v if i == 0 or self.rng.random() < 0.5 else self.fb.atomic.exp(v))
        return outs[0]

    def transposes(self):
        m, k, n = self.dim(), self.dim(), self.dim()
        a, b = self.stored((), m, k), self.stored((), k, n)
        if self.rng.random() < 0.5:
            return self.keep(self.fb.atomic.transpose(self.matmul(a, b), perm=(1, 0)))
        at = self.fb.atomic.transpose(self.operand((k, m)), perm=(1, 0))
        return self.keep(self.matmul((at, False), b))

    def power(self):
        """x@W@W...: matmuls sharing W where one's result feeds the next (no merge possible)."""
        n = self.dim()
        w = self.stored((), n, n)
        x = self.stored(self.batch(), self.dim(), n)
        for _ in range(int(self.rng.integers(2, 4))):
            x = self.keep(self.matmul(x, w)), False
        return x[0]

    TEMPLATES = (
        "distribute_matmul",
        "distribute_mul",
        "chain",
        "merge",
        "stack",
        "transposes",
        "power",
    )

    def build(self, templates, count: int) -> FuncOp:
        for _ in range(count):
            getattr(self, templates[int(self.rng.integers(len(templates)))])()
        results = [v for v in self.values if not v.uses] or self.values[-1:]
        args = tuple(a.type for a in self.fb.func.body.args)
        self.fb.func.attributes["function_type"] = FunctionTypeAttr(args, ())
        return self.fb.ret(*results).funcs[0]


def random_inputs(func: FuncOp, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(a.type.shape) for a in func.body.args]


def mark_params(func: FuncOp, seed: int) -> FuncOp:
    """Mark about half of the arguments `{tgc.param}` (fixed: their products cost nothing)."""
    rng = np.random.default_rng(seed)
    for i in range(len(func.body.args)):
        if rng.random() < 0.5:
            func.set_arg_attr(i, PARAM_ATTR)
    return func


def assert_same(expected, got) -> None:
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        assert e.shape == g.shape
        scale = max(1.0, float(np.max(np.abs(e))) if e.size else 1.0)
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=RTOL * scale)


# -- every rule, every match, alone ----------------------------------------------------------------

RULE_TEMPLATES = {
    "distribute-matmul-left": ("distribute_matmul",),
    "distribute-matmul-right": ("distribute_matmul",),
    "distribute-mul": ("distribute_mul",),
    "reorder-matmul-chain": ("chain",),
    "reassociate-matmul": ("chain", "power"),
    "merge-shared-matmuls": ("merge", "power"),
    "stack-shared-matmuls": ("stack",),
    "transpose-of-matmul": ("transposes",),
    "matmul-of-transpose": ("transposes", "chain"),
}


def test_every_rule_has_templates():
    assert set(RULE_TEMPLATES) == set(RULE_NAMES)
    assert len(set(RULE_NAMES)) == len(RULE_NAMES)


@pytest.mark.parametrize("rule", RULES, ids=RULE_NAMES)
def test_rule_preserves_results(rule):
    applied = 0
    for seed in range(80):  # graphs made for the rule, then graphs mixing every template
        templates = RULE_TEMPLATES[rule.name] if seed < 40 else RandomGraph.TEMPLATES
        func = RandomGraph(seed).build(templates, 4 if seed < 40 else 8)
        inputs = random_inputs(func, seed)
        expected = run_function(func, inputs, "f64")
        for move in find_moves(func, (rule,), WEIGHTS):
            copy = clone_func(func)
            apply_move(move, list(copy.body.ops), Rewriter())
            verify(copy)
            assert fingerprint(copy) != fingerprint(func), f"{rule.name} changed nothing"
            assert_same(expected, run_function(copy, inputs, "f64"))
            applied += 1
    assert applied >= 20, f"{rule.name} applied only {applied} times"


def test_wrong_rule_is_caught():
    """The check above rejects a rule that is wrong: A@B + A@C -> A@(B-C)."""
    src = """
    func.func @f(%a: tensor<3x4xf64>, %b: tensor<4x5xf64>, %c: tensor<4x5xf64>) -> tensor<3x5xf64> {
      %0 = atomic.matmul %a, %b : (tensor<3x4xf64>, tensor<4x5xf64>) -> tensor<3x5xf64>
      %1 = atomic.matmul %a, %c : (tensor<3x4xf64>, tensor<4x5xf64>) -> tensor<3x5xf64>
      %2 = atomic.add %0, %1 : (tensor<3x5xf64>, tensor<3x5xf64>) -> tensor<3x5xf64>
      func.return %2 : tensor<3x5xf64>
    }
    """
    func = parse_module(src).funcs[0]
    inputs = random_inputs(func, 0)
    expected = run_function(func, inputs, "f64")
    (move,) = find_moves(func, (RULES[0],), WEIGHTS)
    copy = clone_func(func)
    ops = list(copy.body.ops)
    add, m1, m2 = (ops[i] for i in move.indices)
    b = Rewriter().builder_before(add)
    wrong = b.atomic.matmul(m1.operands[0], b.atomic.sub(m1.operands[1], m2.operands[1]))
    Rewriter().replace_op(add, wrong)
    with pytest.raises(AssertionError):
        assert_same(expected, run_function(copy, inputs, "f64"))


# -- the whole pass on random combinations ---------------------------------------------------------

OPTIONS = [
    "",
    "{alpha=1.0}",
    "{alpha=1.5 budget=16}",
    "{budget=1}",
    "{window=3}",
    "{window=8 alpha=1.2}",
    "{launch-cost=0}",
    "{flop-cost=1e-9 launch-cost=0 byte-cost=0}",
    "{byte-cost=1e-9}",
]


def check_pass_keeps_results_and_cost(func, seed: int) -> None:
    """`algebraic` (options chosen by `seed`) leaves `func`'s float64 results as they were and
    never raises its modelled cost."""
    inputs = random_inputs(func, seed)
    expected = run_function(func, inputs, "f64")
    options = OPTIONS[seed % len(OPTIONS)]
    weights = parse_pipeline(f"algebraic{options}")[0]
    w = CostWeights(weights.flop_cost, weights.byte_cost, weights.launch_cost)
    before = ops_seconds(func.body.ops, w)
    PassManager.from_text(f"algebraic{options}").run(func.parent_op)
    assert_same(expected, run_function(func, inputs, "f64"))
    assert ops_seconds(func.body.ops, w) <= before * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(60))
def test_pass_preserves_results(seed):
    graph = RandomGraph(1000 + seed)
    func = graph.build(RandomGraph.TEMPLATES, int(graph.rng.integers(2, 9)))
    check_pass_keeps_results_and_cost(func, seed)


@pytest.mark.parametrize("seed", range(30))
def test_pass_with_params_preserves_results(seed):
    """With some arguments fixed, a rewrite may make an op free (it reads fixed values only):
    results stay the same and the modelled cost still never grows."""
    graph = RandomGraph(2000 + seed)
    func = mark_params(graph.build(RandomGraph.TEMPLATES, int(graph.rng.integers(2, 9))), seed)
    check_pass_keeps_results_and_cost(func, seed)


def test_random_graphs_do_get_rewritten():
    """The differential test above is not vacuous: the pass rewrites most random graphs."""
    counts = {}
    for seed in range(30):
        graph = RandomGraph(1000 + seed)
        func = graph.build(RandomGraph.TEMPLATES, int(graph.rng.integers(2, 9)))
        pm = PassManager.from_text("algebraic")
        pm.run(func.parent_op)
        for key, n in pm.statistics[0][1].counters.items():
            counts[key] = counts.get(key, 0) + n
    assert sum(counts.values()) >= 30
    assert {"distribute-matmul-left", "merge-shared-matmuls", "reorder-matmul-chain"} <= set(counts)


def test_pass_is_deterministic():
    texts = set()
    for _ in range(2):
        func = RandomGraph(7).build(RandomGraph.TEMPLATES, 8)
        PassManager.from_text("algebraic").run(func.parent_op)
        texts.add(print_op(func))
    assert len(texts) == 1


# -- the cost model --------------------------------------------------------------------------------


def _func(src: str) -> FuncOp:
    return parse_module(src).funcs[0]


def test_cost_of_matmul():
    func = _func("""
    func.func @f(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
      %0 = atomic.matmul %a, %b : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
      func.return %0 : tensor<2x4xf32>
    }""")
    cost = ops_cost(func.body.ops)
    assert cost == Cost(flops=2 * 2 * 3 * 4, bytes=(6 + 12 + 8) * 4, launches=1)
    # a roofline plus a launch: the longer of arithmetic and memory traffic, not their sum
    assert cost.seconds(WEIGHTS) == pytest.approx(max(48 * 2e-14, 104 * 3.3e-13) + 3e-6)
    assert cost.seconds(CostWeights(1.0, 0.0, 0.0)) == 48
    assert cost.seconds(CostWeights(1.0, 1.0, 0.0)) == 104


def test_cost_of_batched_transposed_matmul():
    func = _func("""
    func.func @f(%a: tensor<5x1x3x2xf16>, %b: tensor<7x4x3xf16>) -> tensor<5x7x2x4xf16> {
      %0 = atomic.matmul %a, %b {transpose_a = true, transpose_b = true} : (tensor<5x1x3x2xf16>, tensor<7x4x3xf16>) -> tensor<5x7x2x4xf16>
      func.return %0 : tensor<5x7x2x4xf16>
    }""")
    assert ops_cost(func.body.ops) == Cost(
        flops=2 * 35 * 2 * 3 * 4, bytes=(30 + 84 + 280) * 2, launches=1
    )


def test_cost_of_elementwise_reduce_views_and_concat():
    func = _func("""
    func.func @f(%x: tensor<4x8xf32>, %s: tensor<f32>, %w: tensor<8x2xf32>) -> (tensor<4x8xf32>, tensor<4xf32>, tensor<32xf32>, tensor<8x4xf32>, tensor<8x2xf32>, tensor<8x4xf32>, tensor<2x8xf32>) {
      %0 = atomic.mul %x, %s : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
      %1 = atomic.reduce_sum %x {axes = [1]} : (tensor<4x8xf32>) -> tensor<4xf32>
      %2 = atomic.reshape %x : (tensor<4x8xf32>) -> tensor<32xf32>
      %3 = atomic.concat %w, %w {axis = 1} : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x4xf32>
      %4, %5 = atomic.split %3 {axis = 1, sizes = [2, 2]} : (tensor<8x4xf32>) -> (tensor<8x2xf32>, tensor<8x2xf32>)
      %c = atomic.constant {value = dense<1.0> : tensor<8x2xf32>} : () -> tensor<8x2xf32>
      %6 = atomic.concat %c, %c {axis = 1} : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x4xf32>
      %7 = atomic.transpose %4 {perm = [1, 0]} : (tensor<8x2xf32>) -> tensor<2x8xf32>
      func.return %0, %1, %2, %3, %5, %6, %7 : tensor<4x8xf32>, tensor<4xf32>, tensor<32xf32>, tensor<8x4xf32>, tensor<8x2xf32>, tensor<8x4xf32>, tensor<2x8xf32>
    }""")
    costs = [op_cost(op) for op in func.body.ops]
    assert costs == [
        Cost(32, (32 + 1 + 32) * 4, 1),  # mul: one flop per result element
        Cost(32, (32 + 4) * 4, 1),  # reduce: one flop per input element
        Cost(),  # reshape: a view
        Cost(0, (16 + 16 + 32) * 4, 1),  # concat: moves bytes
        Cost(0, 2 * 16 * 4, 1),  # split: %4 read in place, %5 returned: copied out, read+write
        Cost(),  # constant
        Cost(),  # concat of constants: folded
        Cost(0, (16 + 16) * 4, 1),  # transpose
        Cost(),  # return
    ]


def test_fixed_values():
    """Fixed: `{tgc.param}` arguments and what pure ops compute from fixed values alone
    (constants and iotas read nothing, so they are fixed)."""
    func = _func("""
    func.func @f(%x: tensor<4x8xf32>, %w: tensor<8x8xf32> {tgc.param}, %s: tensor<f32>) -> (tensor<4x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x16xf32>, tensor<8x16xf32>) {
      %c = atomic.constant {value = dense<0.5> : tensor<f32>} : () -> tensor<f32>
      %i = atomic.iota {axis = 0} : () -> tensor<8x8xf32>
      %wc = atomic.mul %w, %c : (tensor<8x8xf32>, tensor<f32>) -> tensor<8x8xf32>
      %wi = atomic.add %wc, %i : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %ws = atomic.mul %w, %s : (tensor<8x8xf32>, tensor<f32>) -> tensor<8x8xf32>
      %xw = atomic.matmul %x, %wi : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
      %pw = atomic.concat %w, %wi {axis = 1} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
      %mix = atomic.concat %w, %ws {axis = 1} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x16xf32>
      func.return %xw, %wi, %ws, %pw, %mix : tensor<4x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x16xf32>, tensor<8x16xf32>
    }""")
    x, w, s = func.body.args
    named = {r.name_hint: r for op in func.body.ops for r in op.results}
    fixed = {name for name, v in named.items() if is_fixed(v)}
    assert fixed == {"c", "i", "wc", "wi", "pw"}
    assert is_fixed(w) and not is_fixed(x) and not is_fixed(s)
    costs = {op.results[0].name_hint: op_cost(op) for op in list(func.body.ops)[:-1]}
    assert {name for name, c in costs.items() if c == Cost()} == fixed
    assert costs["mix"] == Cost(0, (64 + 64 + 128) * 4, 1)  # a parameter and a plain value


def test_fixed_walk_is_iterative():
    """A chain far longer than Python's recursion limit is walked without recursing."""
    fb = FunctionBuilder("long", [tensor("4xf32"), tensor("4xf32")])
    fb.func.set_arg_attr(0, PARAM_ATTR)
    fixed, plain = fb.args
    for _ in range(5000):
        fixed, plain = fb.atomic.exp(fixed), fb.atomic.add(plain, fixed)
    assert is_fixed(fixed) and not is_fixed(plain)


def _qkv(param: str, returned: bool) -> str:
    """GPT-2's QKV projections (x 8192x1024, bf16), returned or read in place (multiplied)."""
    x, w = "tensor<8192x1024xbf16>", "tensor<1024x1024xbf16>"
    if returned:
        results, tail = f"({x}, {x}, {x})", f"func.return %q, %k, %v : {x}, {x}, {x}"
    else:
        results = x
        tail = f"""%qk = atomic.mul %q, %k : ({x}, {x}) -> {x}
          %y = atomic.mul %qk, %v : ({x}, {x}) -> {x}
          func.return %y : {x}"""
    return f"""
    func.func @qkv(%x: {x}, %wq: {w}{param}, %wk: {w}{param}, %wv: {w}{param}) -> {results} {{
      %q = atomic.matmul %x, %wq : ({x}, {w}) -> {x}
      %k = atomic.matmul %x, %wk : ({x}, {w}) -> {x}
      %v = atomic.matmul %x, %wv : ({x}, {w}) -> {x}
      {tail}
    }}"""


def _merges(text: str) -> tuple[int, float, float, FuncOp]:
    """(merges applied, modelled seconds before, after, the function) of `algebraic` on text."""
    module = parse_module(text)
    func = module.funcs[0]
    before = ops_seconds(func.body.ops, WEIGHTS)
    pm = PassManager.from_text("algebraic")
    pm.run(module)
    merged = pm.statistics[0][1].counters.get("merge-shared-matmuls", 0)
    return merged, before, ops_seconds(func.body.ops, WEIGHTS), func


def test_concat_of_params_makes_the_merge_pay():
    """GPT-2's QKV projections read in place: merged on parameter weights, left alone on plain
    ones, whose concat would cost more than the two launches the merge saves."""
    for param, merged in ((" {tgc.param}", 1), ("", 0)):
        count, before, after, func = _merges(_qkv(param, returned=False))
        assert count == merged
        launches = ops_cost(func.body.ops).launches
        if merged:  # the concat is free: one matmul and the two muls left, two launches saved
            assert launches == 3
            assert after == pytest.approx(before - 2 * 3e-6)
        else:
            assert launches == 5
            concat = 2 * 3 * 1024 * 1024 * 2  # read and write the three bf16 weights
            assert concat * 3.3e-13 + 3e-6 > 2 * 3e-6  # what merging would cost and save


def test_returned_products_stack_on_parameters_only():
    """Returned, the products never take the concat merge (each piece of its split would be
    copied out). On parameters they stack into one batched matmul whose pieces are contiguous,
    returned as views: the two launches saved, nothing copied. On plain weights the stack's
    concat costs more than those launches, so they stay three matmuls."""
    for param, stacked in ((" {tgc.param}", 1), ("", 0)):
        module = parse_module(_qkv(param, returned=True))
        func = module.funcs[0]
        before = ops_seconds(func.body.ops, WEIGHTS)
        pm = PassManager.from_text("algebraic")
        pm.run(module)
        counters = pm.statistics[0][1].counters
        assert counters.get("merge-shared-matmuls", 0) == 0
        assert counters.get("stack-shared-matmuls", 0) == stacked
        matmuls = [op for op in func.body.ops if op.name == "atomic.matmul"]
        assert len(matmuls) == (1 if stacked else 3)
        after = ops_seconds(func.body.ops, WEIGHTS)
        if stacked:
            assert matmuls[0].results[0].type.shape == (3, 8192, 1024)
            assert after == pytest.approx(before - 2 * 3e-6)
        else:
            assert after == before
    piece = 8192 * 1024 * 2
    assert 3 * (2 * piece * 3.3e-13 + 3e-6) > 2 * 3e-6  # why the concat merge never pays here
    concat = 2 * 3 * 1024 * 1024 * 2
    assert concat * 3.3e-13 + 3e-6 > 2 * 3e-6  # why plain weights do not stack


def test_split_prices_the_pieces_it_returns():
    """A split is free where its pieces are read in place, and costs a copy (read and write, a
    launch) per piece the function returns, directly or through views; a window's return does
    not count the values it lists in IN_PLACE_ATTR (the ops after the window read them)."""
    func = _func("""
    func.func @f(%x: tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<2x2x2xf32>, tensor<4x2xf32>) {
      %a, %b, %c, %d = atomic.split %x {axis = 1, sizes = [2, 2, 2, 2]} : (tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x2xf32>, tensor<4x2xf32>)
      %r = atomic.reshape %b : (tensor<4x2xf32>) -> tensor<2x2x2xf32>
      %e = atomic.exp %c : (tensor<4x2xf32>) -> tensor<4x2xf32>
      func.return %a, %r, %e : tensor<4x2xf32>, tensor<2x2x2xf32>, tensor<4x2xf32>
    }""")
    split = func.body.first
    a, b, c, d = split.results
    assert [is_result(v) for v in split.results] == [True, True, False, False]
    assert op_cost(split) == Cost(0, 2 * 2 * 8 * 4, 2)  # %a and %b (through the reshape)
    func.body.last.attributes[IN_PLACE_ATTR] = (0,)
    assert not is_result(a) and is_result(b)
    assert op_cost(split) == Cost(0, 2 * 8 * 4, 1)


def test_a_split_whose_pieces_are_contiguous_is_free_even_returned():
    """Pieces of a split along an axis with only 1s before it are contiguous ranges, which a
    plan returns as views: no copy is priced. Along a later axis they are copied."""
    func = _func("""
    func.func @f(%x: tensor<1x3x4xf32>) -> (tensor<1x1x4xf32>, tensor<1x2x4xf32>, tensor<1x3x2xf32>, tensor<1x3x2xf32>) {
      %a, %b = atomic.split %x {axis = 1, sizes = [1, 2]} : (tensor<1x3x4xf32>) -> (tensor<1x1x4xf32>, tensor<1x2x4xf32>)
      %c, %d = atomic.split %x {axis = 2, sizes = [2, 2]} : (tensor<1x3x4xf32>) -> (tensor<1x3x2xf32>, tensor<1x3x2xf32>)
      func.return %a, %b, %c, %d : tensor<1x1x4xf32>, tensor<1x2x4xf32>, tensor<1x3x2xf32>, tensor<1x3x2xf32>
    }""")
    along_rows, along_columns = list(func.body.ops)[:2]
    assert op_cost(along_rows) == Cost(0, 0, 0)
    assert op_cost(along_columns) == Cost(0, 2 * 2 * 3 * 2 * 4, 2)


def test_distributivity_saves_half_the_flops():
    src = """
    func.func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>, %c: tensor<128x256xf32>) -> tensor<64x256xf32> {
      %0 = atomic.matmul %a, %b : (tensor<64x128xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
      %1 = atomic.matmul %a, %c : (tensor<64x128xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
      %2 = atomic.add %0, %1 : (tensor<64x256xf32>, tensor<64x256xf32>) -> tensor<64x256xf32>
      func.return %2 : tensor<64x256xf32>
    }"""
    module = parse_module(src)
    before = ops_cost(module.funcs[0].body.ops)
    PassManager.from_text("algebraic").run(module)
    after = ops_cost(module.funcs[0].body.ops)
    mm = 2 * 64 * 128 * 256
    assert before == Cost(2 * mm + 64 * 256, (2 * (8192 + 32768 + 16384) + 3 * 16384) * 4, 3)
    assert after == Cost(mm + 128 * 256, (3 * 32768 + 8192 + 32768 + 16384) * 4, 2)


@pytest.mark.parametrize("seed", range(30))
def test_chain_dp_is_optimal(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    dims = [int(d) for d in rng.integers(1, 40, size=n + 1)]
    fb = FunctionBuilder("chain", [tensor(f"{dims[i]}x{dims[i + 1]}xf32") for i in range(n)])
    value = fb.args[0]
    for arg in fb.args[1:]:
        value = fb.atomic.matmul(value, arg)
    fb.ret(value)
    factors, tree, _ = _chain(value.defining_op, None)
    assert tree == _left_deep(n)
    w = CostWeights(float(rng.random()), float(rng.random()) * 1e-3, float(rng.random()) * 10)
    best_cost, best = _best_tree(factors, w, 4)
    brute = min(_tree_cost(t, factors, w, 4)[0] for t in _all_trees(0, n))
    assert best_cost == pytest.approx(brute)
    assert _tree_cost(best, factors, w, 4)[0] == pytest.approx(best_cost)


@pytest.mark.parametrize("params", [False, True], ids=["plain", "params"])
@pytest.mark.parametrize("seed", range(10))
def test_chain_pricing_agrees_with_the_cost_model(seed, params):
    """The chain DP prices each product exactly as op_cost prices the matmul it becomes (a
    product of fixed values at nothing)."""
    rng = np.random.default_rng(seed)
    func = RandomGraph(seed).build(("chain", "power"), 3)
    if params:
        func = mark_params(func, seed)
    for op in func.body.ops:
        if op.name != "atomic.matmul":
            continue
        w = CostWeights(float(rng.random()), float(rng.random()), float(rng.random()))
        factors, tree, interior = _chain(op, frozenset((op,)))
        assert (tree, interior) == ((0, 1), [op])
        nbytes = op.results[0].type.nbytes // op.results[0].type.num_elements
        assert _tree_cost(tree, factors, w, nbytes)[0] == pytest.approx(op_cost(op).seconds(w))


def _left_deep(n):
    tree = 0
    for i in range(1, n):
        tree = (tree, i)
    return tree


def _all_trees(lo, hi):
    if hi - lo == 1:
        yield lo
        return
    for cut in range(lo + 1, hi):
        yield from itertools.product(_all_trees(lo, cut), list(_all_trees(cut, hi)))


# -- mechanics -------------------------------------------------------------------------------------


def test_clone_and_window_keep_structure():
    func = RandomGraph(3).build(RandomGraph.TEMPLATES, 6)
    copy = clone_func(func)
    assert print_op(copy) == print_op(func)
    assert fingerprint(copy) == fingerprint(func)
    ops = list(func.body.ops)[:-1]
    window = extract_window(ops[2:5])
    verify(window)
    assert [op.name for op in window.body.ops][:-1] == [op.name for op in ops[2:5]]


def _uses(func: FuncOp) -> list:
    values = list(func.body.args) + [r for op in func.body.ops for r in op.results]
    return [[(ops_index, i) for ops_index, i in v.uses] for v in values]


@pytest.mark.parametrize("params", [False, True], ids=["plain", "params"])
@pytest.mark.parametrize("seed", range(10))
def test_undo_restores_the_graph_exactly(seed, params):
    """Also: a move's cost is the cost of the ops it adds minus those it erases, with parameters
    too (no rewrite changes whether the values it leaves in place are fixed)."""
    func = RandomGraph(seed).build(RandomGraph.TEMPLATES, 8)
    if params:
        func = mark_params(func, seed)
    text, uses = print_op(func), _uses(func)
    rewriter = UndoRewriter()
    ops = list(func.body.ops)
    for move in find_moves(func, RULES, WEIGHTS):
        before = ops_seconds(func.body.ops, WEIGHTS)
        mark = len(rewriter.log)
        apply_move(move, ops, rewriter)
        inserted, erased = rewriter.changes_since(mark)
        delta = ops_seconds(inserted, WEIGHTS) - ops_seconds(erased, WEIGHTS)
        after = ops_seconds(func.body.ops, WEIGHTS)
        assert delta == pytest.approx(after - before, abs=1e-15)
        verify(func)
        rewriter.undo(mark)
        assert print_op(func) == text
        assert _uses(func) == uses


@pytest.mark.parametrize("params", [False, True], ids=["plain", "params"])
def test_search_costs_match_the_replayed_graph(params):
    for seed in range(20):
        func = RandomGraph(seed).build(RandomGraph.TEMPLATES, 6)
        if params:
            func = mark_params(func, seed)
        window = extract_window(list(func.body.ops)[:-1])
        result = search(window, RULES, WEIGHTS, 1.05, 32)
        assert ops_seconds(window.body.ops, WEIGHTS) == pytest.approx(result.cost_before)
        replay(result.moves, window.body, None, window.body.last, Rewriter())
        verify(window)
        assert ops_seconds(window.body.ops, WEIGHTS) == pytest.approx(result.cost_after)
        assert result.cost_after <= result.cost_before


def test_rewrites_keep_the_replaced_location():
    src = """func.func @f(%a: tensor<64x128xf32>, %b: tensor<128x256xf32>, %c: tensor<128x256xf32>) -> tensor<64x256xf32> {
  %0 = atomic.matmul %a, %b : (tensor<64x128xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
  %1 = atomic.matmul %a, %c : (tensor<64x128xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
  %2 = atomic.add %0, %1 : (tensor<64x256xf32>, tensor<64x256xf32>) -> tensor<64x256xf32>
  func.return %2 : tensor<64x256xf32>
}"""
    module = parse_module(src, "dist.tg")
    PassManager.from_text("algebraic").run(module)
    add, mm, _ = list(module.funcs[0].body.ops)
    assert (add.name, mm.name) == ("atomic.add", "atomic.matmul")
    assert (add.loc.line, mm.loc.line) == (4, 4)


def test_bad_options_are_usage_errors():
    with pytest.raises(PipelineError, match="no rule 'nope'"):
        parse_pipeline("algebraic{rules=nope}")
    with pytest.raises(PipelineError, match="alpha >= 1"):
        parse_pipeline("algebraic{alpha=0.9}")


# -- speed -----------------------------------------------------------------------------------------


def gpt2_like(blocks: int, tokens: int = 16, width: int = 64, heads: int = 4):
    """A GPT-2-like stack in atomic ops with separate Q/K/V weights."""
    head = width // heads
    per_block = [(width, width)] * 3 + [
        (width,),
        (width, width),
        (width, 4 * width),
        (4 * width, width),
        (width,),
    ]
    arg_types = [tensor(f"{tokens}x{width}xf32")]
    for _ in range(blocks):
        arg_types += [TensorType.get(s, "f32") for s in per_block]
    fb = FunctionBuilder("gpt", arg_types)
    b = fb.atomic
    x, params = fb.args[0], fb.args[1:]
    scale = b.constant(value=DenseAttr.splat(0.125, tensor("f32")), result_type=tensor("f32"))

    def heads_of(t):
        t = b.reshape(t, result_type=tensor(f"{tokens}x{heads}x{head}xf32"))
        return b.transpose(t, perm=(1, 0, 2))

    for i in range(blocks):
        wq, wk, wv, bq, wo, w1, w2, g = params[8 * i : 8 * i + 8]
        h = b.mul(b.sub(x, b.reduce_sum(x, axes=(1,), keepdims=True)), g)
        q = heads_of(b.add(b.matmul(h, wq), bq))
        k, v = heads_of(b.matmul(h, wk)), heads_of(b.matmul(h, wv))
        s = b.mul(b.matmul(q, k, transpose_b=True), scale)
        e = b.exp(b.sub(s, b.reduce_max(s, axes=(2,), keepdims=True)))
        p = b.div(e, b.reduce_sum(e, axes=(2,), keepdims=True))
        o = b.transpose(b.matmul(p, v), perm=(1, 0, 2))
        o = b.reshape(o, result_type=tensor(f"{tokens}x{width}xf32"))
        x = b.add(x, b.matmul(o, wo))
        f = b.matmul(x, w1)
        x = b.add(x, b.matmul(b.mul(f, b.exp(f)), w2))
    return fb.ret(x)


def test_gpt2_like_block_keeps_results():
    module = gpt2_like(2)
    func = module.funcs[0]
    inputs = [0.1 * a for a in random_inputs(func, 0)]
    expected = run_function(func, inputs, "f64")
    pm = PassManager.from_text("algebraic{window=16}")
    pm.run(module)
    assert pm.statistics[0][1].counters["merge-shared-matmuls"] == 2
    assert_same(expected, run_function(func, inputs, "f64"))


def test_work_is_about_linear():
    """48 GPT-2-like blocks take about four times the work of 12: Python function calls are
    counted (not seconds, which a loaded CI machine would make flaky)."""

    def calls(blocks):
        module = gpt2_like(blocks)
        pm = PassManager.from_text("algebraic")
        profiler = cProfile.Profile()
        profiler.runcall(pm.run, module)
        assert pm.statistics[0][1].counters["merge-shared-matmuls"] == blocks
        return pstats.Stats(profiler).total_calls

    small, large = calls(12), calls(48)
    assert large / small < 5, f"12 blocks: {small} calls, 48 blocks: {large} calls"


# -- crashes found -------------------------------------------------------------------------------

DEAD_SHARERS = """\
func.func @g(%a0: tensor<2x1xf64>, %a1: tensor<1xf64>, %w: tensor<1x1xf64>) -> tensor<2x1xf64> {
  %0 = atomic.neg %a0 : (tensor<2x1xf64>) -> tensor<2x1xf64>
  %1 = atomic.neg %0 : (tensor<2x1xf64>) -> tensor<2x1xf64>
  %2 = atomic.neg %a0 : (tensor<2x1xf64>) -> tensor<2x1xf64>
  %3 = hl.linear %a0, %w : (tensor<2x1xf64>, tensor<1x1xf64>) -> tensor<2x1xf64>
  %4 = atomic.add %a0, %a0 : (tensor<2x1xf64>, tensor<2x1xf64>) -> tensor<2x1xf64>
  %5 = atomic.add %a0, %1 : (tensor<2x1xf64>, tensor<2x1xf64>) -> tensor<2x1xf64>
  %6 = atomic.neg %a0 : (tensor<2x1xf64>) -> tensor<2x1xf64>
  %7 = hl.linear %2, %w : (tensor<2x1xf64>, tensor<1x1xf64>) -> tensor<2x1xf64>
  %8 = hl.linear %a0, %w : (tensor<2x1xf64>, tensor<1x1xf64>) -> tensor<2x1xf64>
  func.return %8 : tensor<2x1xf64>
}
"""


def test_dead_matmuls_sharing_a_weight_are_not_merged(tmp_path, capsys):
    """Issue 27: two dead matmuls (%3, %7) and a live one (%8) share %w; the merge offered the
    dead pair alone, whose anchor (first user) is None: `internal error: KeyError: None`."""
    from tgc.tools.opt import main

    src = tmp_path / "dead.tg"
    src.write_text(DEAD_SHARERS)
    assert main([str(src), "-p", "lower-hl,algebraic"]) == 0
    assert "error" not in capsys.readouterr().err
    module = parse_module(DEAD_SHARERS, "dead.tg")
    func = module.funcs[0]
    rng = np.random.default_rng()
    inputs = [rng.standard_normal(a.type.shape) for a in func.args]
    (want,) = run_function(func, inputs, "f64")
    PassManager.from_text("lower-hl,algebraic").run(module)
    (got,) = run_function(module.funcs[0], inputs, "f64")
    np.testing.assert_allclose(got, want, rtol=RTOL)
    # no move reads the dead matmuls (they are dce's)
    ops = list(module.funcs[0].body.ops)
    dead = {i for i, op in enumerate(ops) if op.name == "atomic.matmul" and not op.results[0].uses}
    assert len(dead) == 2
    assert not any(dead & set(m.indices) for m in find_moves(module.funcs[0], RULES, WEIGHTS))


# -- infinities and NaN: the inexact rules run only under fast-math --------------------------------

INEXACT = {
    # rule: (function, inputs where the rewritten function gives ±inf for the original's NaN)
    "distribute-mul": (
        """func.func @f(%x: tensor<3xf64>, %a: tensor<3xf64>, %b: tensor<3xf64>) -> tensor<3xf64> {
  %0 = atomic.mul %x, %a : (tensor<3xf64>, tensor<3xf64>) -> tensor<3xf64>
  %1 = atomic.mul %x, %b : (tensor<3xf64>, tensor<3xf64>) -> tensor<3xf64>
  %2 = atomic.add %0, %1 : (tensor<3xf64>, tensor<3xf64>) -> tensor<3xf64>
  func.return %2 : tensor<3xf64>
}""",
        [[-np.inf, 1.0, 2.0], [2.0, 1.0, 3.0], [-1.0, 1.0, 4.0]],
    ),
    "distribute-matmul-left": (
        """func.func @f(%a: tensor<1x1xf64>, %b: tensor<1x8xf64>, %c: tensor<1x8xf64>) -> tensor<1x8xf64> {
  %0 = atomic.matmul %a, %b : (tensor<1x1xf64>, tensor<1x8xf64>) -> tensor<1x8xf64>
  %1 = atomic.matmul %a, %c : (tensor<1x1xf64>, tensor<1x8xf64>) -> tensor<1x8xf64>
  %2 = atomic.add %0, %1 : (tensor<1x8xf64>, tensor<1x8xf64>) -> tensor<1x8xf64>
  func.return %2 : tensor<1x8xf64>
}""",
        [[[-np.inf]], [[2.0] * 8], [[-1.0] * 8]],
    ),
    "reorder-matmul-chain": (
        """func.func @f(%a: tensor<64x1xf64>, %b: tensor<1x2xf64>, %c: tensor<2x1xf64>) -> tensor<64x1xf64> {
  %0 = atomic.matmul %a, %b : (tensor<64x1xf64>, tensor<1x2xf64>) -> tensor<64x2xf64>
  %1 = atomic.matmul %0, %c : (tensor<64x2xf64>, tensor<2x1xf64>) -> tensor<64x1xf64>
  func.return %1 : tensor<64x1xf64>
}""",
        [[[np.inf]] * 64, [[2.0, 1.0]], [[1.0], [-1.0]]],
    ),
}


@pytest.mark.parametrize("rule", sorted(INEXACT))
def test_inexact_rules_need_fast_math(rule):
    """Issue 23, item 9: distributing and reassociating turn a NaN into ±inf on inf inputs
    (x = -inf, a = 2, b = -1: x*a + x*b is NaN, x*(a+b) is -inf). They are marked inexact and
    run only under fast-math (the pass's default, documented); with fast-math=false the pass
    leaves the function alone and the results stay bit for bit."""
    assert not {r.name: r for r in RULES}[rule].exact
    text, raw = INEXACT[rule]
    inputs = [np.array(x, dtype=np.float64) for x in raw]
    (want,) = run_function(parse_module(text, "f.tg").funcs[0], inputs, "f64")
    assert np.isnan(want).any()

    strict = parse_module(text, "f.tg")
    PassManager.from_text("algebraic{fast-math=false}").run(strict)
    assert print_op(strict) == print_op(parse_module(text, "f.tg"))
    (got,) = run_function(strict.funcs[0], inputs, "f64")
    np.testing.assert_array_equal(got, want)  # NaN where NaN

    fast = parse_module(text, "f.tg")
    stats = PassManager.from_text("algebraic", pass_statistics=True)
    stats.run(fast)
    (changed,) = run_function(fast.funcs[0], inputs, "f64")
    assert print_op(fast) != print_op(parse_module(text, "f.tg")), "the rule did not fire"
    assert np.isinf(changed[np.isnan(want)]).any()  # the documented difference
    finite = [np.random.default_rng().standard_normal(x.shape) for x in inputs]
    (a,) = run_function(parse_module(text, "f.tg").funcs[0], finite, "f64")
    (b,) = run_function(fast.funcs[0], finite, "f64")
    np.testing.assert_allclose(b, a, rtol=RTOL, atol=1e-12)  # exact up to rounding otherwise


@pytest.mark.parametrize("seed", range(20))
def test_without_fast_math_results_are_bit_exact_on_inf_and_nan(seed):
    """Random graphs with inf, -inf and NaN planted in their inputs: algebraic{fast-math=false}
    keeps every result bit for bit (NaN where NaN, the same infinities)."""
    graph = RandomGraph(3000 + seed)
    func = graph.build(RandomGraph.TEMPLATES, int(graph.rng.integers(2, 9)))
    rng = np.random.default_rng(seed)
    inputs = random_inputs(func, seed)
    for x in inputs:
        flat = x.reshape(-1)
        picks = rng.integers(0, flat.size, max(1, flat.size // 8))
        flat[picks] = rng.choice([np.inf, -np.inf, np.nan], picks.size)
    with np.errstate(all="ignore"):
        expected = run_function(func, inputs, "f64")
        PassManager.from_text("algebraic{fast-math=false}").run(func.parent_op)
        got = run_function(func, inputs, "f64")
    for w, g in zip(expected, got):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isinf(g) * np.sign(g), np.isinf(w) * np.sign(w))

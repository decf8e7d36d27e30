"""Repeated blocks: the structural hash, segments, and planning each kind of segment once
(planner/blocks.py, planner/select.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import tgc
from tgc.opdef import OPS
from tgc.planner.blocks import (
    block_hash,
    copy_map,
    correspondence,
    cuts,
    localize_sources,
    segment_key,
    segments,
    source_ops,
)
from tgc.planner.cost import Cost, DictCostSource
from tgc.planner.kernel import Kernel
from tgc.planner.options import COPY_KERNELS, PlanContext, live_ops
from tgc.planner.select import plan_function, prepare
from tgc.runtime.interpreter import random_inputs, run_function


def _ops(text: str):
    func = tgc.parse(text).funcs[0]
    return func, live_ops(func.body)


BASE = """
func.func @f(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %m = atomic.matmul %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %e = atomic.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %s = atomic.add %m, %e : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %r = hl.softmax %s {axis = -1} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %r : tensor<4x8xf32>
}
"""

SAME = {
    "commutative operands swapped": BASE.replace("atomic.add %m, %e", "atomic.add %e, %m"),
    "values renamed": BASE.replace("%m", "%prod").replace("%e", "%ex"),
    "independent ops reordered": BASE.replace(
        "  %m = atomic.matmul %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>\n"
        "  %e = atomic.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>\n",
        "  %e = atomic.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>\n"
        "  %m = atomic.matmul %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>\n",
    ),
}

DIFFERENT = {
    "one op different": BASE.replace("atomic.exp %x", "atomic.sin %x"),
    "one attribute different": BASE.replace("{axis = -1}", "{axis = 0}"),
    "operand order of a non-commutative op": BASE.replace(
        "atomic.add %m, %e", "atomic.sub %m, %e"
    ).replace("atomic.sub %m, %e", "atomic.sub %e, %m"),
    "one op more": BASE.replace(
        "  %r = hl.softmax %s",
        "  %n = atomic.neg %s : (tensor<4x8xf32>) -> tensor<4x8xf32>\n  %r = hl.softmax %n",
    ),
    "a type different": BASE.replace("tensor<4x8xf32>", "tensor<4x8xf16>").replace(
        "tensor<8x8xf32>", "tensor<8x8xf16>"
    ),
}


@pytest.mark.parametrize("name", sorted(SAME))
def test_hash_ignores_commutative_order_names_and_independent_order(name):
    assert block_hash(_ops(SAME[name])[1]) == block_hash(_ops(BASE)[1])


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_hash_tells_one_op_attribute_or_type_apart(name):
    assert block_hash(_ops(DIFFERENT[name])[1]) != block_hash(_ops(BASE)[1])


def test_hash_tells_a_shared_value_from_two_equal_ones():
    """mul(w, w) reads one argument twice, mul(w, v) two arguments of the same type."""
    one = (
        "func.func @f(%w: tensor<4xf32>, %v: tensor<4xf32>) -> tensor<4xf32> {{\n"
        "  %y = atomic.mul {} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
        "  func.return %y : tensor<4xf32>\n}}\n"
    )
    assert block_hash(_ops(one.format("%w, %w"))[1]) != block_hash(_ops(one.format("%w, %v"))[1])


def test_correspondence_maps_equal_segments_op_for_op():
    ops_a, ops_b = _ops(BASE)[1], _ops(SAME["independent ops reordered"])[1]
    a, b = segments(ops_a)[0], segments(ops_b)[0]  # matmul, exp, add (softmax is the next)
    assert segment_key(a) == segment_key(b)
    mapping = correspondence(a, b)
    assert [(op.name, mapping[op].name) for op in a.ops] == [(op.name, op.name) for op in a.ops]
    assert mapping[a.ops[0]] is b.ops[1]  # matmul came first in a, second in b


# -- segments ------------------------------------------------------------------------------------

BLOCK = """
  %h{i} = hl.layernorm {x}, %g{i}, %b{i} : (tensor<16x32xf32>, tensor<32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
  %f{i} = hl.linear %h{i}, %w{i} : (tensor<16x32xf32>, tensor<32x32xf32>) -> tensor<16x32xf32>
  %a{i} = hl.gelu %f{i} {{approximate = "tanh"}} : (tensor<16x32xf32>) -> tensor<16x32xf32>
  %y{i} = atomic.add {x}, %a{i} : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>"""


def model(blocks: int) -> str:
    """`blocks` residual blocks (layernorm, linear, gelu, add) chained, weights per block."""
    args = ["%x: tensor<16x32xf32>"]
    body = []
    for i in range(blocks):
        args += [f"%g{i}: tensor<32xf32>", f"%b{i}: tensor<32xf32>", f"%w{i}: tensor<32x32xf32>"]
        body.append(BLOCK.format(i=i, x="%x" if i == 0 else f"%y{i - 1}"))
    last = f"%y{blocks - 1}"
    return (
        f"func.func @m({', '.join(args)}) -> tensor<16x32xf32> {{"
        + "".join(body)
        + f"\n  func.return {last} : tensor<16x32xf32>\n}}\n"
    )


def test_segments_cut_at_single_live_values():
    """Each residual block is one segment (x is read twice inside it); all hash alike."""
    func = tgc.parse(model(4)).funcs[0]
    chain = segments(live_ops(func.body))
    assert len(chain) == 4
    assert [seg.output.name_hint for seg in chain[:-1]] == ["y0", "y1", "y2"]
    assert [seg.input.name_hint for seg in chain[1:]] == ["y0", "y1", "y2"]
    keys = [segment_key(seg) for seg in chain[1:-1]]
    assert len(set(keys)) == 1


def test_no_cut_separates_two_reads_of_an_argument():
    text = """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %b = atomic.neg %a : (tensor<4xf32>) -> tensor<4xf32>
  %c = atomic.sin %b : (tensor<4xf32>) -> tensor<4xf32>
  %d = atomic.add %c, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %e = atomic.abs %d : (tensor<4xf32>) -> tensor<4xf32>
  func.return %e : tensor<4xf32>
}
"""
    chain = segments(live_ops(tgc.parse(text).funcs[0].body))
    assert [[op.name for op in seg.ops] for seg in chain] == [
        ["atomic.exp", "atomic.neg", "atomic.sin", "atomic.add"],
        ["atomic.abs"],
    ]


def test_shared_constants_are_cloned_into_each_segment_and_results_do_not_change():
    text = """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = atomic.constant {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>
  %k = atomic.mul %c, %c : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %a = atomic.mul %x, %k : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %b = atomic.exp %a : (tensor<4xf32>) -> tensor<4xf32>
  %d = atomic.add %b, %k : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  func.return %d : tensor<4xf32>
}
"""
    module = tgc.parse(text)
    func = module.funcs[0]
    before = segments(live_ops(func.body))
    assert len(before) == 3
    assert localize_sources(func.body, live_ops(func.body))
    tgc.verify(module)
    after = segments(live_ops(func.body))
    # each segment holds the constants it reads: segments share only cut values
    for seg in after:
        inside = set(seg.ops)
        for op in seg.ops:
            for v in op.operands:
                d = v.defining_op
                assert d is None or d in inside or v is seg.input
    # the first and the last segment read %k: two copies of it and of its constant
    assert sum(op.name == "atomic.constant" for op in func.body.ops) == 2
    assert sum(op.name == "atomic.mul" for op in func.body.ops) == 3
    inputs = random_inputs(func, 0)
    want = run_function(tgc.parse(text).funcs[0], inputs, "f64")[0]
    assert np.allclose(run_function(func, inputs, "f64")[0], want, rtol=1e-12)


# -- planning once --------------------------------------------------------------------------------


def _all_op_kernels(rng: random.Random):
    """numpy and cuda kernels for every atomic and hl op, random times, random copies."""
    kernels = [
        Kernel(f"{b}.t.{name}", b, op=name)
        for name in sorted(OPS)
        if name.split(".")[0] in ("atomic", "hl")
        for b in ("numpy", "cuda")
    ]
    table = {k.name: Cost(rng.uniform(1e-6, 2e-5), "measured") for k in kernels}
    table |= {name: Cost(rng.uniform(1e-6, 2e-5), "measured") for name in COPY_KERNELS.values()}
    return kernels, DictCostSource(table)


@pytest.mark.parametrize("lowered", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_planning_with_reuse_gives_the_plan_found_without(seed, lowered):
    rng = random.Random(seed)
    kernels, costs = _all_op_kernels(rng)
    plans = []
    for reuse in (True, False):
        module = tgc.parse(model(5))
        if lowered:
            tgc.run_pipeline(module, "lower-hl")
        func = module.funcs[0]
        prepare(func)
        selection = plan_function(func, PlanContext(kernels), costs, reuse=reuse)
        plans.append((str(selection.plan), selection.seconds, selection.distinct_segments))
    (with_reuse, cost_reuse, distinct), (without, cost_without, every) = plans
    assert with_reuse == without
    assert cost_reuse == pytest.approx(cost_without, rel=1e-12)
    assert every == 5 and distinct < every


def two_results(blocks: int) -> str:
    """`model(blocks)` returning the last block's gelu too."""
    T = "tensor<16x32xf32>"
    last = blocks - 1
    return (
        model(blocks)
        .replace(f") -> {T} {{", f") -> ({T}, {T}) {{")
        .replace(f"func.return %y{last} : {T}", f"func.return %y{last}, %a{last} : {T}, {T}")
    )


@pytest.mark.parametrize(("text", "kinds"), [(model(5), 1), (two_results(5), 2)])
def test_repeated_blocks_are_planned_once(text, kinds):
    """Five equal blocks, one kind of segment: the first reads the model's input as the others
    read a cut value, and the last returns its cut value as the others hand it on. Returning
    two values, the last block is a kind of its own (it returns through the values required)."""
    kernels, costs = _all_op_kernels(random.Random(0))
    plans = []
    for reuse in (True, False):
        func = tgc.parse(text).funcs[0]
        selection = plan_function(func, PlanContext(kernels), costs, reuse=reuse)
        plans.append(str(selection.plan))
        assert selection.exact
        assert (selection.segments, selection.distinct_segments) == (5, kinds if reuse else 5)
    assert plans[0] == plans[1]


def _count_evaluations(monkeypatch) -> list[int]:
    from tgc.planner import solve

    calls = [0]
    original = solve._Run.evaluate

    def counting(self, op, forced=None):
        calls[0] += 1
        return original(self, op, forced)

    monkeypatch.setattr(solve._Run, "evaluate", counting)
    return calls


@pytest.mark.parametrize("reuse", [True, False])
def test_planning_work_is_linear_and_constant_with_reuse(monkeypatch, reuse):
    """Op evaluations of the DP (counted, not timed) for 4, 8 and 16 blocks: planning every
    segment anew, the work grows by equal steps per block (linear; the decomposition tables are
    shared by op signature either way); with reuse it does not grow at all."""
    kernels, costs = _all_op_kernels(random.Random(1))
    calls = _count_evaluations(monkeypatch)
    work = []
    for blocks in (4, 8, 16):
        calls[0] = 0
        func = tgc.parse(model(blocks)).funcs[0]
        plan_function(func, PlanContext(kernels), costs, reuse=reuse)
        work.append(calls[0])
    if reuse:
        assert work[0] == work[1] == work[2]
    else:
        per_block = (work[1] - work[0]) / 4
        assert per_block > 0
        assert work[2] - work[1] == pytest.approx(8 * per_block, rel=0.05)


DUPLICATES = """
  %p{i} = atomic.exp {x} : (tensor<16x32xf32>) -> tensor<16x32xf32>
  %q{i} = atomic.exp {x} : (tensor<16x32xf32>) -> tensor<16x32xf32>
  %r{i} = atomic.sub %p{i}, {x} : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
  %y{i} = atomic.mul %r{i}, %q{i} : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>"""


def test_repeated_segments_with_duplicate_ops_give_the_plan_found_without_reuse():
    """Two equal exps in a block (CSE would merge them) map ambiguously between blocks: the
    plan is still the one found planning each block anew."""
    kernels, costs = _all_op_kernels(random.Random(3))
    body = "".join(DUPLICATES.format(i=i, x="%x" if i == 0 else f"%y{i - 1}") for i in range(4))
    text = (
        "func.func @d(%x: tensor<16x32xf32>) -> tensor<16x32xf32> {"
        + body
        + "\n  func.return %y3 : tensor<16x32xf32>\n}\n"
    )
    found = []
    for reuse in (True, False):
        func = tgc.parse(text).funcs[0]
        selection = plan_function(func, PlanContext(kernels), costs, reuse=reuse)
        found.append((str(selection.plan), selection.seconds))
    assert found[0][0] == found[1][0]
    assert found[0][1] == pytest.approx(found[1][1], rel=1e-12)


# -- cuts, copies and matches across cuts -----------------------------------------------------------


def _cuts_by_definition(ops) -> list:
    """After ops[i], the one value live (a computed value, not a source's, from its op, an
    argument from its first read, each to its last read): brute force."""
    sources = source_ops(ops)
    position = {op: i for i, op in enumerate(ops)}
    reads: dict = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            reads.setdefault(v, []).append(i)
    for v in ops[-1].block.last.operands:
        reads.setdefault(v, []).append(len(ops))
    out = []
    for i, op in enumerate(ops[:-1]):
        if op in sources:
            continue
        live = []
        for v, at in reads.items():
            d = v.defining_op
            if d in sources:
                continue
            begin = min(at) if d is None else position[d]
            if begin <= i < max(at):
                live.append(v)
        if len(live) == 1 and live[0].defining_op is not None:
            out.append((i, live[0]))
    return out


def _random_functions():
    from planner_fakes import random_dag, random_tree

    rng = random.Random(5)
    for n in range(120):
        size = rng.randint(2, 14)
        yield random_dag(rng, size) if n % 2 else random_tree(rng, size, chain=n % 4 == 0)
    for lowered in (False, True):
        module = tgc.parse(model(3))
        if lowered:
            tgc.run_pipeline(module, "lower-hl")  # constants, iotas, masks: sources
        yield module.funcs[0]


def test_cuts_are_where_one_value_is_live():
    """`cuts` (counted in bulk) against the definition, on 120 random trees, chains and DAGs
    and on a model as written and lowered (with sources)."""
    checked = 0
    for func in _random_functions():
        ops = live_ops(func.body)
        want = _cuts_by_definition(ops)
        assert cuts(ops) == want
        checked += len(want)
    assert checked > 50


def _chain(text: str):
    func = tgc.parse(text).funcs[0]
    ops = live_ops(func.body)
    sources = source_ops(ops)
    return segments(ops, sources=sources), sources


def test_copy_map_pairs_a_copied_segment_op_for_op():
    chain, sources = _chain(model(4))
    a, b = chain[1], chain[2]  # blocks 1 and 2: inputs y0 and y1
    values, ops = copy_map(a, b, sources)
    assert [ops[op] for op in a.core] == b.core
    assert values[a.input] is b.input and values[a.output] is b.output
    args = {v.name_hint: w.name_hint for v, w in values.items() if v.defining_op is None}
    assert args == {"g1": "g2", "b1": "b2", "w1": "w2"}


@pytest.mark.parametrize(
    "change",
    [
        ('%a2 = hl.gelu %f2 {approximate = "tanh"}', '%a2 = hl.gelu %f2 {approximate = "none"}'),
        ('%a2 = hl.gelu %f2 {approximate = "tanh"}', "%a2 = hl.relu %f2"),  # another op
        ("hl.layernorm %y1, %g2, %b2", "hl.layernorm %y1, %g2, %g2"),  # one weight read twice
        ("atomic.add %y1, %a2", "atomic.add %a2, %y1"),  # operands swapped (the hash agrees)
    ],
)
def test_copy_map_refuses_a_segment_that_differs(change):
    """Block 2 changed in one place: not a copy of block 1; blocks 1 and 3 still are."""
    text = model(5)
    assert change[0] in text
    chain, sources = _chain(text.replace(*change))
    assert copy_map(chain[1], chain[3], sources) is not None
    assert copy_map(chain[1], chain[2], sources) is None


def _numpy_kernels() -> list[Kernel]:
    """The numpy backend's kernels (it registers them when imported)."""
    import tgc.planner.backends.numpy  # noqa: F401
    from tgc.planner.kernel import KERNELS

    return [k for k in KERNELS.values() if k.backend == "numpy"]


def _fma_kernels(seed: int):
    """Op kernels on two backends (random costs) and numpy's graph kernel `a + b*c`, cheap."""
    kernels, costs = _all_op_kernels(random.Random(seed))
    (fma,) = (k for k in _numpy_kernels() if k.name == "numpy.fma")
    costs.table[fma.name] = Cost(1e-7, "measured")
    return [*kernels, fma], costs


def _chained(block: str, blocks: int, args: str, prologue: str = "", x: str = "%x") -> str:
    T = "tensor<16x32xf32>"
    params = ["%x: " + T] + [f"%{a}{i}: {T}" for i in range(blocks) for a in args]
    body = prologue + "".join(
        block.format(i=i, x=x if i == 0 else f"%p{i - 1}", T=T) for i in range(blocks)
    )
    return (
        f"func.func @m({', '.join(params)}) -> {T} {{{body}\n"
        f"  func.return %p{blocks - 1} : {T}\n}}\n"
    )


# One op a segment: an fma (`b + e*w`) joins the mul ending a block to the add starting the next.
ACROSS = """
  %s{i} = atomic.add %b{i}, {x} : ({T}, {T}) -> {T}
  %e{i} = atomic.exp %s{i} : ({T}) -> {T}
  %p{i} = atomic.mul %e{i}, %w{i} : ({T}, {T}) -> {T}"""


def _plans(text: str, kernels, costs) -> list:
    found = []
    for reuse in (True, False):
        func = tgc.parse(text).funcs[0]
        selection = plan_function(func, PlanContext(kernels), costs, reuse=reuse)
        found.append((str(selection.plan), selection.seconds, selection.segments))
    return found


@pytest.mark.parametrize("prologue", [False, True])
def test_a_match_across_a_cut_gives_the_plan_found_without_reuse(prologue):
    """The add that starts a block and the mul that ends the one before are one fma: a match
    across the cut between them. Without the prologue the first add reads an argument and the
    adds are planned (matched) each: a match crosses a cut there. With it the first add reads a
    computed value too, so the next blocks look like copies of the first, but the fma reaches
    over their input cut (found by `_Reach`): no copy, the same plan as without reuse."""
    kernels, costs = _fma_kernels(4)
    pre = "\n  %x0 = atomic.neg %x : (tensor<16x32xf32>) -> tensor<16x32xf32>" if prologue else ""
    text = _chained(ACROSS, 5, "bw", pre, "%x0" if prologue else "%x")
    (with_reuse, cost, chain), (without, cost_without, merged) = _plans(text, kernels, costs)
    assert with_reuse == without
    assert cost == pytest.approx(cost_without, rel=1e-12)
    assert with_reuse.count("numpy.fma(") == 4  # each block's add with the mul before it
    assert chain == merged < 15 + prologue  # cuts inside an fma are not made


def test_a_function_with_dead_ops_gives_the_plan_found_without_reuse():
    """An unused op in each block (no canonical form here): the use counts of a copy's values
    are compared (a dead reader counts for the matcher)."""
    kernels, costs = _all_op_kernels(random.Random(6))
    dead = "\n  %d{i} = atomic.neg %h{i} : (tensor<16x32xf32>) -> tensor<16x32xf32>"
    text = model(5)
    for i in range(5):
        text = text.replace(f"\n  %f{i} =", dead.format(i=i) + f"\n  %f{i} =")
    assert text.count("atomic.neg") == 5
    found = []
    for reuse in (True, False):
        func = tgc.parse(text).funcs[0]
        selection = plan_function(func, PlanContext(kernels), costs, reuse=reuse)
        found.append((str(selection.plan), selection.seconds, selection.distinct_segments))
    assert found[0][:2] == found[1][:2]
    assert found[0][2] < found[1][2] == 5


@pytest.mark.parametrize("lowered", [False, True])
def test_matching_work_does_not_grow_with_blocks(monkeypatch, lowered):
    """Ops matched against the kernels (counted, not timed) for 1, 12 and 48 blocks: with reuse
    a copy of a segment is not matched, so 12 and 48 blocks match the same ops, at most twice
    those of one block (the first block, and the last, which feeds the return); without reuse
    every op is matched."""
    numpy = _numpy_kernels()
    calls = [0]
    original = PlanContext.options_at

    def counting(self, op):
        calls[0] += 1
        return original(self, op)

    monkeypatch.setattr(PlanContext, "options_at", counting)
    work = {}
    for reuse in (True, False):
        for blocks in (1, 12, 48):
            module = tgc.parse(model(blocks))
            if lowered:
                tgc.run_pipeline(module, "lower-hl")
            func = module.funcs[0]
            prepare(func)
            calls[0] = 0
            plan_function(func, PlanContext(numpy, tolerance=1e-5), reuse=reuse)
            work[reuse, blocks] = (calls[0], len(live_ops(func.body)))
    one, twelve, many = (work[True, n][0] for n in (1, 12, 48))
    assert twelve == many <= 2 * one
    # Without reuse every live op is matched once (the decompositions' ops once in all).
    (calls_12, ops_12), (calls_48, ops_48) = work[False, 12], work[False, 48]
    assert calls_48 - calls_12 == ops_48 - ops_12 > many


SOURCE_OF_A_SOURCE = """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = atomic.constant {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>
  %b = atomic.broadcast %c : (tensor<f32>) -> tensor<4xf32>
  %a = atomic.mul %x, %c : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
  %e = atomic.exp %a : (tensor<4xf32>) -> tensor<4xf32>
  %n = atomic.neg %e : (tensor<4xf32>) -> tensor<4xf32>
  %d = atomic.add %n, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  func.return %d : tensor<4xf32>
}
"""


@pytest.mark.parametrize("reuse", [True, False])
def test_a_source_made_from_a_source_of_another_segment_gets_its_own_copy(reuse):
    """%c is first read by the first segment, %b (made from %c) only by the last: the last gets
    its own %c for its %b (it was read across the cut, and planning failed on it)."""
    module = tgc.parse(SOURCE_OF_A_SOURCE)
    func = module.funcs[0]
    selection = plan_function(func, PlanContext(_numpy_kernels()), reuse=reuse)
    tgc.verify(module)
    assert selection.segments == 4
    assert sum(op.name == "atomic.constant" for op in func.body.ops) == 2
    chain = segments(live_ops(func.body))
    for seg in chain:  # segments share only their cut values
        inside = set(seg.ops)
        for op in seg.ops:
            assert all(
                v.defining_op in inside or v in (seg.input, *func.body.args) for v in op.operands
            )
    inputs = random_inputs(func, 1)
    want = run_function(tgc.parse(SOURCE_OF_A_SOURCE).funcs[0], inputs, "f64")[0]
    assert np.allclose(run_function(func, inputs, "f64")[0], want, rtol=1e-12)


def _random_block(rng: random.Random) -> str:
    """A block of random unary and binary ops over its input, a weight and each other, ending
    in one value that the next block reads. Half the blocks start with `w + x` (with `x` the
    previous block's last op, a mul: an fma across the cut); half leave some ops unused (dead),
    half use every op."""
    T2 = "({T}, {T}) -> {T}"
    lines, values = [], ["{x}", "%w{i}"]
    if rng.random() < 0.5:
        lines.append(f"%s{{i}} = atomic.add %w{{i}}, {{x}} : {T2}")
        values = ["%s{i}", "%w{i}"]
    for j in range(rng.randint(3, 8)):
        if rng.random() < 0.3:
            op = rng.choice(("exp", "neg", "abs", "sin"))
            line = f"%v{j}_{{i}} = atomic.{op} {rng.choice(values)} : ({{T}}) -> {{T}}"
        else:
            op = rng.choice(("add", "mul", "mul", "sub"))
            line = f"%v{j}_{{i}} = atomic.{op} {rng.choice(values)}, {rng.choice(values)} : {T2}"
        lines.append(line)
        values.append(f"%v{j}_{{i}}")
    last = values[-1]
    if rng.random() < 0.5:  # every op used
        text = "".join(lines)
        for k, v in enumerate(values[2:-1]):
            if text.count(v + " ") + text.count(v + ",") == 1:  # defined, never read
                lines.append(f"%u{k}_{{i}} = atomic.add {last}, {v} : {T2}")
                last = f"%u{k}_{{i}}"
    lines.append(f"%p{{i}} = atomic.mul {last}, %b{{i}} : {T2}")
    return "".join("\n  " + line for line in lines)


@pytest.mark.parametrize("seed", range(40))
def test_random_repeated_blocks_give_the_plan_found_without_reuse(seed):
    """Six copies of a random block (`_random_block`: fmas inside and across cuts, dead ops or
    none), random costs on two backends: the plan with reuse is the plan without."""
    rng = random.Random(100 + seed)
    kernels, costs = _fma_kernels(seed)
    text = _chained(_random_block(rng), 6, "wb")
    (with_reuse, cost, _), (without, cost_without, _) = _plans(text, kernels, costs)
    assert with_reuse == without
    assert cost == pytest.approx(cost_without, rel=1e-12)

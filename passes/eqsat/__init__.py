"""`eqsat`: equality saturation over a function's pure ops, extraction by a cost model.

The package: `egraph.py` (the e-graph), `rules.py` (the algebraic family as patterns, rule
tables in both directions, the merge of matmuls sharing an operand), `extract.py` (choosing
the cheapest graph). The cost is the `algebraic` pass's roofline model (passes/algebraic/cost.py)
through `NodeCost`, or another model named by the `cost` option from `COST_MODELS`: the
planner, which the passes may not import, registers `planner` there (planner/eqsat_cost.py:
each op at its cheapest kernel, measured, estimated or modelled).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tgc.builtin import FuncOp, ReturnOp
from tgc.ir import Operation, Value
from tgc.opdef import OPS, PURE
from tgc.pass_manager import Pass, PassStatistics, PipelineError, option, register_pass
from tgc.passes.algebraic.cost import CostWeights, op_cost
from tgc.passes.eqsat.egraph import LEAF, EGraph, ENode
from tgc.passes.eqsat.extract import dag_cost, extract
from tgc.passes.eqsat.rules import PIECE, both_ways, hand_written_rules
from tgc.passes.rule_file import (
    FileRule,
    PNode,
    PVar,
    attr_key_of,
    infer_type,
    load_rules,
    match,
    types_fit,
)
from tgc.patterns import erase_dead_ops
from tgc.rewriter import Rewriter

MATMUL = "atomic.matmul"
# cost model name -> (e-graph, the pass's options) -> NodeCost; `roofline` is below, the planner
# adds `planner` when it loads (tgc.load_all).
COST_MODELS: dict[str, object] = {}


def _modelled(op: Operation) -> bool:
    return (
        op.has_trait(PURE)
        and len(op.results) == 1
        and not op.regions
        and op.name != "atomic.constant"
        and op.name.startswith("atomic.")
    )


@dataclass
class Built:
    eg: EGraph
    value_class: dict[Value, int]
    leaf_values: dict[ENode, Value]
    original: dict[int, ENode]  # the node each original op made, per class


def build_egraph(func: FuncOp) -> Built:
    eg = EGraph()
    value_class: dict[Value, int] = {}
    leaf_values: dict[ENode, Value] = {}
    original: dict[int, ENode] = {}

    def leaf(v: Value, key, fixed: bool) -> int:
        node = (LEAF, key, ())
        leaf_values[node] = v
        cls = eg.add(node, v.type, fixed)
        original[cls] = node
        return cls

    for i, arg in enumerate(func.args):
        value_class[arg] = leaf(arg, ("arg", i), func.is_param(i))
    for op in func.body.ops:
        if isinstance(op, ReturnOp):
            continue
        if not _modelled(op):
            fixed = op.name == "atomic.constant"
            for i, r in enumerate(op.results):
                value_class[r] = leaf(r, ("op", id(op), i), fixed)
            continue
        kids = tuple(value_class[v] for v in op.operands)
        node = (op.name, attr_key_of(op), kids)
        cls = eg.add(node, op.results[0].type, False, tuple(sorted(op.attributes.items())))
        original.setdefault(cls, eg.canon(node))
        value_class[op.results[0]] = cls
    return Built(eg, value_class, leaf_values, original)


# -- saturation ------------------------------------------------------------------------------------


def _instantiate(eg: EGraph, p, subst: dict) -> int | None:
    if isinstance(p, PVar):
        return subst[p.index]
    kids = [_instantiate(eg, k, subst) for k in p.children]
    if any(k is None for k in kids):
        return None
    t = infer_type(p, tuple(eg.types[eg.find(k)] for k in kids))
    if t is None:
        return None
    return eg.add((p.op, p.attr_key, tuple(kids)), t, False, p.attributes)


def _merge_matches(eg: EGraph) -> list[tuple[list[int], int]]:
    """Groups of matmul classes X@W1, .., X@Wn (plain flags, 2-D, W's rows equal, all fixed or
    none): ([product classes], X)."""
    plain = attr_key_of(OPS[MATMUL]([], [], {}))
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for cls, nodes in eg.nodes.items():
        if cls in eg.merged or any(n[0] == PIECE for n in nodes):
            continue  # a merged product (X@concat(..)) is not merged again
        for op, key, kids in nodes:
            if op != MATMUL or key != plain:
                continue
            x, w = kids
            wt = eg.types[w]
            if wt.rank != 2 or eg.types[x].rank != 2:
                continue
            groups.setdefault((x, wt.shape[0], eg.fixed[w]), []).append((cls, w))
    out = []
    for (x, _, _), members in groups.items():
        members = list(dict.fromkeys(members))
        if 2 <= len(members) <= 8 and len({w for _, w in members}) == len(members):
            out.append(([w for _, w in members], x, [c for c, _ in members]))
    return out


def _apply_merge(eg: EGraph, weights: list[int], x: int, products: list[int]) -> bool:
    wts = [eg.types[w] for w in weights]
    concat = PNode("atomic.concat", (("axis", 1),), (("axis", 1),), (), False)
    key = attr_key_of(OPS["atomic.concat"]([], [], {"axis": 1}))
    cat_type = wts[0].with_shape((wts[0].shape[0], sum(t.shape[1] for t in wts)))
    cat = eg.add(("atomic.concat", key, tuple(weights)), cat_type, False, concat.attributes)
    mm_key = attr_key_of(OPS[MATMUL]([], [], {}))
    mm_type = eg.types[x].with_shape((eg.types[x].shape[0], cat_type.shape[1]))
    merged = eg.add((MATMUL, mm_key, (x, cat)), mm_type, False, ())
    eg.merged.add(merged)
    sizes = tuple(t.shape[1] for t in wts)
    changed = False
    for i, p in enumerate(products):
        piece = eg.add((PIECE, (1, sizes, i), (merged,)), eg.types[p])
        changed |= eg.find(piece) != eg.find(p)
        eg.union(piece, p)
    return changed


def saturate(
    eg: EGraph, rules: list[FileRule], iterations: int, node_limit: int, seconds: float
) -> dict:
    start = time.perf_counter()
    report = {"iterations": 0, "stop": "saturated", "applied": 0}

    def expand(x, p: PNode):
        return [
            n[2]
            for n in eg.nodes[eg.find(x)]
            if n[0] == p.op and n[1] == p.attr_key and len(n[2]) == len(p.children)
        ]

    for _ in range(iterations):
        report["iterations"] += 1
        found = []
        for cls in eg.classes():
            for rule in rules:
                for subst in match(rule.src, cls, expand, {}):
                    found.append((rule, cls, subst))
        before = (eg.size, len(eg.nodes))
        for rule, cls, subst in found:
            types = {i: eg.types[eg.find(c)] for i, c in subst.items()}
            if not types_fit(rule, types):
                continue
            new = _instantiate(eg, rule.tgt, subst)
            if new is None or eg.types[eg.find(new)] is not eg.types[eg.find(cls)]:
                continue
            if eg.find(new) != eg.find(cls):
                report["applied"] += 1
            eg.union(new, cls)
        for group in _merge_matches(eg):
            _apply_merge(eg, *group)
        eg.rebuild()
        if (eg.size, len(eg.nodes)) == before:
            return report
        if eg.size > node_limit:
            report["stop"] = "node limit"
            return report
        if time.perf_counter() - start > seconds:
            report["stop"] = "time limit"
            return report
    report["stop"] = "iteration limit"
    return report


# -- cost and emission -----------------------------------------------------------------------------


def roofline_cost(eg: EGraph, weights: CostWeights):
    """The `algebraic` cost model per e-node: free for leaves, split pieces (read in place)
    and ops whose operands are all fixed; otherwise the op's roofline and launch."""
    cache: dict[tuple, float] = {}

    def cost(node: ENode, cls: int) -> float:
        op, key, kids = node
        if op in (LEAF, PIECE) or (kids and all(eg.fixed[eg.find(k)] for k in kids)):
            return 0.0
        types = tuple(eg.types[eg.find(k)] for k in kids)
        ck = (op, key, types)
        if ck not in cache:
            attrs = dict(eg.attributes.get((op, key), ()))
            probe = OPS[op]([Value(t) for t in types], [eg.types[cls]], attrs)
            cache[ck] = op_cost(probe).seconds(weights)
        return cache[ck]

    return cost


COST_MODELS["roofline"] = lambda eg, options: roofline_cost(eg, options.weights())


class _Emitter:
    def __init__(self, built: Built, choice: dict[int, ENode], rewriter: Rewriter) -> None:
        self.built, self.choice, self.rewriter = built, choice, rewriter
        self.values: dict[int, Value] = {}
        self.splits: dict[tuple, tuple[Value, ...]] = {}

    def emit(self, cls: int, before: Operation) -> Value:
        eg = self.built.eg
        cls = eg.find(cls)
        if cls in self.values:
            return self.values[cls]
        op, key, kids = node = self.choice[cls]
        b = self.rewriter.builder_before(before)
        if op == LEAF:
            value = self.built.leaf_values[node]
        elif op == PIECE:
            axis, sizes, index = key
            source = self.emit(kids[0], before)
            split_key = (eg.find(kids[0]), axis, sizes)
            if split_key not in self.splits:
                self.splits[split_key] = b.atomic.split(source, axis=axis, sizes=sizes)
            value = self.splits[split_key][index]
        else:
            operands = [self.emit(k, before) for k in kids]
            attrs = dict(eg.attributes.get((op, key), ()))
            value = b.create(op, operands, attrs, [eg.types[cls]]).results[0]
        self.values[cls] = value
        return value


def _leaves_below(eg: EGraph, choice, roots) -> set[ENode]:
    out, seen, stack = set(), set(), list(roots)
    while stack:
        cls = eg.find(stack.pop())
        if cls in seen:
            continue
        seen.add(cls)
        node = choice[cls]
        if node[0] == LEAF:
            out.add(node)
        stack.extend(node[2])
    return out


def rewrite_function(func: FuncOp, rules, weights, iterations, node_limit, seconds, cost=None):
    """Saturate, extract and, where the extracted graph is cheaper, rebuild `func`; `cost`
    (the e-graph) -> NodeCost, None: the roofline of `weights`. Returns (report dict, cost
    before, cost after)."""
    built = build_egraph(func)
    eg = built.eg
    report = saturate(eg, rules, iterations, node_limit, seconds)
    cost = roofline_cost(eg, weights) if cost is None else cost(eg)
    users = [op for op in func.body.ops if isinstance(op, ReturnOp) or not _modelled(op)]
    roots = [
        eg.find(built.value_class[v]) for op in users for v in op.operands if v in built.value_class
    ]
    original = {eg.find(c): eg.canon(n) for c, n in built.original.items()}
    own = {n: cost(n, c) for c, nodes in eg.nodes.items() for n in nodes}
    before = dag_cost(original, roots, own)
    choice, after = extract(eg, roots, cost)
    report.update(nodes=eg.size, classes=len(eg.nodes))
    if before is None or after >= before * (1 - 1e-9):
        return report, before, before
    # Dominance: an op the e-graph does not model may only be read after it.
    position = {op: i for i, op in enumerate(func.body.ops)}
    for user in users:
        for v in user.operands:
            if v not in built.value_class:
                continue
            for leaf in _leaves_below(eg, choice, [built.value_class[v]]):
                source = built.leaf_values[leaf].defining_op
                if source is not None and position[source] >= position[user]:
                    report["stop"] += "; kept the function (a leaf would not dominate)"
                    return report, before, before
    rewriter = Rewriter()
    emitter = _Emitter(built, choice, rewriter)
    for user in users:
        for i, v in enumerate(user.operands):
            if v in built.value_class:
                new = emitter.emit(built.value_class[v], user)
                if new is not v:
                    rewriter.set_operand(user, i, new)
    erase_dead_ops(func.body)
    return report, before, after


@register_pass
@dataclass(frozen=True)
class Eqsat(Pass):
    """Equality saturation: every rewrite of the algebraic family (and of a rule table) kept side
    by side in an e-graph, then the cheapest equivalent graph extracted.

    Rules: distributivity (`A@B ± A@C = A@(B±C)`, both sides, `x*a ± x*b = x*(a±b)`), matmul
    reassociation, transposes into matmul flags, the merge of 2-D matmuls sharing their left
    operand (pieces of a split), all in both directions, plus the rules of `rules-file` (a
    tgc-rulegen table) in both directions. Saturation stops at a fixpoint, after `iterations`
    rounds, past `node-limit` e-nodes or after `time-limit` seconds. Extraction: the cost model of
    `algebraic` (the same options) per e-node, or with `cost=planner` the planner's kernels; a
    greedy choice by tree and by amortised costs, priced as the DAG each gives, then improved
    one class at a time while the DAG gets cheaper (passes/eqsat/extract.py).

    Contract: a function is rebuilt only where the extracted graph is strictly cheaper than its
    own (so the modelled cost never grows); results keep their types and their values in exact
    arithmetic (as `algebraic` with fast-math: distributing and reassociating change results on
    inf and NaN); ops the e-graph does not model (constants, ops with regions or several results,
    non-atomic ops) stay and are read as leaves. --pass-statistics notes the e-graph's size,
    why saturation stopped, and the cost before and after.
    """

    name = "eqsat"
    summary = "Equality saturation with the algebraic rules; cheapest graph by the cost model"

    iterations: int = option(6, "rounds of rule application at most")
    node_limit: int = option(20000, "stop saturating past this many e-nodes")
    time_limit: float = option(2.0, "stop saturating after this many seconds (per function)")
    rules_file: str = option("", "a rule table (.tg, tgc-rulegen's format) to apply as well")
    cost: str = option(
        "roofline",
        "the extraction's cost model: roofline (algebraic's, with the three options below) or "
        "planner (each op at its cheapest kernel: measured in `db`, else estimated, else "
        "modelled)",
    )
    db: str = option("", "the measurement database of cost=planner (empty: the default)")
    backends: tuple[str, ...] = option(
        (), "backend families whose kernels cost=planner prices ops with (empty: all)"
    )
    flop_cost: float = option(2e-14, "seconds per flop in the cost model")
    byte_cost: float = option(3.3e-13, "seconds per byte in the cost model")
    launch_cost: float = option(3e-6, "seconds per kernel launch in the cost model")

    def __post_init__(self) -> None:
        if self.iterations < 0 or self.node_limit < 1 or self.time_limit < 0:
            raise PipelineError(
                "pass 'eqsat' needs iterations >= 0, node-limit >= 1 and time-limit >= 0"
            )
        if self.cost not in COST_MODELS:
            raise PipelineError(
                f"pass 'eqsat': unknown cost model '{self.cost}' "
                f"(cost models: {', '.join(sorted(COST_MODELS))})"
            )

    def weights(self) -> CostWeights:
        return CostWeights(self.flop_cost, self.byte_cost, self.launch_cost)

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        rules = hand_written_rules()
        if self.rules_file:
            rules = rules + both_ways(load_rules(self.rules_file))
        model = COST_MODELS[self.cost]
        report, before, after = rewrite_function(
            func,
            rules,
            self.weights(),
            self.iterations,
            self.node_limit,
            self.time_limit,
            cost=lambda eg: model(eg, self),
        )
        name = f"@{func.sym_name}"
        stats.note(
            f"{name}: {report['iterations']} round(s), {report['nodes']} e-node(s) in "
            f"{report['classes']} class(es), stopped: {report['stop']}"
        )
        if before is not None:
            stats.note(f"{name}: cost before {before:.4e} s, after {after:.4e} s")
        stats.bump("rules applied", report["applied"])

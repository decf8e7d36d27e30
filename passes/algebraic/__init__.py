"""`algebraic`: TASO-class rewrites of the tensor algebra, chosen by a cost model and a search.

The package: `rules.py` (the rule table), `cost.py` (the cost model), `graph.py` (cloning and
windows of a function), `search.py` (best-first search with α relaxation, and replay).
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.pass_manager import Pass, PassStatistics, PipelineError, option, register_pass
from tgc.passes.algebraic.cost import CostWeights, FixedMemo, describe
from tgc.passes.algebraic.graph import extract_window, span_ops
from tgc.passes.algebraic.rules import RULE_NAMES, RULES
from tgc.passes.algebraic.search import plan_windows, replay, search
from tgc.rewriter import Rewriter


@register_pass
@dataclass(frozen=True)
class Algebraic(Pass):
    """Rewrite matmuls and products into cheaper equivalent forms (the TASO family).

    Rules (passes/algebraic/rules.py): distributivity on both sides, `A@B + A@C -> A@(B+C)`,
    `B@A + C@A -> (B+C)@A`, `x*a + x*b -> x*(a+b)` (and the same with `-`); matmul chains of
    three or more factors reordered by matrix-chain dynamic programming, and reassociated one step
    at a time; N >= 2 matmuls sharing an operand on the same side (with the same transpose flags
    and weights that differ only in the concatenated dim) merged into one matmul on the
    concatenated operands plus `atomic.split`; transposes pushed through matmuls into their
    `transpose_a`/`transpose_b` flags.

    Cost (cost.py): per op, max(flop-cost·flops, byte-cost·bytes) + launch-cost (a roofline and
    a launch); views such as split, reshape and broadcast are free, and so is an op that reads
    only fixed values (`{tgc.param}` arguments, constants, and what is computed from them alone),
    which the plan computes once: matmuls merge on parameter weights, not on a concat of plain
    arguments that costs more than the launches it saves. Search: best-first over rewritten copies of each
    window of the function, keeping candidates cheaper than `alpha` times the best seen (so a
    step that is worse now can lead to a better graph later), expanding at most `budget` states
    per window of at most `window` ops; the best graph found is then rebuilt through the
    rewriter. `rules` restricts the rule set (comma-separated names; default all).

    Contract: every function result keeps its type and its value in exact arithmetic (floating
    point may round differently, as reassociation does); rewritten ops take the location of the
    op they replace; ops made dead by a rewrite are erased, no other op is touched; a window is
    only changed when its cost strictly drops, so the cost never grows; deterministic.

    Infinities and NaN: distributivity and matmul-chain reordering are exact in real arithmetic,
    not on inf/NaN (x = -inf, a = 2, b = -1: x*a + x*b is NaN, x*(a+b) is -inf). Unlike
    canonicalize, this pass allows them by default (`fast-math=true`): they are what it is for,
    and the default pipelines rely on them. `algebraic{fast-math=false}` keeps only the rules
    exact on every input (merges, stacks, transposes), bit for bit on NaN and infinities. With
    --pass-statistics: one counter per rule applied, the cost of each function before and after,
    and the search effort.
    """

    name = "algebraic"
    summary = "Cost-driven algebraic rewrites: distributivity, matmul chains, merged matmuls"

    alpha: float = option(1.05, "keep candidates cheaper than alpha times the best seen")
    budget: int = option(64, "states expanded per window")
    window: int = option(64, "ops per window searched")
    flop_cost: float = option(2e-14, "seconds per flop in the cost model")
    byte_cost: float = option(3.3e-13, "seconds per byte in the cost model")
    launch_cost: float = option(3e-6, "seconds per kernel launch in the cost model")
    rules: tuple[str, ...] = option((), "the rules to apply (empty: all)")
    fast_math: bool = option(True, "allow rules exact in real arithmetic but not on inf/NaN")

    def __post_init__(self) -> None:
        unknown = [r for r in self.rules if r not in RULE_NAMES]
        if unknown:
            raise PipelineError(
                f"pass 'algebraic' has no rule '{unknown[0]}' (rules: {', '.join(RULE_NAMES)})"
            )
        if self.alpha < 1 or self.budget < 0 or self.window < 1:
            raise PipelineError("pass 'algebraic' needs alpha >= 1, budget >= 0 and window >= 1")

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        weights = CostWeights(self.flop_cost, self.byte_cost, self.launch_cost)
        rules = tuple(
            r
            for r in RULES
            if (not self.rules or r.name in self.rules) and (self.fast_math or r.exact)
        )
        block = func.body
        before = describe(block.ops, weights)
        rewriter = Rewriter()
        windows = plan_windows(block, self.window)
        expanded = 0
        fixed: FixedMemo = {}  # algebraic rewrites keep each value's fixedness: one memo will do
        for first, after in windows:
            before_window = first.prev
            result = search(
                extract_window(span_ops(block, before_window, after), fixed),
                rules,
                weights,
                self.alpha,
                self.budget,
            )
            expanded += result.expanded
            replay(result.moves, block, before_window, after, rewriter)
            for move in result.moves:
                stats.bump(move.rule.name)
        name = f"@{func.sym_name}"
        stats.note(f"{name}: cost before {before}")
        stats.note(f"{name}: cost after {describe(block.ops, weights)}")
        stats.note(f"{name}: searched {len(windows)} window(s), expanded {expanded} state(s)")

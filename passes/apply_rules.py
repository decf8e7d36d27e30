"""`apply-rules{file=...}`: apply the rules of a `.tg` rule table (passes/rule_file.py), source
to target, with the greedy worklist driver (tgc/patterns.py).

A rule fires at an op where its source matches (operands of commutative ops in either order),
the matched values' types are an instance of the rule's arguments (each shape symbol one size,
1s kept, float element types) and the target, built on those values, has exactly the op's type.
Nothing else is checked: the table is trusted to hold equalities (tgc-rulegen writes only rules
it verified; docs/rulegen.md), and its direction is the one written. Tables written by
tgc-rulegen put the side with more ops first, so most rules shrink the graph; a table whose
rules undo each other stops at `max-iterations` with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.ir import Operation, Value
from tgc.pass_manager import Pass, PassStatistics, PipelineError, option, register_pass
from tgc.passes.rule_file import (
    FileRule,
    PNode,
    PVar,
    attr_key_of,
    load_rules,
    match,
    target_type,
    types_fit,
)
from tgc.patterns import PatternRewriter, RewritePattern, apply_patterns_greedily


def _expand_ir(value: Value, p: PNode):
    """The operands of the op defining `value`, where it is the op `p` names."""
    op = value.defining_op
    if (
        op is None
        or op.name != p.op
        or len(op.results) != 1
        or len(op.operands) != len(p.children)
        or attr_key_of(op) != p.attr_key
    ):
        return ()
    return (tuple(op.operands),)


def pattern_ops(p) -> int:
    """The number of op nodes of a pattern (a shared subpattern counts once per use)."""
    if isinstance(p, PVar):
        return 0
    return 1 + sum(pattern_ops(c) for c in p.children)


def _build(p, subst: dict, rewriter: PatternRewriter, at: Operation) -> Value:
    if isinstance(p, PVar):
        return subst[p.index]
    operands = [_build(c, subst, rewriter, at) for c in p.children]
    return rewriter.builder_before(at).create(p.op, operands, dict(p.attributes)).results[0]


def try_rule(rule: FileRule, op: Operation, rewriter: PatternRewriter) -> bool:
    """Rewrite `op` by `rule` where it matches and the types allow."""
    root = op.results[0]
    for subst in match(rule.src, root, _expand_ir, {}):
        types = {i: v.type for i, v in subst.items()}
        if not types_fit(rule, types) or target_type(rule.tgt, types) is not root.type:
            continue
        rewriter.replace_op(op, _build(rule.tgt, subst, rewriter, op))
        return True
    return False


class TablePattern(RewritePattern):
    """The table's rules rooted at one op name, tried in table order."""

    benefit = 2

    def __init__(self, root: str, rules: list[FileRule]) -> None:
        self.op_types = (root,)
        self.rules = rules
        self._name = f"rules on {root}"

    @property
    def name(self) -> str:
        return self._name

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool | str:
        if len(op.results) != 1:
            return False
        for rule in self.rules:
            if try_rule(rule, op, rewriter):
                return rule.name
        return False


@register_pass
@dataclass(frozen=True)
class ApplyRules(Pass):
    """Apply the rules of a `.tg` rule table, source to target, greedily (see the module doc).

    Only rules whose target has fewer ops than their source fire (see the module doc).

    Contract: a rewrite keeps the op's result type; results keep their values wherever the
    table's rules are equalities (tgc-rulegen's are verified in float64 on random finite
    inputs: like `algebraic`'s distributivity, they may change results on inf and NaN); a
    malformed table is a located error. Statistics: one counter per rule applied.
    """

    name = "apply-rules"
    summary = "Apply the rules of a .tg rule table (tgc-rulegen's format), greedily"
    file: str = option("", "the rule table to apply (a .tg file of @<rule>_src/_tgt pairs)")
    max_iterations: int = option(10, "sweeps before giving up (reported)")

    def __post_init__(self) -> None:
        if not self.file:
            raise PipelineError("pass 'apply-rules' needs a rule table: apply-rules{file=PATH}")
        if self.max_iterations < 1:
            raise PipelineError("pass 'apply-rules' needs max-iterations >= 1")

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        by_root: dict[str, list[FileRule]] = {}
        for rule in load_rules(self.file):
            if pattern_ops(rule.tgt) >= pattern_ops(rule.src):
                continue
            by_root.setdefault(rule.src.op, []).append(rule)
        patterns = [TablePattern(root, rules) for root, rules in by_root.items()]
        apply_patterns_greedily(
            func,
            patterns,
            self.max_iterations,
            stats,
            pass_name=f"apply-rules on @{func.sym_name}",
        )

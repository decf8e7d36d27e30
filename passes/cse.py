"""`cse`: eliminate common subexpressions.

Two pure ops are the same computation when they have the same name, the same operands (in any
order for a commutative op: `a+b` is `b+a`), the same attributes (compared with
`tgc.attributes.attribute_key`, defaults filled in, so `1` is not `1.0` and an omitted
`transpose_a` equals `transpose_a = false`) and the same result types. The later one is replaced
by the earlier one, which dominates it.

Regions are scopes: an op inside a region may be replaced by an equivalent op of an enclosing
block, never the other way round, and nothing crosses into an isolated-from-above region
(`kernel.fused`). Ops with regions are not merged themselves (their bodies are processed).

Contract: only PURE ops are merged; results and types are unchanged; one hash lookup per op
(linear time).
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.attributes import attribute_key
from tgc.builtin import FuncOp
from tgc.ir import Block, Operation
from tgc.opdef import COMMUTATIVE, ISOLATED, PURE
from tgc.pass_manager import Pass, PassStatistics, register_pass
from tgc.rewriter import Rewriter


def op_key(op: Operation) -> tuple:
    """What makes two pure ops compute the same thing (see the module doc)."""
    operands = tuple(op.operands)
    if COMMUTATIVE in op.traits:
        operands = tuple(sorted(operands, key=id))
    names = op.attributes.keys() | op.attr_defs.keys() if op.attr_defs else op.attributes.keys()
    attrs = tuple(sorted((k, attribute_key(op.attr(k))) for k in names))
    return (op.name, operands, attrs, tuple(r.type for r in op.results))


@register_pass
@dataclass(frozen=True)
class CSE(Pass):
    """Replace a pure op by an earlier equivalent one (see the module doc).

    Contract: never changes results; keys see through commutativity and default attributes;
    respects region scopes and isolated regions; linear time.
    """

    name = "cse"
    summary = "Eliminate common subexpressions"

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        _cse_block(func.body, [{}], Rewriter(), stats)


def _cse_block(block: Block, scopes: list[dict], rewriter: Rewriter, stats: PassStatistics) -> None:
    local = scopes[-1]
    for op in block.ops:
        if op.regions:
            inner = [{}] if ISOLATED in op.traits else scopes
            for region in op.regions:
                for nested in region.blocks:
                    _cse_block(nested, inner + [{}], rewriter, stats)
            continue
        if PURE not in op.traits or not op.results:
            continue
        key = op_key(op)
        existing = _lookup(scopes, key)
        if existing is None:
            local[key] = op
            continue
        rewriter.replace_op(op, existing.results)
        stats.bump("erased-duplicates")


def _lookup(scopes: list[dict], key: tuple) -> Operation | None:
    for scope in reversed(scopes):
        found = scope.get(key)
        if found is not None:
            return found
    return None

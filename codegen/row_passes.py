"""How the reductions of a row-reduction kernel are spread over passes over the row: which
reductions can share a pass with the one they depend on, and after which pass each value of the
region is known. IR analysis only; row_body.py writes the C code of each pass.

Measured on an H100 (bench/results): two passes over register-cached rows beat the merged single
pass (its per-element exp and branch, or Welford's division, cost more than the second block
reduction saves), so merging is a template option (`merge_passes`), off by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation, Value
from tgc.opdef import REDUCTION
from tgc.views import is_unit_reshape


@dataclass
class PassPlan:
    """`online`: {max result: sum-of-exp result} computed together (online softmax);
    `moments`: {sum result: (centred sum-of-squares result, its centre)} computed together;
    `partner`: the second reduction of each merged pair -> the first; `level`: per value, how
    many passes must finish before it is known; `groups`: the reductions each pass computes
    (the first of a merged pair stands for both)."""

    online: dict[Value, Value] = field(default_factory=dict)
    moments: dict[Value, tuple[Value, Value]] = field(default_factory=dict)
    partner: dict[Value, Value] = field(default_factory=dict)
    level: dict[Value, int] = field(default_factory=dict)
    groups: list[list[Operation]] = field(default_factory=list)


def plan_passes(op: FusedOp, reductions: list[Operation], merge: bool) -> PassPlan:
    """The passes of the kernel of `op`; pairs share a pass only when `merge`."""
    online, moments = merged_pairs(op, reductions) if merge else ({}, {})
    partner = {**{s: m for m, s in online.items()}, **{s2: s1 for s1, (s2, _) in moments.items()}}
    level = _levels(op, partner)
    max_level = max(level[r.results[0]] for r in reductions)
    groups = [
        [r for r in reductions if level[r.results[0]] == lv + 1 and r.results[0] not in partner]
        for lv in range(max_level)
    ]
    return PassPlan(online, moments, partner, level, groups)


def _levels(op: FusedOp, partner: dict[Value, Value]) -> dict[Value, int]:
    """How many passes over the row must finish before each value is known (a merged
    reduction is known after the same pass as its partner)."""
    level: dict[Value, int] = {a: 0 for a in op.body.args}
    for inner in op.body.ops:
        base = max((level.get(x, 0) for x in inner.operands), default=0)
        for r in inner.results:
            if inner.has_trait(REDUCTION):
                level[r] = level[partner[r]] if r in partner else base + 1
            else:
                level[r] = base
    return level


def strip_unit_views(v: Value) -> Value:
    """`v` before any broadcasts and unit reshapes (a per-row value read at every column)."""
    while v.defining_op is not None and (
        v.defining_op.name == "atomic.broadcast" or is_unit_reshape(v.defining_op)
    ):
        v = v.defining_op.operands[0]
    return v


def merged_pairs(op: FusedOp, reductions: list[Operation]) -> tuple[dict, dict]:
    """Reductions that can share one pass over the row with the reduction they depend on:
    - online softmax: max(x) and sum(exp(x - max(x))) -> {max result: sum result};
    - moments: s = sum(x) and sum((x - m)^2) with m known from s -> {s result: (second, m)}."""
    online, moments, used = {}, {}, set()
    results = {r.results[0]: r for r in reductions}
    for red in reductions:
        if red.name != "atomic.reduce_sum" or not red.results[0].type.is_float:
            continue
        inner = red.operands[0].defining_op
        if inner is not None and inner.name == "atomic.exp":
            mx = _online_partner(inner, results, used)
            if mx is not None and red not in used:
                online[mx.results[0]] = red.results[0]
                used |= {mx, red}
            continue
        if (
            inner is None
            or inner.name != "atomic.mul"
            or inner.operands[0] is not inner.operands[1]
        ):
            continue
        found = _moments_partner(op, red, inner, reductions, used)
        if found is not None:
            first, centre = found
            moments[first.results[0]] = (red.results[0], centre)
            used |= {first, red}
    return online, moments


def _online_partner(exp: Operation, results: dict[Value, Operation], used: set):
    """For sum(exp(x - m)): the unused reduce_max(x) that m is (through unit views), or None."""
    sub = exp.operands[0].defining_op
    if sub is None or sub.name != "atomic.sub":
        return None
    mx = results.get(strip_unit_views(sub.operands[1]))
    if (
        mx is not None
        and mx.name == "atomic.reduce_max"
        and mx.operands[0] is sub.operands[0]
        and mx not in used
    ):
        return mx
    return None


def _moments_partner(
    op: FusedOp, red: Operation, square: Operation, reductions: list[Operation], used: set
):
    """For red = sum((x - c)^2): (the unused reduce_sum(x), c) when c depends only on that
    sum's result and constants, or None."""
    sub = square.operands[0].defining_op
    if sub is None or sub.name != "atomic.sub":
        return None
    x, centre = sub.operands[0], strip_unit_views(sub.operands[1])
    first = next(
        (
            r
            for r in reductions
            if r.name == "atomic.reduce_sum"
            and r.operands[0] is x
            and r is not red
            and r not in used
        ),
        None,
    )
    if first is None or red in used or not _depends_only_on(centre, first):
        return None
    return first, centre


def _depends_only_on(v: Value, reduction: Operation) -> bool:
    """True when the per-row value `v` is computed from `reduction`'s result and constants."""
    stack, seen = [v], set()
    found = False
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x is reduction.results[0]:
            found = True
            continue
        d = x.defining_op
        if d is None or d.has_trait(REDUCTION) or d.name == "atomic.matmul":
            return False
        stack.extend(d.operands)
    return found

"""Small sibling kernels in one launch (horizontal fusion), after a plan is written: calls of a
generated template whose kernels can run as the parts of one launch (`Template.parts`: the
elementwise template, codegen/elementwise.py `_generate_parts`), each writing at most
`MAX_ELEMENTS` elements, that read nothing another of them writes, become one call whose region
holds all of theirs.

Why: a Llama's decoding step computes, each layer, the rotary embedding of q and of k and two
position counters (the cache's write index and the next position): four launches of a few
hundred elements each, siblings of different shapes that producer fusion cannot join, each
costing the device a launch (about 1.5 us on an H200, bench/results/decode_step-*) for almost
no work. Small only: a large kernel's launch is a small share of it, and its measured time is
what the planner chose it by.

The merged call stands where the last of its members stood, so every value it reads is
defined before it (an op between two members may define what the later one reads, and none
reads what an earlier member writes: a run ends at the first op that does). Once-computed calls
(`plan.once`) are left alone. The call carries the callee, `plan.backend`, the sum of its
members' `plan.seconds` and `plan.source` "merged"; its template parameters are the
template's defaults.
"""

from __future__ import annotations

from tgc.builtin import FuncOp
from tgc.dialects.kernel import CallOp, YieldOp
from tgc.ir import Block, Region, Value, clone_body
from tgc.opdef import create
from tgc.planner.backends import TEMPLATES
from tgc.planner.fixed import ONCE_ATTR

MAX_ELEMENTS = 1 << 16  # of each result of a call merged


def merge_siblings(func: FuncOp) -> int:
    """Merge the runs of small independent calls of part-able templates in `func`'s body (the
    module doc); how many calls fewer there are."""
    block = func.body
    fewer = 0
    run: list[CallOp] = []
    written: set[Value] = set()
    for op in list(block.ops):
        reads_run = any(v in written for v in op.operands)
        if op is block.last or reads_run:
            fewer += _merge(block, run)
            run, written = [], set()
        if op is not block.last and _mergeable(op):
            run.append(op)
            written.update(op.results)
    return fewer


def _mergeable(op) -> bool:
    if not isinstance(op, CallOp) or ONCE_ATTR in op.attributes or not op.regions:
        return False
    template = TEMPLATES.get(op.attr("callee"))
    return (
        template is not None
        and template.parts
        and all(r.type.num_elements <= MAX_ELEMENTS for r in op.results)
    )


def _merge(block: Block, run: list[CallOp]) -> int:
    """One call for the calls of `run`, where the last of them stands; the calls fewer."""
    if len(run) < 2:
        return 0
    operands: list[Value] = []
    for call in run:
        operands += [v for v in call.operands if v not in operands]
    body = Block([v.type for v in operands])
    outer = dict(zip(operands, body.args))
    yields: list[Value] = []
    for call in run:
        env = {a: outer[v] for a, v in zip(call.body.args, call.operands)}
        yields += clone_body(call.body, body, env)
    last = run[-1]
    body.append(YieldOp(yields, [], loc=last.loc))
    attrs = {
        "callee": last.attr("callee"),
        "plan.backend": last.attributes["plan.backend"],
        "plan.seconds": float(f"{sum(c.attributes['plan.seconds'] for c in run):.4g}"),
        "plan.source": "merged",
    }
    results = [r for call in run for r in call.results]
    merged = create(CallOp, operands, attrs, [r.type for r in results], [Region([body])], last.loc)
    block.insert_before(merged, last)
    for old, new in zip(results, merged.results):
        new.name_hint = old.name_hint
        old.replace_all_uses_with(new)
    for call in run:
        call.erase()
    return len(run) - 1


__all__ = ["MAX_ELEMENTS", "merge_siblings"]

"""Why a kernel was not used: `tgc-plan --why-not KERNEL`.

For each place the kernel could apply (an op of its op kernel's name, or of the name its
reference graph ends in), one line saying what happened there: refused by the planning context
(its backend not among those planned with, its stated error above the tolerance), refused by its
constraints, not matched (the first reference op that has no counterpart in the program, found
by the deepest partial match: another op, other attributes, a constant of another value, a
covered value also read outside), matched but cut by the plan's segments, or an option that
lost (its total beside the chosen option's), or chosen.
"""

from __future__ import annotations

import math

from tgc.builtin import FuncOp
from tgc.ir import Operation
from tgc.planner.kernel import Kernel, canonical_references, reference_root
from tgc.planner.match import _Matcher, _same_op, accepts, matches_at


def why_not(kernel: Kernel, func: FuncOp, ctx, selection, describe) -> list[str]:
    """Lines saying why `kernel` is or is not in `selection`'s plan of `func` (`describe`
    names an op as the plan's printout does)."""
    if not ctx.allows(kernel):
        if kernel.max_rel_error > ctx.tolerance:
            return [
                f"{kernel.name}: its stated error {kernel.max_rel_error:g} exceeds the "
                f"tolerance {ctx.tolerance:g}"
            ]
        return [f"{kernel.name}: its backend {kernel.backend} is not among those planned with"]
    roots = _root_names(kernel)
    places = [op for op in func.body.ops if op.name in roots]
    if not places:
        what = " or ".join(sorted(roots))
        return [f"{kernel.name}: the function has no {what}, where it would end"]
    chosen = {id(s.option.root): s.option for s in selection.plan.steps}
    alternatives = {id(step.option.root): alts for step, alts in selection.alternatives.items()}
    return [
        f"{describe(op)}: {_at(kernel, op, chosen.get(id(op)), alternatives.get(id(op), []))}"
        for op in places
    ]


def _root_names(kernel: Kernel) -> set[str]:
    if kernel.op is not None:
        return {kernel.op}
    return {reference_root(ref).name for ref in canonical_references(kernel)}


def _at(kernel: Kernel, op: Operation, chosen, alternatives) -> str:
    matches = [m for m in matches_at(op, [kernel]) if m.kernel is kernel]
    if not matches:
        return _no_match(kernel, op)
    for option, total in alternatives:
        if option.kernel is kernel:
            if chosen is not None and chosen.kernel is kernel:
                return f"chosen ({total:.3e} s)"
            best_name = chosen.label if chosen is not None else "another option"
            best = alternatives[0][1] if alternatives else float("nan")
            return f"an option at {total:.3e} s; {best_name} costs {best:.3e} s"
    if chosen is not None and chosen.kernel is kernel:
        return "chosen"
    return (
        "matched, but not an option of the plan: the match reads a value cut from it by a "
        "segment (a value several ops read) or one inside another kernel"
    )


def _no_match(kernel: Kernel, op: Operation) -> str:
    types_in = [v.type for v in op.operands]
    if kernel.op is not None:
        types_out = [r.type for r in op.results]
        if not accepts(kernel, types_in, types_out):
            reason = kernel.constraints((types_in, types_out))
            return f"refused by its constraints: {reason}"
        return "not matched"
    deepest: tuple[float, str] = (-1, "not matched")
    for ref in canonical_references(kernel):
        found = _deepest_mismatch(kernel, ref, op)
        if found[0] > deepest[0]:
            deepest = found
    return deepest[1]


class _Recording(_Matcher):
    """A matcher that remembers the deepest place a binding failed."""

    def __init__(self, block, shape_constants: bool) -> None:
        super().__init__(block, shape_constants)
        self.deepest: tuple[int, str] = (-1, "not matched")

    def value(self, rv, pv):
        r_op, p_op = rv.defining_op, pv.defining_op
        if r_op is not None and p_op is not None and r_op not in self.ops:
            if not _same_op(r_op, p_op):
                self._note(_difference(r_op, p_op))
            elif p_op.block is not self.block and p_op.name != "atomic.constant":
                self._note(f"{_op(p_op)} is in another block")
        elif r_op is not None and p_op is None:
            self._note(f"the reference's {r_op.name} meets an argument of the function")
        yield from super().value(rv, pv)

    def _note(self, reason: str) -> None:
        if len(self.ops) > self.deepest[0]:
            self.deepest = (len(self.ops), reason)


def _deepest_mismatch(kernel: Kernel, ref, op: Operation) -> tuple[int, str]:
    returned = ref.body.last.operands[0]
    if returned.index >= len(op.results):
        return (-1, "the reference returns another result")
    recorder = _Recording(op.block, kernel.shape_constants)
    output = op.results[returned.index]
    for _ in recorder.value(returned, output):  # the whole graph binds: what refused it
        types_in = [recorder.args[a].type for a in ref.body.args]
        reason = kernel.constraints((types_in, [output.type]))
        if reason is not None:
            return (math.inf, f"refused by its constraints: {reason}")
        return (math.inf, "matched, but a value it covers is also read outside it")
    return recorder.deepest


def _difference(r: Operation, p: Operation) -> str:
    if r.name != p.name:
        return f"the reference has {r.name} where the program has {_op(p)}"
    if r.name == "atomic.constant":
        a = r.attr("value").array.reshape(-1)[:4].tolist()
        b = p.attr("value").array.reshape(-1)[:4].tolist()
        return (
            f"the reference's constant {a} is {b} in the program ({_op(p)}); if it is a "
            "function of a size, give the kernel shape_constants=True"
        )
    return f"the reference's {r.name} has other attributes or types than {_op(p)}"


def _op(op: Operation) -> str:
    line = f" at line {op.loc.line}" if op.loc is not None and op.loc.line else ""
    return f"{op.name}{line}"

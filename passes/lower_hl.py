"""`lower-hl`: replace hl ops by their decompositions into lower ops."""

from __future__ import annotations

from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.diagnostics import TgcError
from tgc.dialects.hl import HLOp
from tgc.ir import Operation
from tgc.opdef import OPS
from tgc.pass_manager import Pass, PassStatistics, PipelineError, option, register_pass
from tgc.rewriter import RewriteListener, Rewriter


def hl_op_names() -> list[str]:
    return sorted(name for name, cls in OPS.items() if issubclass(cls, HLOp))


def resolve_op_names(names: tuple[str, ...], option: str = "ops") -> frozenset[str]:
    """`softmax` or `hl.softmax` -> `hl.softmax`; no names means every hl op."""
    known = hl_op_names()
    if not names:
        return frozenset(known)
    out = set()
    for name in names:
        full = name if name.startswith("hl.") else f"hl.{name}"
        if full not in known:
            listed = ", ".join(n.removeprefix("hl.") for n in known)
            raise PipelineError(
                f"pass 'lower-hl': option '{option}' names '{name}', which is not an hl op "
                f"(hl ops: {listed})"
            )
        out.add(full)
    return frozenset(out)


class _Inserted(RewriteListener):
    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def on_insert(self, op: Operation) -> None:
        self.ops.append(op)


@register_pass
@dataclass(frozen=True)
class LowerHL(Pass):
    """Replace each selected hl op by its decomposition (`decompose`, next to the op in
    dialects/hl.py), repeatedly, until no selected hl op remains: an op whose decomposition uses
    other selected hl ops (silu -> sigmoid, attention -> softmax) is lowered all the way.

    Contract: `ops` lists the ops to lower (`softmax` or `hl.softmax`; empty: every hl op) and
    `keep` the ops not to lower (`lower-hl{keep=attention}`: every hl op but attention); hl ops
    not selected are left alone, also when a decomposition emits them. An unknown name is a usage
    error. Results are unchanged up to rounding (checked in float64 by test/test_lower_hl.py).
    Every new op takes the location of the hl op it replaces; the replacement of a named value
    keeps its source name. Ops inside regions are lowered too.
    """

    name = "lower-hl"
    summary = "Replace hl ops by their decompositions into lower ops"

    ops: tuple[str, ...] = option((), "the hl ops to lower (empty: every one)")
    keep: tuple[str, ...] = option((), "the hl ops not to lower")

    def __post_init__(self) -> None:
        self.selected()  # fail when the pipeline is parsed, not when it runs

    def selected(self) -> frozenset[str]:
        kept = resolve_op_names(self.keep, "keep") if self.keep else frozenset()
        return resolve_op_names(self.ops) - kept

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        selected = self.selected()
        listener = _Inserted()
        rewriter = Rewriter(listener)
        # Each pending op carries the names of the ops whose decomposition produced it: an op
        # that reappears in its own expansion would never finish (register_hl checks the
        # docstring examples; this catches the attribute combinations they do not show).
        pending = [(op, ()) for op in func.walk() if op.name in selected]
        pending.reverse()
        while pending:
            op, chain = pending.pop()
            if op.name in chain:
                path = " -> ".join(chain + (op.name,))
                raise TgcError(
                    f"'{op.name}' op: its decomposition contains itself ({path})", op.loc
                )
            listener.ops = []
            results = op.decompose(rewriter.builder_before(op))
            rewriter.replace_op(op, results)
            stats.bump(f"lowered {op.name}")
            inner = [(new, chain + (op.name,)) for new in listener.ops if new.name in selected]
            pending += reversed(inner)

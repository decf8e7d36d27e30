"""Where a kernel applies: matching kernels against a function's ops.

(Stub: op kernels only. Graph kernels, matched by canonical form, come next.)
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.ir import Operation, Value
from tgc.planner.kernel import KERNELS, Kernel


@dataclass(frozen=True, eq=False)
class Match:
    """A kernel applied at `root`: the ops it covers (block order, root last), the program values
    bound to its arguments (in the kernel's argument order), and the values it produces."""

    kernel: Kernel
    root: Operation
    ops: tuple[Operation, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]


def _types(op: Operation):
    return [v.type for v in op.operands], [r.type for r in op.results]


def matches_at(op: Operation, kernels: list[Kernel] | None = None) -> list[Match]:
    """Every match of a registered kernel (or of `kernels`) whose root is `op`."""
    out = []
    for k in KERNELS.values() if kernels is None else kernels:
        if k.op == op.name and k.constraints(_types(op)) is None:
            out.append(Match(k, op, (op,), tuple(op.operands), tuple(op.results)))
    return out

"""`dce`: erase dead pure ops.

A pure op none of whose results is used is erased. Blocks are walked from the end, so a chain
of dead ops goes in one pass: erasing a user leaves its producers (which come earlier) dead when
they are reached. Nested regions are processed before the earlier ops of their block.

Contract: only ops with the PURE trait are erased (side effects and terminators stay); results
of the function are unchanged; linear time.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.pass_manager import Pass, PassStatistics, register_pass
from tgc.patterns import erase_dead_ops


@register_pass
@dataclass(frozen=True)
class DCE(Pass):
    """Erase pure ops whose results are unused (see the module doc).

    Contract: never changes results; erases only PURE ops; one reverse walk (linear time).
    """

    name = "dce"
    summary = "Erase dead pure ops"

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        erase_dead_ops(func.body, stats, "erased-ops")

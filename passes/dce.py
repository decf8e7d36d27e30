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
from tgc.ir import Block
from tgc.pass_manager import Pass, PassStatistics, register_pass
from tgc.patterns import is_trivially_dead
from tgc.rewriter import Rewriter


@register_pass
@dataclass(frozen=True)
class DCE(Pass):
    """Erase pure ops whose results are unused (see the module doc).

    Contract: never changes results; erases only PURE ops; one reverse walk (linear time).
    """

    name = "dce"
    summary = "Erase dead pure ops"

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        _dce_block(func.body, Rewriter(), stats)


def _dce_block(block: Block, rewriter: Rewriter, stats: PassStatistics) -> None:
    for op in block.ops_reversed():
        if is_trivially_dead(op):
            rewriter.erase_op(op)
            stats.bump("erased-ops")
            continue
        for region in op.regions:
            for nested in region.blocks:
                _dce_block(nested, rewriter, stats)

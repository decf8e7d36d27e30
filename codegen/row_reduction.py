"""The row-reduction template: reductions over the same axes of one shape, each row handled by a
warp or a block, with the ops before them as their prologue and the ops after as their epilogue
(outputs of the full shape or with one value per row).

The decisions are plain data, each made in its own module: the layout and launch shape
(row_layout.py), which reductions share a pass over the row (row_passes.py), and the C
statements (row_body.py); this module checks them together and fills row_reduction.cu.j2.
Template parameters beyond row_layout.py's: `merge_passes` (online softmax and moments in one
pass), `keep_in_registers` (a reduction operand read again later stays in registers),
`streaming` (evict-first vector loads and stores); `rows_per_block` is recorded, not read.
"""

from __future__ import annotations

import math

from tgc.codegen.render import KernelSource, idx_type, kernel_label, params_decl, render
from tgc.codegen.row_body import RowBody, RowText
from tgc.codegen.row_layout import RowLaunch, RowLayout, row_launch, row_layout
from tgc.codegen.row_passes import plan_passes
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation
from tgc.opdef import REDUCTION


def reductions_of(op: FusedOp) -> list[Operation]:
    """The reductions of the region, in program order."""
    return [inner for inner in op.body.ops if inner.has_trait(REDUCTION)]


def generate_row_reduction(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    """The row-reduction kernel of `op`."""
    decls, ptrs, outs = params_decl(op)
    reductions = reductions_of(op)
    layout = row_layout(op, reductions)
    ptrs.update({v: ptrs[a] for v, a in layout.read_through.items()})
    launch = row_launch(op, layout, params)
    plan = plan_passes(op, reductions, params.setdefault("merge_passes", False))
    keep = params.setdefault("keep_in_registers", True)
    text = RowBody(op, layout, launch, plan, ptrs, keep).emit(outs)
    if not layout.suffix and layout.full_yields:
        raise TgcError(f"kernel '{kernel_label(op)}' writes full rows of a non-suffix reduction")
    source = render(
        "row_reduction.cu.j2",
        name=symbol,
        params=decls,
        idx_t=idx_type(op),
        **_template_data(layout, launch, text, params),
    )
    params["rows_per_block"] = launch.rows_per_block
    grid = (max(1, math.ceil(layout.nrows / launch.rows_per_block)), 1, 1)
    return KernelSource(
        symbol,
        source,
        "row_reduction",
        len(op.operands),
        len(op.results),
        grid,
        (launch.block_size, 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


def _template_data(layout: RowLayout, launch: RowLaunch, text: RowText, params: dict) -> dict:
    """What row_reduction.cu.j2 reads besides the kernel's name, parameters and index type."""
    return {
        "nrows": layout.nrows,
        "ncols": layout.ncols,
        "warp_per_row": launch.warp_per_row,
        "block_size": launch.block_size,
        "tpr": launch.tpr,
        "chunks": launch.chunks,
        "vec": launch.vec,
        "unroll": launch.unroll,
        "cached": text.cached,
        "smem": text.smem,
        "before": text.before,
        "stream": "true" if params.setdefault("streaming", False) else "false",
        "kept": text.kept,
        "passes": text.passes,
        "full_outputs": text.full_outputs,
        "output_body": text.output_body,
        "row_outputs": bool(layout.row_yields),
        "row_output_body": text.row_output_body,
    }

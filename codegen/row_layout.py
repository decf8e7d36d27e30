"""The decisions of a row-reduction kernel that are plain numbers: which dims are rows and which
are reduced (the layout), and how the rows are spread over threads (the launch shape).

Template parameters read here: `vector_width`, `warp_per_row_max` (rows up to this many columns
get one warp each; longer ones a block), `block_size`, `register_cache_limit` (the most
elements of cached input rows a thread keeps in registers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.codegen.emitter import Coords, canon, delinearize
from tgc.codegen.render import kernel_label, yields_of
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation, Value
from tgc.types import ELEMENT_BYTES


@dataclass(frozen=True)
class RowLayout:
    """The reduced tensor of shape `full` seen as `nrows` rows of `ncols` columns; row r and
    column c index it at `full_coords` (C expressions of r and c)."""

    full: tuple[int, ...]
    red_axes: list[int]
    row_axes: list[int]
    suffix: bool  # the reduced axes are the last ones: a row is contiguous
    row_shape: tuple[int, ...]
    col_shape: tuple[int, ...]
    keep_shape: tuple[int, ...]  # `full` with the reduced axes kept as 1
    nrows: int
    ncols: int
    row_coords: Coords
    col_coords: Coords
    full_coords: Coords
    full_args: list[Value]  # inputs of the full shape, read along rows (suffix only)
    # a reshape to the full shape of an input of its elements -> that input: read as a full
    # input from the input's memory (a group norm's [n, c, h, w] seen as its rows)
    read_through: dict[Value, Value]
    full_yields: list[int]  # outputs of the full shape, or of its elements reshaped (suffix)
    row_yields: list[int]  # outputs with one value per row

    def full_coords_of(self, shape: tuple[int, ...]) -> Coords:
        """The coordinates of row r, column c in a value of `shape`: the full shape, or (suffix
        only) another shape of its elements in the same order, where element (r, c) is the
        one at r * ncols + c."""
        if shape == self.full:
            return self.full_coords
        return canon(shape, delinearize(f"(r * {self.ncols} + c)", shape))

    def scalar_coords(self, shape: tuple[int, ...]) -> Coords:
        """The coordinates of row r in a per-row value of `shape` (row_shape or keep_shape)."""
        if shape == self.row_shape:
            return self.row_coords
        return tuple(
            self.full_coords[d] if d in self.row_axes else "0" for d in range(len(self.full))
        )


@dataclass(frozen=True)
class RowLaunch:
    """How rows map to threads: a warp per row (`warp_per_row`) or a block per row; each of the
    `tpr` threads of a row reads `chunks` chunks of `vec` columns."""

    vec: int
    warp_per_row: bool
    block_size: int
    tpr: int
    chunks: int
    unroll: int
    cached_args: list[Value]  # full inputs whose row slice is kept in registers
    rows_per_block: int


def row_layout(op: FusedOp, reductions: list[Operation]) -> RowLayout:
    """The rows of `op`: every reduction must reduce the same shape over the same axes, and
    every output be either of that shape or have one value per row."""
    first = reductions[0]
    full = first.operands[0].type.shape
    red_axes = sorted(first.axes())
    for r in reductions:
        if r.operands[0].type.shape != full or sorted(r.axes()) != red_axes:
            raise TgcError(f"kernel '{kernel_label(op)}' reduces over different rows", r.loc)
    row_axes = [d for d in range(len(full)) if d not in red_axes]
    suffix = red_axes == list(range(len(full) - len(red_axes), len(full)))
    row_shape = tuple(full[d] for d in row_axes)
    col_shape = tuple(full[d] for d in red_axes)
    row_coords, col_coords = delinearize("r", row_shape), delinearize("c", col_shape)
    coords = [""] * len(full)
    for d, c in zip(row_axes, row_coords):
        coords[d] = c
    for d, c in zip(red_axes, col_coords):
        coords[d] = c
    yields = yields_of(op)
    numel = math.prod(full)
    # A reshape keeps the elements' order: with the reduced axes last, the elements of row r
    # are r * ncols + c in a reshaped value too (fuse groups a group norm's affine so)
    full_yields = [
        j
        for j, y in enumerate(yields)
        if y.type.shape == full or (suffix and math.prod(y.type.shape) == numel)
    ]
    row_yields = [j for j in range(len(yields)) if j not in full_yields]
    nrows = math.prod(row_shape)
    for j in row_yields:
        if math.prod(yields[j].type.shape) != nrows:
            raise TgcError(
                f"kernel '{kernel_label(op)}' yields a value that is neither a row "
                f"nor one value per row",
                op.loc,
            )
    read_through = {
        inner.results[0]: inner.operands[0]
        for inner in op.body.ops
        if suffix
        and inner.name == "atomic.reshape"
        and inner.results[0].type.shape == full
        and inner.operands[0] in op.body.args
        and math.prod(inner.operands[0].type.shape) == numel
    }
    return RowLayout(
        full=full,
        red_axes=red_axes,
        row_axes=row_axes,
        suffix=suffix,
        row_shape=row_shape,
        col_shape=col_shape,
        keep_shape=tuple(1 if d in red_axes else full[d] for d in range(len(full))),
        nrows=nrows,
        ncols=math.prod(col_shape),
        row_coords=row_coords,
        col_coords=col_coords,
        full_coords=canon(full, tuple(coords)),
        full_args=[a for a in op.body.args if a.type.shape == full] + list(read_through)
        if suffix
        else [],
        read_through=read_through,
        full_yields=full_yields,
        row_yields=row_yields,
    )


def row_launch(op: FusedOp, layout: RowLayout, params: dict) -> RowLaunch:
    """The launch shape, from the template parameters where given (and recorded in `params`)."""
    vec = int(params.setdefault("vector_width", _natural_vector_width(op, layout)))
    warp_max = int(params.setdefault("warp_per_row_max", 1024))
    warp_per_row = layout.ncols <= warp_max
    if warp_per_row:
        block_size = int(params.setdefault("block_size", 128))
        tpr = 32
    else:
        per_thread = max(1, math.ceil(layout.ncols / vec / 4))
        guess = 1 << max(6, math.ceil(math.log2(per_thread)))
        block_size = int(params.setdefault("block_size", min(1024, guess)))
        tpr = block_size
    chunks = math.ceil(layout.ncols / (tpr * vec))
    cache_limit = int(params.setdefault("register_cache_limit", 64))
    full_args = layout.full_args
    return RowLaunch(
        vec=vec,
        warp_per_row=warp_per_row,
        block_size=block_size,
        tpr=tpr,
        chunks=chunks,
        unroll=chunks if chunks * vec <= 64 else 4,
        cached_args=full_args if chunks * vec * len(full_args) <= cache_limit else [],
        rows_per_block=block_size // 32 if warp_per_row else 1,
    )


def _natural_vector_width(op: FusedOp, layout: RowLayout) -> int:
    """Columns per 16-byte access of the widest full-row value, when rows split into them."""
    yields = yields_of(op)
    widest = max(
        [ELEMENT_BYTES[a.type.element_type] for a in layout.full_args]
        + [ELEMENT_BYTES[yields[j].type.element_type] for j in layout.full_yields]
        + [1]
    )
    width = max(1, 16 // widest)
    return width if layout.suffix and layout.ncols % width == 0 else 1

"""A fixed kernel beside the templates: `atomic.write_rows`, a few rows written into a tensor.

A KV cache's update writes one row per layer per decode step into a cache of thousands; the
planner runs it in the cache's own memory where nothing else reads the old cache
(tgc/donation.py), and otherwise after a copy of it. This kernel writes the rows only: block
(j, c) writes chunk c of values' row j into x's row indices[j], unless a later j names the same
row (the last row given for an index wins, as the op's meaning says). An index out of range
writes nothing (the op's numpy meaning raises).
"""

from __future__ import annotations

import math

from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.names import c_identifier
from tgc.codegen.render import INT32_LIMIT, KernelSource, render
from tgc.types import TensorType

BLOCK_SIZE = 256
MAX_CHUNKS = 64  # blocks per row; past that, threads stride over the rest of the row


def write_rows_kernel(
    x: TensorType, indices: TensorType, axis: int, name: str | None = None
) -> KernelSource:
    """The kernel `(values, indices, out)` writing values' rows into `out`, a tensor of type
    `x` (x itself, or a copy of it), at `indices` along `axis`; `name` its C name (by default
    one made of the shapes)."""
    axis %= x.rank
    outer, size = math.prod(x.shape[:axis]), x.shape[axis]
    inner, n = math.prod(x.shape[axis + 1 :]), indices.shape[0]
    name = name or c_identifier(
        f"write_rows_{outer}x{size}x{inner}_{n}_{x.element_type}_{indices.element_type}"
    )
    source = render(
        "write_rows.cu.j2",
        name=name,
        ctype=STORAGE_CTYPE[x.element_type],
        itype=STORAGE_CTYPE[indices.element_type],
        idx_t="long long" if x.num_elements > INT32_LIMIT else "int",
        outer=outer,
        size=size,
        inner=inner,
        n=n,
        block_size=BLOCK_SIZE,
    )
    chunks = max(1, min(MAX_CHUNKS, -(-outer * inner // BLOCK_SIZE)))
    grid, block = (n, chunks, 1), (BLOCK_SIZE, 1, 1)
    return KernelSource(name, source, "write_rows", 2, 1, grid, block, params={"axis": axis})

"""A fixed kernel beside the templates: rows read with a padded pitch, written compact.

cuda.cublas.gemm_padded (planner/backends/cuda_kernels.py) writes a product whose rows are not
16-byte multiples into padded rows, where cuBLAS runs at full speed, and then needs them
compact. cudaMemcpy2D did that well below the memory's bandwidth for GPT-2's logits
(bench/results/design-evidence-2026-11-28.md); this kernel stores whole 16-byte vectors of the
output and reads each row in order.
"""

from __future__ import annotations

from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.names import c_identifier
from tgc.codegen.render import INT32_LIMIT, KernelSource, render
from tgc.types import ELEMENT_BYTES

BLOCK_SIZE = 256
MAX_BLOCKS = 132 * 16  # 16 blocks per SM of an H100/H200; past that, threads stride over the rest


def compact_rows_kernel(
    rows: int, n: int, ld: int, element_type: str, name: str | None = None
) -> KernelSource:
    """The kernel `(src, dst)`: dst[r, c] = src[r * ld + c] for r < rows, c < n; `name` its C
    name (by default one made of the shape)."""
    vec = 16 // ELEMENT_BYTES[element_type]
    name = name or c_identifier(f"compact_rows_{rows}x{n}_ld{ld}_{element_type}")
    idx_t = "long long" if rows * ld > INT32_LIMIT else "int"
    source = render(
        "compact_rows.cu.j2",
        name=name,
        rows=rows,
        n=n,
        ld=ld,
        ctype=STORAGE_CTYPE[element_type],
        vec=vec,
        idx_t=idx_t,
        block_size=BLOCK_SIZE,
    )
    blocks = int(min(MAX_BLOCKS, max(1, -(-rows * n // (vec * BLOCK_SIZE)))))
    return KernelSource(name, source, "compact_rows", 1, 1, (blocks, 1, 1), (BLOCK_SIZE, 1, 1))

"""What the CUDA kernels can run: facts that the passes (`fuse`), code generation and the
planner's CUDA backend all decide with. They live here, below all three, so that code
generation imports no pass (docs/architecture.md, Layers).

- `attention_supported(op)`: the fused attention kernel (template `attention`) runs this
  `hl.attention` (f32/bf16/f16, head dims <= 128, no empty dim);
- `cublas_can_run(op)`: cuBLAS runs this `atomic.matmul` (each operand batched like the result
  or unbatched; float element types).
"""

from __future__ import annotations

from tgc.ir import Operation

ATTENTION_TYPES = ("f32", "bf16", "f16")
MAX_HEAD_DIM = 128
GEMM_TYPES = ("f32", "f64", "f16", "bf16")


def attention_supported(op: Operation) -> bool:
    """Can the fused kernel run this `hl.attention`? f32/bf16/f16, head dims <= 128."""
    q, k, v = (x.type for x in op.operands[:3])
    if q.element_type not in ATTENTION_TYPES:
        return False
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return False
    if min(q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]) < 1:
        return False
    return op.results[0].type.num_elements > 0


def cublas_can_run(op: Operation) -> bool:
    """cuBLAS runs a matmul whose operands are each either batched like the result or unbatched."""
    out = op.results[0].type
    if out.element_type not in GEMM_TYPES:
        return False
    batch = out.shape[:-2]
    for x in op.operands:
        xb = x.type.shape[:-2]
        if tuple(xb) != tuple(batch) and any(d != 1 for d in xb):
            return False
    return True


__all__ = ["ATTENTION_TYPES", "GEMM_TYPES", "MAX_HEAD_DIM", "attention_supported", "cublas_can_run"]

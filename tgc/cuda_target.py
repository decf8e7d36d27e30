"""What the CUDA kernels can run: facts that the passes (`fuse`), code generation and the
planner's CUDA backend all decide with. They live here, below all three, so that code
generation imports no pass (docs/architecture.md, Layers).

- `attention_supported(op)`: the fused attention kernel (template `attention`) runs this
  `hl.attention` (f32/bf16/f16, head dims <= 128, bf16/f16 head dims in steps of 8 up to 256,
  no empty dim);
- `cublas_can_run(op)`: cuBLAS runs this `atomic.matmul` (each operand batched like the result
  or unbatched; float element types);
- `conv_misfit(op)`: why the generated implicit-GEMM convolution (template `conv`) does not
  run this `hl.conv1d/2d/3d`, or None: it takes bf16/f16 (tensor cores), groups whose output
  channels fill at least one 8-wide mma tile (a depthwise convolution is cuDNN's), no empty
  dim. Where it refuses, the planner keeps cuDNN and the im2col decomposition.
- `gpu_limits(arch)`: what a kernel may take on a GPU of that architecture (its shared memory
  a block and an SM, its SMs), the one record the generators size their kernels by; sm_90's
  where the architecture is not named or not known.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.ir import Operation

ATTENTION_TYPES = ("f32", "bf16", "f16")
MAX_HEAD_DIM = 128  # the exact f32 kernel's
# The tensor-core kernel's: bf16/f16 head dims in steps of 8 (one 16-byte copy) up to 256
TC_TYPES = ("bf16", "f16")
TC_HEAD_DIM_STEP = 8
TC_MAX_HEAD_DIM = 256

# The shared memory the system keeps of each block on sm_80 and later
SHARED_RESERVED_PER_BLOCK = 1024


@dataclass(frozen=True)
class GpuLimits:
    """What kernels may take on one GPU architecture: CUDA's shared memory limits of its compute
    capability (the most a block may opt into, and an SM's), and the multiprocessors of the
    part tgc expects of it (a smaller part of the same architecture runs the same kernels in
    more waves)."""

    sms: int
    shared_per_block: int
    shared_per_sm: int

    def blocks_by_shared(self, shared_bytes: int) -> int:
        """How many blocks of `shared_bytes` of dynamic shared memory an SM holds at once (the
        system takes 1 KB more of each block on sm_80 and later)."""
        return self.shared_per_sm // (shared_bytes + SHARED_RESERVED_PER_BLOCK)


GPU_LIMITS = {
    "sm_80": GpuLimits(sms=108, shared_per_block=163 * 1024, shared_per_sm=164 * 1024),  # A100
    "sm_86": GpuLimits(sms=84, shared_per_block=99 * 1024, shared_per_sm=100 * 1024),  # A40
    "sm_89": GpuLimits(sms=128, shared_per_block=99 * 1024, shared_per_sm=100 * 1024),  # 4090
    "sm_90": GpuLimits(sms=132, shared_per_block=227 * 1024, shared_per_sm=228 * 1024),  # H100
}
# The architecture assumed where a kernel's is not named (kernels for any sm_80 or later, the
# tests' stand-in devices) or not in the table: the one tgc is measured on (H100 SXM, H200).
ASSUMED_ARCH = "sm_90"


def gpu_limits(arch: str | None) -> GpuLimits:
    """`arch`'s limits (nvcc's name, "sm_90"); ASSUMED_ARCH's where it is None or unknown."""
    return GPU_LIMITS.get(arch or ASSUMED_ARCH, GPU_LIMITS[ASSUMED_ARCH])


GEMM_TYPES = ("f32", "f64", "f16", "bf16")
CONV_OPS = ("hl.conv1d", "hl.conv2d", "hl.conv3d")
CONV_TYPES = ("bf16", "f16")
# The least output channels per group worth an mma tile (n = 8): below it most of each tile's
# products are zeros (a depthwise convolution has one channel per group).
CONV_MIN_GROUP_CHANNELS = 8


def attention_supported(op: Operation) -> bool:
    """Can the fused kernel run this `hl.attention`? f32/bf16/f16, head dims <= 128; bf16/f16
    head dims in steps of 8 up to 256 (the tensor-core kernel's: where q, k or v rows are no
    16-byte copies the generator refuses such a region and the planner keeps another kernel)."""
    q, k, v = (x.type for x in op.operands[:3])
    if q.element_type not in ATTENTION_TYPES:
        return False
    d, dv = q.shape[-1], v.shape[-1]
    tensor_cores = q.element_type in TC_TYPES and d % TC_HEAD_DIM_STEP == dv % TC_HEAD_DIM_STEP == 0
    if max(d, dv) > (TC_MAX_HEAD_DIM if tensor_cores else MAX_HEAD_DIM):
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


def conv_misfit(op: Operation) -> str | None:
    """Why the implicit-GEMM convolution kernel cannot run convolution `op`, or None. The
    reasons are one line each, for the planner's explanations and the generator's errors."""
    if op.name not in CONV_OPS:
        return f"it runs {', '.join(CONV_OPS)}, not {op.name}"
    x, w = op.operands[0].type, op.operands[1].type
    y = op.results[0].type
    if y.element_type not in CONV_TYPES:
        # f32 stays with cuDNN (or the decomposition): mma.sync takes 16-bit operands, and a
        # TF32 product would not be within an f32 kernel's error bound
        return f"the tensor-core convolution takes bf16 and f16, not {y.element_type}"
    if any(t.element_type != y.element_type for t in (*(v.type for v in op.operands), y)):
        return "needs every operand of the result's element type"
    if min(x.num_elements, w.num_elements, y.num_elements) == 0:
        return "runs no tensor without elements"
    groups = int(op.attr("groups"))
    if w.shape[0] // groups < CONV_MIN_GROUP_CHANNELS:
        return (
            f"{w.shape[0] // groups} output channels per group fill too little of an mma tile "
            f"(at least {CONV_MIN_GROUP_CHANNELS}; a depthwise convolution is cuDNN's)"
        )
    return None


__all__ = [
    "ATTENTION_TYPES",
    "CONV_OPS",
    "CONV_TYPES",
    "GEMM_TYPES",
    "MAX_HEAD_DIM",
    "TC_HEAD_DIM_STEP",
    "TC_MAX_HEAD_DIM",
    "TC_TYPES",
    "GPU_LIMITS",
    "GpuLimits",
    "attention_supported",
    "conv_misfit",
    "cublas_can_run",
    "gpu_limits",
]

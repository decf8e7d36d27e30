"""Named pipelines: `optimize` (tgc's default graph optimisation), the CUDA route, `cuda` and
`cuda-standalone`, and `lower-for-planning` (what the planner plans), each one name for the
passes it expands into (written once, here)."""

from __future__ import annotations

from dataclasses import dataclass

from tgc.pass_manager import Pass, register_pass

# What runs after lowering, in `optimize` and in the CUDA route.
CLEANUP = "canonicalize,cse,algebraic,canonicalize,cse,dce"


def _flag(value: bool) -> str:
    return "true" if value else "false"


@register_pass
@dataclass(frozen=True)
class Optimize(Pass):
    """The default pipeline: lower every hl op, then canonicalize, cse, algebraic (the TASO-class
    rewrites, which see the atomic graph), canonicalize and cse again (to clean up what algebraic
    built) and dce. It does not run raise-attention: every hl.attention it made would be lowered
    again at once (only the CUDA route, whose kernel runs hl.attention, raises attention).

    Contract: expands, when the pipeline runs, into exactly the passes of `pipeline` with their
    default options (the pass manager verifies after each); results are unchanged up to rounding.
    """

    name = "optimize"
    summary = f"lower-hl,{CLEANUP}"
    pipeline = f"lower-hl,{CLEANUP}"


@register_pass
@dataclass(frozen=True)
class LowerForPlanning(Pass):
    """What `--backend auto` plans, and so what tgc-plan and tgc-profile look at by default: the
    `cuda` route up to its fusion (raise-attention, every hl op but attention lowered, the
    cleanup and algebraic rewrites), so that every kernel the fixed CUDA route would make is
    among the planner's options. A fused kernel cannot span the edge of an hl op the planner
    keeps (measured on an H100, 2026-11-23: a GPT-2 block planned at the hl level ran 12
    calls, 3.250 ms, against the fixed route's 10 kernels, 3.133 ms, which fuse each residual
    add with the bias and layernorm around it). Attention stays one op: its own kernels (the
    generated flash kernel, PyTorch's SDPA) are options, and so is its decomposition.
    docs/planner.md, "Where the planner plans".

    Contract: expands, when the pipeline runs, into exactly the passes of `pipeline` with their
    default options; results are unchanged up to rounding; no kernel op is made.
    """

    name = "lower-for-planning"
    summary = f"raise-attention,lower-hl{{keep=attention}},{CLEANUP}"
    pipeline = f"raise-attention,lower-hl{{keep=attention}},{CLEANUP}"


@register_pass
@dataclass(frozen=True)
class Cuda(Pass):
    """The route of `tgc-run --backend cuda`: `raise-attention` (attention spelled out as
    matmul, scale, mask, softmax, matmul, as importers write it, becomes one `hl.attention`),
    `optimize` (where `lower-hl` keeps each `hl.attention` the fused attention kernel runs),
    `fuse`, `place-on-device`; the result is placed IR, which the CUDA executor runs as it is.
    raise-attention runs with its default options (only rewrites exact for every input; prepend
    `raise-attention{assume-finite=true}` to raise -inf where-masks too).

    Options: `attention-kernel` (default true; false lowers every hl.attention to matmul,
    softmax, matmul, and does not run raise-attention, whose result it would lower again),
    `library-gemm` (default true: plain matmuls become cuBLAS calls; false:
    generated matmul kernels), `matmul-epilogue` (default false: fusion leaves matmuls alone so
    that their elementwise consumers fuse forward into the next kernel, as a library runs the
    matmul; true: each matmul kernel takes its epilogue, which suits `library-gemm=false`).

    Contract: expands, when the pipeline runs, into exactly the passes `pipeline` names (the
    pass manager verifies after each); results are unchanged up to rounding; afterwards every
    function is placed (see place-on-device).
    """

    name = "cuda"
    summary = (
        "raise-attention, optimize (keeping hl.attention for its kernel), fuse, place-on-device"
    )

    attention_kernel: bool = True
    library_gemm: bool = True
    matmul_epilogue: bool = False

    @property
    def pipeline(self) -> str:  # type: ignore[override]  (computed from the options)
        lower = "raise-attention,lower-unsupported-attention,lower-hl{keep=attention}"
        if not self.attention_kernel:
            lower = "lower-hl"
        place = (
            f"place-on-device{{library-gemm={_flag(self.library_gemm)} "
            f"attention-kernel={_flag(self.attention_kernel)}}}"
        )
        return f"{lower},{CLEANUP},fuse{{matmul-epilogue={_flag(self.matmul_epilogue)}}},{place}"


@register_pass
@dataclass(frozen=True)
class CudaStandalone(Cuda):
    """The route of `tgc-translate --emit=cuda`: `cuda` without cuBLAS (a standalone .cu needs
    only the CUDA runtime), so matmuls run as generated kernels that take their epilogues.

    Contract: the `cuda` pipeline with `library-gemm=false matmul-epilogue=true` by default
    (the same options, the same passes).
    """

    name = "cuda-standalone"
    summary = "cuda{library-gemm=false matmul-epilogue=true}: no cuBLAS, for one standalone .cu"

    library_gemm: bool = False
    matmul_epilogue: bool = True

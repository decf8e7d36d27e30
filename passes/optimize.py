"""Named pipelines: `optimize` (tgc's default graph optimisation) and `lower-for-planning` (what
the planner plans, on every backend and on the GPU route), each one name for the passes it
expands into (written once, here)."""

from __future__ import annotations

from dataclasses import dataclass

from tgc.pass_manager import Pass, register_pass

# What runs after lowering, in both pipelines.
CLEANUP = "canonicalize,cse,algebraic,canonicalize,cse,dce"
# The hl ops the planner plans as one op: each has library kernels (SDPA, cuDNN's convolutions
# through PyTorch) that beat anything a fused kernel of its decomposition can be, and its
# decomposition stays an option (im2col copies the activation once per tap).
KEPT_FOR_PLANNING = ",".join(
    ["attention"] + [f"conv{k}d" for k in (1, 2, 3)] + [f"conv_transpose{k}d" for k in (1, 2, 3)]
)


@register_pass
@dataclass(frozen=True)
class Optimize(Pass):
    """The default pipeline: bring every spelling of the tanh GELU to hl.gelu (raise-gelu: it is
    then lowered to one form), fold inference batch norms into the convolutions before them
    (before lowering hides the pattern), lower every hl op, then canonicalize, cse, algebraic (the TASO-class
    rewrites, which see the atomic graph), canonicalize and cse again (to clean up what algebraic
    built) and dce. It does not run raise-attention: every hl.attention it made would be lowered
    again at once (only `lower-for-planning`, whose plans run hl.attention's kernels, raises
    attention).

    Contract: expands, when the pipeline runs, into exactly the passes of `pipeline` with their
    default options (the pass manager verifies after each); results are unchanged up to rounding.
    """

    name = "optimize"
    summary = f"raise-gelu,fold-batch-norm,lower-hl,{CLEANUP}"
    pipeline = summary


@register_pass
@dataclass(frozen=True)
class LowerForPlanning(Pass):
    """What `--backend auto` and the GPU route plan, and so what tgc-plan, tgc-profile and
    tgc-translate --emit=cuda look at by default: raise-attention, raise-gelu (one form of the
    tanh GELU, which the GEMM-with-GELU kernels' reference graphs match), batch norms folded into the
    convolutions before them, every hl op but attention and the convolutions
    lowered, the cleanup and algebraic rewrites, so that every kernel `fuse` could make of the
    atomic graph is among the planner's options. A fused kernel cannot span the edge of an hl op
    the planner keeps (measured on an H100, 2026-11-23: a GPT-2 block planned at the hl level
    ran 12 calls, 3.250 ms, against 10 fused kernels, 3.133 ms, which fuse each residual add
    with the bias and layernorm around it). Attention stays one op: its own kernels (the
    generated flash kernel, PyTorch's SDPA) are options, and so is its decomposition.
    docs/planner.md, "Where the planner plans". The convolutions stay one op for the same
    reason (PyTorch's cuDNN kernels are among the options; im2col is their decomposition).

    raise-attention runs with `assume-finite`: a causal mask written as a constant -inf mask
    (how torch.export writes Hugging Face's attention) becomes `causal`, whose kernels skip the
    masked half of the scores (bench/results/design-evidence-2026-11-28.md); the results
    differ only where a masked-out score is NaN or +inf.

    Contract: expands, when the pipeline runs, into exactly the passes of `pipeline` with the
    options written there; results are unchanged up to rounding for scores without NaN or +inf
    at masked positions; no kernel op is made.
    """

    name = "lower-for-planning"
    summary = (
        f"raise-attention{{assume-finite=true}},raise-gelu,fold-batch-norm,"
        f"lower-hl{{keep={KEPT_FOR_PLANNING}}},{CLEANUP}"
    )
    pipeline = summary

"""`optimize`: tgc's default graph-optimisation pipeline, one name for the passes below."""

from __future__ import annotations

from dataclasses import dataclass

from tgc.pass_manager import Pass, register_pass


@register_pass
@dataclass(frozen=True)
class Optimize(Pass):
    """The default pipeline: lower every hl op, then canonicalize, cse, algebraic (the TASO-class
    rewrites, which see the atomic graph), canonicalize and cse again (to clean up what algebraic
    built) and dce.

    Contract: expands, when the pipeline runs, into exactly the passes of `pipeline` with their
    default options (the pass manager verifies after each); results are unchanged up to rounding.
    """

    name = "optimize"
    summary = "lower-hl,canonicalize,cse,algebraic,canonicalize,cse,dce"
    pipeline = "lower-hl,canonicalize,cse,algebraic,canonicalize,cse,dce"

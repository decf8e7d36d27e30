"""The whole generation: enumerate, then for each candidate, smallest first: drop it if it is a
renaming of one seen or an instance of a kept rule (prune.py), else verify it (verify.py) and
keep it if it passes. Pruning before verifying saves testing the thousands of instances; a rule
only ever prunes others after it passed its own verification."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tgc.passes.rulegen.enumerate import Config, Enumeration, enumerate_terms
from tgc.passes.rulegen.prune import Pruner
from tgc.passes.rulegen.terms import Term
from tgc.passes.rulegen.verify import VerifyResult, verify_candidate


@dataclass
class GeneratedRule:
    src: Term  # the side with more ops (ties: the later-enumerated one)
    tgt: Term
    evidence: VerifyResult


@dataclass
class Generation:
    enumeration: Enumeration
    rules: list[GeneratedRule] = field(default_factory=list)
    renamings: int = 0
    instances: int = 0
    tested: int = 0
    rejected: list[tuple[Term, Term, str]] = field(default_factory=list)
    no_table_form: int = 0
    seconds: float = 0.0

    @property
    def counts(self) -> dict[str, int]:
        e = self.enumeration
        return {
            "graphs": e.graphs,
            "classes": len(e.reps),
            "candidates": len(e.candidates),
            "renamings": self.renamings,
            "instances": self.instances,
            "tested": self.tested,
            "rejected": len(self.rejected),
            "no_table_form": self.no_table_form,
            "verified": len(self.rules),
            "kept": len(self.rules),
            "exact": sum(r.evidence.exact for r in self.rules),
        }


def generate(
    config: Config, shapes_tried: int = 3, draws: int = 16, tolerance: float = 1e-9
) -> Generation:
    start = time.perf_counter()
    enumeration = enumerate_terms(config)
    out = Generation(enumeration)
    rng = np.random.default_rng(config.seed + 1)
    pruner = Pruner()
    ordered = sorted(
        enumeration.candidates,
        # smallest first; of one size, those over more distinct inputs first, so that a rule
        # prunes its specialisations (`b + (a + a)` after `b + (a + c)`)
        key=lambda c: (
            c.member.size + c.rep.size,
            -len(c.member.inputs | c.rep.inputs),
            c.member.id,
        ),
    )
    for c in ordered:
        src, tgt = c.member, c.rep
        if tgt.size > src.size or not tgt.inputs <= src.inputs:
            src, tgt = tgt, src
        if not tgt.inputs <= src.inputs:  # a rewrite cannot invent an input
            out.no_table_form += 1
            continue
        if pruner.renamed(src, tgt):
            out.renamings += 1
            continue
        if pruner.covers(src, tgt):
            out.instances += 1
            continue
        out.tested += 1
        result = verify_candidate(src, tgt, rng, shapes_tried, draws, tolerance)
        if not result.ok:
            if result.reason.startswith("an input's shape") or "common shape" in result.reason:
                out.no_table_form += 1
            else:
                out.rejected.append((src, tgt, result.reason))
            continue
        pruner.keep(src, tgt)
        out.rules.append(GeneratedRule(src, tgt, result))
    out.seconds = time.perf_counter() - start
    return out

"""Enumerate every term of up to k ops and group the terms by fingerprint.

The inputs are square matrices (n x n, n the config's `size`), so that every op of the set
applies to every input and to most results; the rules found are generalised to rectangular
shapes afterwards (verify.py). Terms are built bottom-up, level by level (a level is a term
size): an op is applied only to *representatives*, the first term seen of each fingerprint
class, as Ruler-style enumerators do. A term whose fingerprint matches an existing class is a
candidate rule (term = representative) and is not built upon: any bigger term containing it
is equal, by the candidate, to one built from the representative, so the rules it would give
follow from the candidate and a smaller rule (TASO's common-subgraph pruning, done up front).

The fingerprint of a term is its value on one draw of random float64 inputs (standard normal),
each element rounded to `digits` significant decimals, with its shape. Terms whose value
is not finite everywhere are left out (they would group by overflow, not by algebra), and so
are terms that are zero everywhere (`a - a`, `(a - a) @ b`, ...): without constants among the
leaves, their rules say only that zero is zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from tgc.passes.rulegen.terms import Evaluator, Term, specs

DEFAULT_OPS = (
    "add",
    "sub",
    "mul",
    "neg",
    "exp",
    "matmul",
    "matmul_ta",
    "matmul_tb",
    "transpose",
    "concat0",
    "concat1",
)


@dataclass(frozen=True)
class Config:
    ops: tuple[str, ...] = DEFAULT_OPS
    max_ops: int = 3
    inputs: int = 3
    size: int = 3  # n of the n x n inputs of the fingerprint draw
    seed: int = 0
    digits: int = 7  # decimals kept of the normalised fingerprint (small: more collisions)


@dataclass(frozen=True)
class Candidate:
    """`member` has the fingerprint of the earlier `rep`."""

    member: Term
    rep: Term


@dataclass
class Enumeration:
    config: Config
    graphs: int = 0  # terms built (inputs excluded)
    skipped: int = 0  # terms not finite everywhere, or zero everywhere
    reps: list[Term] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    seconds: float = 0.0


def fingerprint(value: np.ndarray, digits: int) -> tuple:
    """The shape and each element rounded to `digits` significant decimals (elements below
    1e-12 of the largest count as zero: cancellation leaves such crumbs where 0 is meant)."""
    scale = float(np.max(np.abs(value), initial=0.0))
    flushed = np.where(np.abs(value) <= 1e-12 * scale, 0.0, value)
    mantissa, exponent = np.frexp(flushed)
    quantised = np.round(mantissa * 10.0**digits).astype(np.int64)
    return (value.shape, quantised.tobytes(), exponent.astype(np.int16).tobytes())


def enumerate_terms(config: Config) -> Enumeration:
    start = time.perf_counter()
    unknown = [label for label in config.ops if label not in specs()]
    if unknown:
        raise ValueError(f"unknown op '{unknown[0]}' (known: {', '.join(specs())})")
    chosen = [specs()[label] for label in config.ops]
    unary = [s for s in chosen if s.arity == 1]
    binary = [s for s in chosen if s.arity == 2]
    rng = np.random.default_rng(config.seed)
    evaluator = Evaluator()
    out = Enumeration(config)
    classes: dict[tuple, Term] = {}
    by_size: list[list[Term]] = [[]]
    next_id = 0
    for i in range(config.inputs):
        next_id += 1
        t = Term(next_id, None, index=i)
        t.value = rng.standard_normal((config.size, config.size))
        classes[fingerprint(t.value, config.digits)] = t
        by_size[0].append(t)
        out.reps.append(t)

    def offer(spec, children) -> None:
        nonlocal next_id
        value = evaluator.apply(spec, [c.value for c in children])
        if value is None:
            return
        next_id += 1
        term = Term(next_id, spec, children)
        term.value = value
        out.graphs += 1
        if not np.all(np.isfinite(value)) or not np.any(value):
            out.skipped += 1
            return
        key = fingerprint(value, config.digits)
        rep = classes.get(key)
        if rep is not None:
            out.candidates.append(Candidate(term, rep))
            return
        classes[key] = term
        by_size[-1].append(term)
        out.reps.append(term)

    for level in range(1, config.max_ops + 1):
        by_size.append([])
        below = level - 1
        for spec in unary:
            for t in by_size[below]:
                offer(spec, (t,))
        for spec in binary:
            for i in range(level):
                for j in range(level):
                    if i + j < below:
                        continue
                    _combine(spec, by_size[i], by_size[j], below, i + j == below, offer)
    out.seconds = time.perf_counter() - start
    return out


def _combine(spec, lefts, rights, size: int, disjoint: bool, offer) -> None:
    """Offer spec(a, b) for every a, b whose union has exactly `size` ops."""
    for a in lefts:
        for b in rights:
            if spec.commutative and b.id < a.id:
                continue
            if disjoint:
                if not a.ops.isdisjoint(b.ops):
                    continue
            elif len(a.ops | b.ops) != size:
                continue
            offer(spec, (a, b))

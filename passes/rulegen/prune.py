"""TASO's pruning: a rule that follows from a kept one by renaming its inputs, or by putting a
subgraph in place of an input (the common-subgraph case: `exp(a)@b + exp(a)@c = exp(a)@(b+c)`
follows from `x@b + x@c = x@(b+c)`), adds nothing.

Both tests work on canonical texts, where the operands of commutative ops are sorted, so
`add(a, b)` and `add(b, a)` are one term. `Pruner.covers` looks for the kept rules that could
match by the ops at the roots of both sides (an input matches any op), in both orientations.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tgc.passes.rulegen.terms import INPUT_NAMES, Term

ANY = "*"


def canonical_text(term: Term, rename: dict[int, int] | None = None, memo=None) -> str:
    """The term's text with commutative operands sorted and inputs renamed by `rename`."""
    memo = {} if memo is None else memo
    if term.id in memo:
        return memo[term.id]
    if term.spec is None:
        text = INPUT_NAMES[term.index if rename is None else rename[term.index]]
    else:
        kids = [canonical_text(c, rename, memo) for c in term.children]
        if term.spec.commutative:
            kids.sort()
        text = f"{term.spec.label}({', '.join(kids)})"
    memo[term.id] = text
    return text


def renaming_key(src: Term, tgt: Term) -> tuple[str, str]:
    """The same key for every renaming of the inputs and either orientation."""
    inputs = sorted(src.inputs | tgt.inputs)
    best = None
    for perm in itertools.permutations(range(len(inputs))):
        rename = dict(zip(inputs, perm))
        memo: dict = {}
        a, b = canonical_text(src, rename, memo), canonical_text(tgt, rename, memo)
        key = (a, b) if a <= b else (b, a)
        if best is None or key < best:
            best = key
    return best


class Matcher:
    """Matching a rule side (inputs are variables) against a term, up to commutativity."""

    def __init__(self) -> None:
        self._texts: dict[int, str] = {}

    def text(self, t: Term) -> str:
        if t.id not in self._texts:
            self._texts[t.id] = canonical_text(t, None, {})
        return self._texts[t.id]

    def matches(self, p: Term, t: Term, subst: dict) -> Iterator[dict]:
        if p.spec is None:
            bound = subst.get(p.index)
            text = self.text(t)
            if bound is None:
                yield {**subst, p.index: text}
            elif bound == text:
                yield subst
            return
        if t.spec is None or t.spec.label != p.spec.label:
            return
        orders = [t.children]
        if p.spec.commutative and t.children[0] is not t.children[1]:
            orders.append(t.children[::-1])
        for kids in orders:
            yield from self._all(p.children, kids, subst)

    def _all(self, ps, ts, subst: dict) -> Iterator[dict]:
        if not ps:
            yield subst
            return
        for s in self.matches(ps[0], ts[0], subst):
            yield from self._all(ps[1:], ts[1:], s)

    def instance_of(self, rule: tuple[Term, Term], src: Term, tgt: Term) -> bool:
        """Whether src = tgt is `rule` with terms put in place of its inputs (either way)."""
        a, b = rule
        for p, q in ((a, b), (b, a)):
            for subst in self.matches(p, src, {}):
                if next(self.matches(q, tgt, subst), None) is not None:
                    return True
        return False


def root(t: Term) -> str:
    return ANY if t.spec is None else t.spec.label


class Pruner:
    def __init__(self) -> None:
        self.matcher = Matcher()
        self.seen: set[tuple[str, str]] = set()
        self.kept: dict[tuple[str, str], list[tuple[Term, Term]]] = {}

    def renamed(self, src: Term, tgt: Term) -> bool:
        """Whether a renaming of this rule was offered before (and remember it)."""
        key = renaming_key(src, tgt)
        if key in self.seen:
            return True
        self.seen.add(key)
        return False

    def covers(self, src: Term, tgt: Term) -> bool:
        """Whether a kept rule gives this one by substitution."""
        s, t = root(src), root(tgt)
        for key in {(s, t), (s, ANY), (ANY, t), (ANY, ANY)}:
            for rule in self.kept.get(key, ()):
                if self.matcher.instance_of(rule, src, tgt):
                    return True
        return False

    def keep(self, src: Term, tgt: Term) -> None:
        a, b = root(src), root(tgt)
        self.kept.setdefault((a, b), []).append((src, tgt))
        if (b, a) != (a, b):
            self.kept.setdefault((b, a), []).append((tgt, src))

"""The hand-written rules, as term pairs, to say which ones rule generation rediscovered.

Each entry names its rule in passes/algebraic/rules.py (`algebraic:`) or
passes/canonicalize_rules.py (`canonicalize:`) and gives one equality that rule performs,
written with the enumeration's ops. A rule with several forms (`+` and `-`, both sides) has an
entry per form. Rules outside any enumeration's reach (constants, reshapes, the stacked merge,
n-ary chains) are not listed; docs/rulegen.md says which.

A form is rediscovered when it is an instance (prune.py) of a kept rule, or of its reverse.
It is out of reach when it uses an op the run did not enumerate or has more ops than the run's
`max_ops`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tgc.passes.rulegen.prune import Matcher
from tgc.passes.rulegen.terms import Maker, Term


@dataclass(frozen=True)
class Known:
    name: str
    src: Term
    tgt: Term

    @property
    def size(self) -> int:
        return max(self.src.size, self.tgt.size)

    def labels(self) -> set[str]:
        out: set[str] = set()

        def walk(t: Term) -> None:
            if t.spec is not None:
                out.add(t.spec.label)
                for c in t.children:
                    walk(c)

        walk(self.src)
        walk(self.tgt)
        return out


def _entries() -> list[tuple[str, Callable]]:
    return [
        ("algebraic:distribute-matmul-left (+)", lambda m, a, b, c: (
            m.op("add", m.op("matmul", a, b), m.op("matmul", a, c)),
            m.op("matmul", a, m.op("add", b, c)))),
        ("algebraic:distribute-matmul-left (-)", lambda m, a, b, c: (
            m.op("sub", m.op("matmul", a, b), m.op("matmul", a, c)),
            m.op("matmul", a, m.op("sub", b, c)))),
        ("algebraic:distribute-matmul-right (+)", lambda m, a, b, c: (
            m.op("add", m.op("matmul", b, a), m.op("matmul", c, a)),
            m.op("matmul", m.op("add", b, c), a))),
        ("algebraic:distribute-matmul-right (-)", lambda m, a, b, c: (
            m.op("sub", m.op("matmul", b, a), m.op("matmul", c, a)),
            m.op("matmul", m.op("sub", b, c), a))),
        ("algebraic:distribute-mul (+)", lambda m, a, b, c: (
            m.op("add", m.op("mul", a, b), m.op("mul", a, c)),
            m.op("mul", a, m.op("add", b, c)))),
        ("algebraic:distribute-mul (-)", lambda m, a, b, c: (
            m.op("sub", m.op("mul", a, b), m.op("mul", a, c)),
            m.op("mul", a, m.op("sub", b, c)))),
        ("algebraic:reassociate-matmul", lambda m, a, b, c: (
            m.op("matmul", m.op("matmul", a, b), c),
            m.op("matmul", a, m.op("matmul", b, c)))),
        ("algebraic:merge-shared-matmuls (left)", lambda m, a, b, c: (
            m.op("concat1", m.op("matmul", a, b), m.op("matmul", a, c)),
            m.op("matmul", a, m.op("concat1", b, c)))),
        ("algebraic:merge-shared-matmuls (right)", lambda m, a, b, c: (
            m.op("concat0", m.op("matmul", b, a), m.op("matmul", c, a)),
            m.op("matmul", m.op("concat0", b, c), a))),
        ("algebraic:transpose-of-matmul", lambda m, a, b, c: (
            m.op("transpose", m.op("matmul", a, b)),
            m.op("matmul", m.op("transpose", b), m.op("transpose", a)))),
        ("algebraic:matmul-of-transpose (a)", lambda m, a, b, c: (
            m.op("matmul", m.op("transpose", a), b), m.op("matmul_ta", a, b))),
        ("algebraic:matmul-of-transpose (b)", lambda m, a, b, c: (
            m.op("matmul", a, m.op("transpose", b)), m.op("matmul_tb", a, b))),
        ("canonicalize:--x -> x", lambda m, a, b, c: (m.op("neg", m.op("neg", a)), a)),
        ("canonicalize:x-(-y) -> x+y", lambda m, a, b, c: (
            m.op("sub", a, m.op("neg", b)), m.op("add", a, b))),
        ("canonicalize:x+(-y) -> x-y", lambda m, a, b, c: (
            m.op("add", a, m.op("neg", b)), m.op("sub", a, b))),
        ("canonicalize:(-x)*(-y) -> x*y", lambda m, a, b, c: (
            m.op("mul", m.op("neg", a), m.op("neg", b)), m.op("mul", a, b))),
        ("canonicalize:(-x)/(-y) -> x/y", lambda m, a, b, c: (
            m.op("div", m.op("neg", a), m.op("neg", b)), m.op("div", a, b))),
        ("canonicalize:|-x| -> |x|", lambda m, a, b, c: (
            m.op("abs", m.op("neg", a)), m.op("abs", a))),
        ("canonicalize:||x|| -> |x|", lambda m, a, b, c: (
            m.op("abs", m.op("abs", a)), m.op("abs", a))),
        ("canonicalize:1/(1/x) -> x", lambda m, a, b, c: (
            m.op("recip", m.op("recip", a)), a)),
        ("canonicalize:log(e^x) -> x", lambda m, a, b, c: (m.op("log", m.op("exp", a)), a)),
        ("canonicalize:transpose∘transpose -> transpose", lambda m, a, b, c: (
            m.op("transpose", m.op("transpose", a)), a)),
        ("canonicalize:matmul(xᵀ, y) -> matmul(x, y, ta)", lambda m, a, b, c: (
            m.op("matmul_tb", m.op("transpose", a), b), m.op("matmul_ta_tb", a, b))),
        ("canonicalize:matmul(x, yᵀ) -> matmul(x, y, tb)", lambda m, a, b, c: (
            m.op("matmul_ta", a, m.op("transpose", b)), m.op("matmul_ta_tb", a, b))),
    ]  # fmt: skip


def known_rules() -> list[Known]:
    out = []
    for name, build in _entries():
        m = Maker()
        src, tgt = build(m, m.input(0), m.input(1), m.input(2))
        out.append(Known(name, src, tgt))
    return out


def rediscovered(known: list[Known], kept: list[tuple[Term, Term]], ops, max_ops: int):
    """{name: "found" | "missed" | "out of reach"} for each known form."""
    matcher = Matcher()
    out = {}
    for k in known:
        if not k.labels() <= set(ops) or k.size > max_ops:
            out[k.name] = "out of reach"
        elif any(matcher.instance_of(rule, k.src, k.tgt) for rule in kept):
            out[k.name] = "found"
        else:
            out[k.name] = "missed"
    return out

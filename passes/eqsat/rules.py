"""The rules `eqsat` applies: the algebraic family written as patterns, rule tables (both
directions), and the merge of matmuls sharing an operand (a rule over several classes).

    A@B ± A@C = A@(B±C)      B@A ± C@A = (B±C)@A      x*a ± x*b = x*(a±b)
    (A@B)@C = A@(B@C)        (A@B)ᵀ = Bᵀ@Aᵀ (flags)    Aᵀ@B = A@B {ta}, A@Bᵀ = A@B {tb}
    X@W1, .., X@Wn = pieces of split(X@concat(W1, .., Wn))   (2-D weights, one side, no flags)
"""

from __future__ import annotations

from tgc.diagnostics import UNKNOWN_LOC
from tgc.opdef import COMMUTATIVE, OPS
from tgc.passes.rule_file import FileRule, PNode, PVar, attr_key_of

PIECE = "eqsat.piece"  # (axis, sizes, index) of atomic.split: emitted as one split per product


def P(op: str, *children, **attributes) -> PNode:
    name = f"atomic.{op}"
    probe = OPS[name]([], [], attributes)
    commutative = COMMUTATIVE in OPS[name].traits and len(children) == 2
    return PNode(name, attr_key_of(probe), tuple(sorted(attributes.items())), children, commutative)


a, b, c = PVar(0), PVar(1), PVar(2)


def _hand_written() -> list[tuple[str, PNode, PNode]]:
    out = []
    for add in ("add", "sub"):
        out += [
            (f"distribute-matmul-left ({add})",
             P(add, P("matmul", a, b), P("matmul", a, c)), P("matmul", a, P(add, b, c))),
            (f"distribute-matmul-right ({add})",
             P(add, P("matmul", b, a), P("matmul", c, a)), P("matmul", P(add, b, c), a)),
            (f"distribute-mul ({add})",
             P(add, P("mul", a, b), P("mul", a, c)), P("mul", a, P(add, b, c))),
        ]  # fmt: skip
    out.append(
        ("reassociate-matmul", P("matmul", P("matmul", a, b), c), P("matmul", a, P("matmul", b, c)))
    )
    for perm in ((1, 0), (0, 2, 1)):
        t = len(perm)
        out += [
            (f"transpose-of-matmul (rank {t})", P("transpose", P("matmul", a, b), perm=perm),
             P("matmul", b, a, transpose_a=True, transpose_b=True)),
            (f"matmul-of-transpose a (rank {t})", P("matmul", P("transpose", a, perm=perm), b),
             P("matmul", a, b, transpose_a=True)),
            (f"matmul-of-transpose b (rank {t})", P("matmul", a, P("transpose", b, perm=perm)),
             P("matmul", a, b, transpose_b=True)),
        ]  # fmt: skip
    return out


def _vars(p) -> set[int]:
    if isinstance(p, PVar):
        return {p.index}
    return set().union(*(_vars(k) for k in p.children)) if p.children else set()


def both_ways(rules: list[FileRule]) -> list[FileRule]:
    """Each rule and its reverse, where the reverse reads no variable its source lacks."""
    out = []
    for r in rules:
        out.append(r)
        if isinstance(r.tgt, PNode) and _vars(r.src) <= _vars(r.tgt):
            out.append(FileRule(f"{r.name} (reversed)", r.tgt, r.src, r.arg_types, r.loc))
    return out


def hand_written_rules() -> list[FileRule]:
    return both_ways([FileRule(n, s, t, None, UNKNOWN_LOC) for n, s, t in _hand_written()])

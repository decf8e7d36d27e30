"""Rule tables in `.tg` form: reading them, and matching their rules on any graph.

A rule table (what `tgc-rulegen` writes; docs/rulegen.md) is a module of function pairs over
the same arguments, `@<name>_src` and `@<name>_tgt`, each returning one value: the source
pattern and its replacement. Their arguments are the rule's variables; their ops must be pure,
have one result and no regions. Argument dims are *shape symbols*: each distinct size other
than 1 stands for one symbol (a matched value's dims must bind each symbol to one size), a 1 is
a 1. An f64 argument stands for any float type.

`match(pattern, x, expand)` finds the rule's variables at `x` in any graph that can say, for a
pattern node, which children tuples `x` offers (`expand`): the IR (apply_rules.py) and the
e-graph (passes/eqsat/) both use it. Operands of commutative ops match in either order.

A malformed table is a located error (file:line:col), never a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tgc.attributes import attribute_key
from tgc.builtin import FuncOp, ReturnOp
from tgc.diagnostics import Location, TgcError, VerifyError
from tgc.ir import BlockArgument, Operation, Value
from tgc.opdef import COMMUTATIVE, OPS, PURE
from tgc.parser import parse_module
from tgc.types import TensorType
from tgc.verifier import verify


@dataclass(frozen=True)
class PVar:
    index: int


@dataclass(frozen=True)
class PNode:
    op: str
    attr_key: tuple  # every declared attribute, defaults filled in (attr_key_of)
    attributes: tuple  # the attributes as written, to build the op: ((key, value), ...)
    children: tuple
    commutative: bool


Pattern = PVar | PNode


@dataclass(frozen=True)
class FileRule:
    name: str
    src: PNode
    tgt: Pattern
    arg_types: tuple[TensorType, ...] | None  # None: any types the ops accept
    loc: Location

    def __str__(self) -> str:
        return self.name


def attr_key_of(op: Operation) -> tuple:
    """The attributes of `op` as a comparable key (declared defaults filled in)."""
    return tuple(sorted((k, attribute_key(op.attr(k))) for k in op.attr_defs)) + tuple(
        sorted((k, attribute_key(v)) for k, v in op.attributes.items() if k not in op.attr_defs)
    )


def _error(message: str, loc: Location) -> TgcError:
    return TgcError(f"rule table: {message}", loc)


def _pattern(value: Value, func: FuncOp, name: str) -> Pattern:
    if isinstance(value, BlockArgument):
        return PVar(value.index)
    op = value.defining_op
    if len(op.results) != 1 or op.regions or not op.has_trait(PURE):
        raise _error(
            f"rule '{name}': '{op.name}' cannot be in a rule (an op needs one result, no "
            "regions and no side effects)",
            op.loc,
        )
    children = tuple(_pattern(v, func, name) for v in op.operands)
    commutative = op.has_trait(COMMUTATIVE) and len(children) == 2
    attrs = tuple(sorted(op.attributes.items()))
    return PNode(op.name, attr_key_of(op), attrs, children, commutative)


def _returned(func: FuncOp, name: str) -> Value:
    ret = func.body.last
    if not isinstance(ret, ReturnOp) or len(ret.operands) != 1:
        raise _error(f"rule '{name}': @{func.sym_name} must return exactly one value", func.loc)
    return ret.operands[0]


def parse_rules(text: str, file: str) -> list[FileRule]:
    module = parse_module(text, file)
    verify(module)
    halves: dict[str, dict[str, FuncOp]] = {}
    order: list[str] = []
    for func in module.funcs:
        base, _, side = func.sym_name.rpartition("_")
        if side not in ("src", "tgt") or not base:
            raise _error(
                f"function '@{func.sym_name}' is neither '<rule>_src' nor '<rule>_tgt'", func.loc
            )
        pair = halves.setdefault(base, {})
        if side in pair:
            raise _error(f"rule '{base}' has two '{side}' functions", func.loc)
        if base not in order:
            order.append(base)
        pair[side] = func
    rules = []
    for base in order:
        pair = halves[base]
        present = next(iter(pair.values()))
        for side, word in (("src", "source"), ("tgt", "target")):
            if side not in pair:
                raise _error(f"rule '{base}' has no {word} (@{base}_{side})", present.loc)
        src, tgt = pair["src"], pair["tgt"]
        src_types = tuple(a.type for a in src.args)
        if src_types != tuple(a.type for a in tgt.args):
            raise _error(
                f"rule '{base}': @{base}_tgt's arguments differ from @{base}_src's", tgt.loc
            )
        src_value, tgt_value = _returned(src, base), _returned(tgt, base)
        if src_value.type is not tgt_value.type:
            raise _error(
                f"rule '{base}': the source and the target return different types", tgt.loc
            )
        lhs = _pattern(src_value, src, base)
        if isinstance(lhs, PVar):
            raise _error(f"rule '{base}': the source must be an op, not an argument", src.loc)
        rules.append(FileRule(base, lhs, _pattern(tgt_value, tgt, base), src_types, src.loc))
    return rules


_CACHE: dict[tuple, list[FileRule]] = {}


def load_rules(path: str) -> list[FileRule]:
    """The rules of the table at `path` (read once per path and modification time)."""
    try:
        stamp = os.stat(path).st_mtime_ns
        key = (os.path.abspath(path), stamp)
        if key not in _CACHE:
            with open(path, encoding="utf-8") as f:
                _CACHE[key] = parse_rules(f.read(), path)
    except OSError as e:
        raise TgcError(f"could not read rule table '{path}': {e.strerror}") from None
    return _CACHE[key]


# -- matching on any graph -------------------------------------------------------------------------

Expand = Callable[[object, PNode], Iterable[tuple]]


def match(p: Pattern, x, expand: Expand, subst: dict) -> Iterator[dict]:
    """Every binding of the rule's variables that makes `p` match at `x`."""
    if isinstance(p, PVar):
        bound = subst.get(p.index)
        if bound is None:
            yield {**subst, p.index: x}
        elif bound == x:
            yield subst
        return
    for kids in expand(x, p):
        if p.commutative:
            yield from _match_all(p.children, kids, expand, subst)
            if kids[0] != kids[1]:
                yield from _match_all(p.children, kids[::-1], expand, subst)
        else:
            yield from _match_all(p.children, kids, expand, subst)


def _match_all(ps, xs, expand: Expand, subst: dict) -> Iterator[dict]:
    if not ps:
        yield subst
        return
    for s in match(ps[0], xs[0], expand, subst):
        yield from _match_all(ps[1:], xs[1:], expand, s)


def types_fit(rule: FileRule, types: dict[int, TensorType]) -> bool:
    """Whether the matched values' types are an instance of the rule's arguments: same ranks,
    each shape symbol one size, 1s where the rule has 1s, float element types."""
    if rule.arg_types is None:  # a hand-written rule: legal wherever the target builds
        return all(t.is_float for t in types.values())
    sizes: dict[int, int] = {}
    for i, want in enumerate(rule.arg_types):
        got = types.get(i)
        if got is None:
            continue  # a variable only the target reads cannot be matched (refused at build)
        if got.rank != want.rank or not got.is_float:
            return False
        for w, g in zip(want.shape, got.shape):
            if w == 1 or g == 1:
                if w != g:
                    return False
            elif sizes.setdefault(w, g) != g:
                return False
    return True


_PROBES: dict[tuple, TensorType | None] = {}


def infer_type(p: PNode, operand_types: tuple[TensorType, ...]) -> TensorType | None:
    """The result type of `p`'s op on operands of these types (None: not legal)."""
    key = (p.op, p.attr_key, operand_types)
    if key not in _PROBES:
        probe = OPS[p.op]([Value(t) for t in operand_types], [], dict(p.attributes))
        try:
            types = probe.infer()
            _PROBES[key] = types[0] if len(types) == 1 else None
        except VerifyError:
            _PROBES[key] = None
    return _PROBES[key]


def target_type(p: Pattern, types: dict[int, TensorType]) -> TensorType | None:
    """The type the target would have with the variables of these types (None: illegal)."""
    if isinstance(p, PVar):
        return types.get(p.index)
    kids = tuple(target_type(c, types) for c in p.children)
    if any(k is None for k in kids):
        return None
    return infer_type(p, kids)

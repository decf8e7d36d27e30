"""Rewrite rules as data: a small pattern language, its matcher over the IR, and rule tables.

A rule is one row, (pattern, replacement), with the algebra as a trailing comment:

    x, y = Var("x"), Var("y")
    RULES = RuleTable("example", [
        rule(x * 1, x),                                    # x*1 -> x
        rule(-(-x), x),                                    # --x -> x
        rule(x / y, x * fold(1 / y), when=exact_recip),    # x/c -> x*(1/c), c a power of two
    ])

The pattern language:
- `Var("x")` matches any value; a name used twice must match the same value (`x - x`).
- `Const("c")` matches a value made by `atomic.constant`.
- a number (or `Splat(v)`) matches a constant whose every element equals it, the sign of zero
  included (`x + -0.0` is not `x + 0.0`); in a replacement it is a constant of the root's type.
- `+ - * / **` and unary `-` build `atomic.add/sub/mul/div/pow/neg`; `atomic.<op>(x, ..., key=v)`
  any other op. An attribute is a literal (compared with its default filled in), an `AttrVar`
  (captured; the same name must match the same value) or, in a replacement, `fn(match)`.
  `result_type=ROOT` gives a replacement op the matched root's result type (reshape, broadcast).
- two-operand commutative ops match their operands in either order.
- `fold(template)` in a replacement evaluates a template of constants with the ops' numpy
  references and makes one constant.

A rule fires only where its guard (`when(match)`) holds, where `fast_math` is allowed when it
says so, and where the replacement has exactly the root's type: a rewrite never changes a shape,
an element type or a memory space (`x + zeros_of_bigger_shape` is not `x`).

Every rule of every table in `RULE_TABLES` is checked numerically by test/test_rules.py
(`passes.rules_check.check_rule`): a wrong rule fails CI, and a rule the checker cannot
instantiate fails too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tgc.attributes import DenseAttr, attribute_key
from tgc.diagnostics import VerifyError
from tgc.evaluate import widened
from tgc.ir import Operation, Value
from tgc.opdef import COMMUTATIVE, OPS
from tgc.patterns import PatternRewriter, RewritePattern
from tgc.types import TensorType

_INFIX = {
    "atomic.add": "+",
    "atomic.sub": "-",
    "atomic.mul": "*",
    "atomic.div": "/",
    "atomic.pow": "**",
}


class Match(dict):
    """What a pattern captured: name -> Value (variables, constants) or attribute value."""

    def __init__(self, root: Operation) -> None:
        super().__init__()
        self.root = root

    def array(self, name: str) -> np.ndarray:
        """The value of captured constant `name`."""
        return self[name].defining_op.attr("value").array

    def type(self, name: str) -> TensorType:
        return self[name].type


# -- the pattern language --------------------------------------------------------------------------


class Pattern:
    """A node of a pattern tree. Arithmetic operators build atomic ops."""

    def match(self, value: Value, m: Match) -> bool:
        raise NotImplementedError

    def __add__(self, other):
        return Op("atomic.add", self, lift(other))

    def __radd__(self, other):
        return Op("atomic.add", lift(other), self)

    def __sub__(self, other):
        return Op("atomic.sub", self, lift(other))

    def __rsub__(self, other):
        return Op("atomic.sub", lift(other), self)

    def __mul__(self, other):
        return Op("atomic.mul", self, lift(other))

    def __rmul__(self, other):
        return Op("atomic.mul", lift(other), self)

    def __truediv__(self, other):
        return Op("atomic.div", self, lift(other))

    def __rtruediv__(self, other):
        return Op("atomic.div", lift(other), self)

    def __pow__(self, other):
        return Op("atomic.pow", self, lift(other))

    def __neg__(self):
        return Op("atomic.neg", self)


def lift(value) -> Pattern:
    if isinstance(value, Pattern):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Splat(value)
    raise TypeError(f"cannot use {value!r} in a rewrite pattern")


class Var(Pattern):
    def __init__(self, name: str) -> None:
        self.name = name

    def match(self, value: Value, m: Match) -> bool:
        bound = m.get(self.name)
        if bound is None:
            m[self.name] = value
            return True
        return bound is value

    def __str__(self) -> str:
        return self.name


class Const(Var):
    """A value made by `atomic.constant` (any shape, any contents)."""

    def match(self, value: Value, m: Match) -> bool:
        op = value.defining_op
        return op is not None and op.name == "atomic.constant" and super().match(value, m)


def constant_scalar(value: Value):
    """The number every element of a constant equals, bit for bit (a numpy scalar), or None."""
    op = value.defining_op
    if op is None or op.name != "atomic.constant":
        return None
    attr: DenseAttr = op.attr("value")
    if not attr.is_splat and attr.array.size != 1:
        return None  # DenseAttr detects splats by their bits: -0.0 and 0.0 differ
    return attr.array.reshape(-1)[0]


class Splat(Pattern):
    """A constant whose every element is `value` (signed zeros told apart)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def match(self, value: Value, m: Match) -> bool:
        found = constant_scalar(value)
        if found is None or found != self.value:
            return False
        if self.value == 0 and isinstance(self.value, float):
            return bool(np.signbit(found)) == bool(np.signbit(self.value))
        return True

    def __str__(self) -> str:
        return repr(self.value)


class AttrVar:
    """A captured attribute value."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


class _Root:
    def __repr__(self) -> str:
        return "ROOT"


ROOT = _Root()  # `result_type=ROOT`: the type of the matched root


class Op(Pattern):
    def __init__(self, name: str, *operands, result_type=None, **attributes) -> None:
        if name not in OPS:
            raise ValueError(f"no op named '{name}'")
        self.name = name
        self.cls = OPS[name]
        self.operands = tuple(lift(o) for o in operands)
        self.attributes = attributes
        self.result_type = result_type
        self.commutative = COMMUTATIVE in self.cls.traits and len(self.operands) == 2
        # The op name each operand's producer must have (None: anything), checked before any
        # binding so that most candidates are rejected by a few comparisons.
        self.producers = tuple(_producer_name(o) for o in self.operands)

    def _producers_fit(self, operands, producers) -> bool:
        for v, want in zip(operands, producers):
            if want is None:
                continue
            op = v.defining_op
            if op is None or op.name != want:
                return False
        return True

    def match(self, value: Value, m: Match) -> bool:
        op = value.defining_op
        return op is not None and self.match_op(op, m)

    def match_op(self, op: Operation, m: Match) -> bool:
        operands = op.operands
        if op.name != self.name or len(operands) != len(self.operands) or len(op.results) != 1:
            return False
        if not self.commutative:
            if not self._producers_fit(operands, self.producers):
                return False
            if not self._match_attributes(op, m):
                return False
            return all(p.match(v, m) for p, v in zip(self.operands, operands))
        a, b = operands
        straight = self._producers_fit(operands, self.producers)
        swapped = self._producers_fit((b, a), self.producers)
        if not (straight or swapped) or not self._match_attributes(op, m):
            return False
        trial = dict(m) if straight and swapped else None
        if straight and self.operands[0].match(a, m) and self.operands[1].match(b, m):
            return True
        if not swapped:
            return False
        if trial is not None:
            m.clear()
            m.update(trial)
        return self.operands[0].match(b, m) and self.operands[1].match(a, m)

    def _match_attributes(self, op: Operation, m: Match) -> bool:
        for key, want in self.attributes.items():
            got = op.attr(key)
            if isinstance(want, AttrVar):
                if want.name in m:
                    if attribute_key(m[want.name]) != attribute_key(got):
                        return False
                else:
                    m[want.name] = got
            elif attribute_key(want) != attribute_key(got):
                return False
        return True

    def __str__(self) -> str:
        if self.name in _INFIX:
            a, b = (_operand_text(o) for o in self.operands)
            return f"{a} {_INFIX[self.name]} {b}"
        if self.name == "atomic.neg":
            return f"-{_operand_text(self.operands[0])}"
        short = self.name.removeprefix("atomic.")
        return f"{short}({', '.join(str(o) for o in self.operands)})"


def _producer_name(p: Pattern) -> str | None:
    if isinstance(p, Op):
        return p.name
    if isinstance(p, (Const, Splat)):
        return "atomic.constant"
    return None


def _operand_text(p) -> str:
    text = str(p)
    return f"({text})" if isinstance(p, Op) and p.name in _INFIX else text


class Fold(Pattern):
    """Replacement only: evaluate `template` (constants and literals) into one constant."""

    def __init__(self, template: Pattern) -> None:
        self.template = template

    def __str__(self) -> str:
        return f"fold({self.template})"


def fold(template: Pattern) -> Fold:
    return Fold(template)


class OpNamespace:
    """`atomic.transpose(x, perm=p)` -> Op("atomic.transpose", x, perm=p)."""

    def __init__(self, dialect: str) -> None:
        self._dialect = dialect

    def __getattr__(self, op: str):
        name = f"{self._dialect}.{op}"

        def build(*operands, **attributes) -> Op:
            return Op(name, *operands, **attributes)

        return build


atomic = OpNamespace("atomic")


# -- rules -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One row: `lhs` (rooted at an op) rewrites to `rhs` where `when(match)` holds."""

    lhs: Op
    rhs: Pattern
    when: Callable[[Match], bool] | None = None
    fast_math: bool = False
    name: str = ""

    @property
    def root_name(self) -> str:
        return self.lhs.name

    def __str__(self) -> str:
        return self.name


def rule(
    lhs: Pattern,
    rhs,
    *,
    when: Callable[[Match], bool] | None = None,
    fast_math: bool = False,
    name: str | None = None,
) -> Rule:
    if not isinstance(lhs, Op):
        raise TypeError("the left side of a rule must be an op pattern")
    rhs = lift(rhs)
    text = name or f"{lhs} -> {rhs}"
    if fast_math and name is None:
        text += " [fast-math]"
    return Rule(lhs, rhs, when, fast_math, text)


class RuleTable:
    """A named list of rules; `patterns(fast_math)` turns the allowed ones into patterns."""

    def __init__(self, name: str, rules: Sequence[Rule]) -> None:
        self.name = name
        self.rules = tuple(rules)
        seen: set[str] = set()
        for r in self.rules:
            if r.name in seen:
                raise ValueError(f"rule table '{name}': two rules are named '{r.name}'")
            seen.add(r.name)
        RULE_TABLES[name] = self

    def patterns(self, fast_math: bool = False) -> list[RewritePattern]:
        """One pattern per root op, trying its allowed rules in table order."""
        by_root: dict[str, list[Rule]] = {}
        for r in self.rules:
            if fast_math or not r.fast_math:
                by_root.setdefault(r.root_name, []).append(r)
        return [RuleSetPattern(root, rules) for root, rules in by_root.items()]


RULE_TABLES: dict[str, RuleTable] = {}


class RulePattern(RewritePattern):
    """A rule as a rewrite pattern, offered only the ops named by its root."""

    benefit = 2

    def __init__(self, r: Rule) -> None:
        self.rule = r
        self.op_types = (r.root_name,)

    @property
    def name(self) -> str:
        return self.rule.name

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        return apply_rule(self.rule, op, rewriter)


class RuleSetPattern(RewritePattern):
    """The rules rooted at one op, tried in order; the producers of the op's operands are
    looked up once and rules that need other producers are skipped without matching.
    Returns the applied rule's name (the statistics key)."""

    benefit = 2

    def __init__(self, root_name: str, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self.op_types = (root_name,)
        self._name = f"rules on {root_name}"

    @property
    def name(self) -> str:
        return self._name

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool | str:
        names = tuple(None if v.defining_op is None else v.defining_op.name for v in op.operands)
        swapped = names[::-1]
        for r in self.rules:
            need = r.lhs.producers
            if len(need) != len(names):
                continue
            if not _names_fit(need, names) and not (
                r.lhs.commutative and _names_fit(need, swapped)
            ):
                continue
            if apply_rule(r, op, rewriter):
                return r.name
        return False


def _names_fit(need: tuple, names: tuple) -> bool:
    for want, got in zip(need, names):
        if want is not None and want != got:
            return False
    return True


def apply_rule(r: Rule, op: Operation, rewriter: PatternRewriter) -> bool:
    """Match `r` at `op` and, where its guard and the type check allow, rewrite."""
    m = Match(op)
    if not r.lhs.match_op(op, m):
        return False
    if r.when is not None and not r.when(m):
        return False
    if replacement_type(r.rhs, m) is not op.results[0].type:
        return False
    rewriter.replace_op(op, build(r.rhs, m, rewriter))
    return True


# -- replacements ----------------------------------------------------------------------------------


def _attributes(node: Op, m: Match) -> dict:
    out = {}
    for key, value in node.attributes.items():
        if isinstance(value, AttrVar):
            value = m[value.name]
        elif callable(value):
            value = value(m)
        attr_def = node.cls.attr_defs.get(key)
        if (
            attr_def is not None
            and not attr_def.required
            and attribute_key(value) == attribute_key(attr_def.default)
        ):
            continue  # leave defaults implicit, as a person would write it
        out[key] = value
    return out


def replacement_type(rhs: Pattern, m: Match, at_root: bool = True) -> TensorType | None:
    """The type `rhs` would have, worked out without touching the IR (None: cannot build).

    A literal is a constant of the root's type at the root, a rank-0 constant inside an op.
    """
    root_type = m.root.results[0].type
    if isinstance(rhs, Var):
        return m[rhs.name].type
    if isinstance(rhs, Splat):
        return root_type if at_root else root_type.with_shape(())
    if isinstance(rhs, Fold):
        array = evaluate(rhs.template, m)
        return None if array is None else root_type.with_shape(array.shape)
    operand_types = [replacement_type(o, m, False) for o in rhs.operands]
    if any(t is None for t in operand_types):
        return None
    if rhs.result_type is ROOT:
        return root_type
    probe = rhs.cls([Value(t) for t in operand_types], [], _attributes(rhs, m))
    try:
        inferred = probe.infer()
    except VerifyError:
        return None
    return inferred[0] if inferred else None


def build(rhs: Pattern, m: Match, rewriter: PatternRewriter, at_root: bool = True) -> Value:
    """Create the ops of `rhs` before the matched root (they take its location)."""
    root = m.root
    if isinstance(rhs, Var):
        return m[rhs.name]
    b = rewriter.builder_before(root)
    if isinstance(rhs, Splat):
        type = root.results[0].type
        return make_constant(b, np.full((), rhs.value), type if at_root else type.with_shape(()))
    if isinstance(rhs, Fold):
        array = evaluate(rhs.template, m)
        return make_constant(b, array, root.results[0].type.with_shape(array.shape))
    operands = [build(o, m, rewriter, False) for o in rhs.operands]
    result_types = [root.results[0].type] if rhs.result_type is ROOT else None
    return b.create(rhs.name, operands, _attributes(rhs, m), result_types).results[0]


def make_constant(builder, array: np.ndarray, type: TensorType) -> Value:
    """An `atomic.constant` of `type` holding `array` (broadcast to the type's shape)."""
    array = np.broadcast_to(np.asarray(array).astype(type.dtype), type.shape)
    value = DenseAttr(array, type.with_encoding(None))
    return builder.create("atomic.constant", [], {"value": value}, [type]).results[0]


# -- evaluating constants with the ops' numpy references ------------------------------------------


def run_reference(op: Operation, arrays: Sequence[np.ndarray], dtypes) -> tuple | None:
    """`op.reference` on `arrays`, each result cast to its dtype; None when it cannot run."""
    try:
        with np.errstate(all="ignore"):
            raw = op.reference(*[widened(a) for a in arrays])
    except Exception:  # noqa: BLE001  (a reference that cannot run on these values: no fold)
        return None
    outs = raw if isinstance(raw, tuple) else (raw,)
    with np.errstate(all="ignore"):
        return tuple(np.asarray(o).astype(dt, copy=False) for o, dt in zip(outs, dtypes))


def evaluate(template: Pattern, m: Match) -> np.ndarray | None:
    """The value of a template made of captured constants, literals and ops (for `fold`)."""
    dtype = m.root.results[0].type.dtype
    if isinstance(template, Splat):
        return np.asarray(template.value).astype(dtype)
    if isinstance(template, Var):
        op = m[template.name].defining_op
        return None if op is None or op.name != "atomic.constant" else op.attr("value").array
    if not isinstance(template, Op):
        return None
    arrays = [evaluate(o, m) for o in template.operands]
    if any(a is None for a in arrays):
        return None
    probe = template.cls(
        [Value(TensorType.get(a.shape, _elem(a.dtype))) for a in arrays],
        [],
        _attributes(template, m),
    )
    try:
        types = probe.infer()
    except VerifyError:
        return None
    if not types:
        return None
    out = run_reference(probe, arrays, [t.dtype for t in types])
    return None if out is None else out[0]


def _elem(dtype: np.dtype) -> str:
    from tgc.types import ELEMENT_TYPE_OF_DTYPE

    return ELEMENT_TYPE_OF_DTYPE[np.dtype(dtype)]

"""Every rewrite rule of every rule table, checked numerically (TASO's random testing).

`check_rule` (passes/rules_check.py) builds random instances of a rule's left side (random
shapes with size-1 dims and broadcasting, negative axes, random reshape/broadcast targets, f64
and i32), applies the rule alone and compares the float64 interpreter before and after, NaN,
infinities and signed zeros included unless the rule is marked fast-math. The last tests show
that a wrong rule, a fast-math rule left unmarked and a rule that never fires are rejected.
"""

from __future__ import annotations

import pytest

import tgc.passes  # noqa: F401  (registers every pass and its rule tables)
from tgc.builder import FunctionBuilder, tensor
from tgc.dialects._shapes import normalize_axes
from tgc.opdef import OPS
from tgc.pass_manager import PassStatistics
from tgc.passes.canonicalize_rules import CANONICALIZE_RULES
from tgc.passes.rules import (
    RULE_TABLES,
    AttrVar,
    Const,
    Match,
    RulePattern,
    RuleTable,
    Var,
    atomic,
    rule,
)
from tgc.passes.rules_check import RuleCheckError, check_rule
from tgc.patterns import apply_patterns_greedily

ALL_RULES = [(table.name, r) for table in RULE_TABLES.values() for r in table.rules]
x, y = Var("x"), Var("y")


@pytest.mark.parametrize("table,r", ALL_RULES, ids=[f"{t}: {r.name}" for t, r in ALL_RULES])
def test_rule_agrees_with_the_reference(table, r):
    report = check_rule(r)
    assert report.fired >= 8


def test_the_tables_are_not_empty_and_name_registered_ops():
    assert len(CANONICALIZE_RULES.rules) >= 40
    for _, r in ALL_RULES:
        assert r.root_name in OPS


# -- the checker rejects wrong rules ---------------------------------------------------------------


def test_a_wrong_rule_is_rejected():
    wrong = rule(x * 1, x + 1)  # x*1 -> x+1
    with pytest.raises(RuleCheckError, match="changes result"):
        check_rule(wrong)


def test_a_wrong_rule_cannot_enter_a_checked_table():
    table = RuleTable("deliberately-wrong", [rule(x * 1, x), rule(x * 1, x + 1)])
    try:
        failures = []
        for r in table.rules:
            try:
                check_rule(r)
            except RuleCheckError as e:
                failures.append((r.name, str(e)))
        assert [name for name, _ in failures] == ["x * 1 -> x + 1"]
    finally:
        del RULE_TABLES["deliberately-wrong"]


def test_an_unmarked_fast_math_rule_is_rejected():
    with pytest.raises(RuleCheckError, match="NaN|infinities|sign"):
        check_rule(rule(x * 0.0, 0.0))  # x*0 -> 0 without fast-math: inf*0 is NaN


def test_signed_zeros_are_checked():
    with pytest.raises(RuleCheckError, match="sign of a zero"):
        check_rule(rule(x + 0.0, x))  # -0 + 0 is +0


def test_a_rule_that_never_fires_is_rejected():
    never = rule(x * 1, x, when=lambda m: False, name="never")
    with pytest.raises(RuleCheckError, match="fired in only 0"):
        check_rule(never, max_trials=50)


def test_a_shape_changing_replacement_never_fires():
    # x + zeros_of_a_bigger_shape is not x: the engine refuses replacements of another type.
    fb = FunctionBuilder("f", [tensor("4xf32")], ["x"])
    zeros = fb.atomic.constant(value=_dense(0.0, "-0.0", "3x4xf32"), result_type=tensor("3x4xf32"))
    func = fb.ret(fb.atomic.add(fb.args[0], zeros)).funcs[0]
    stats = PassStatistics()
    apply_patterns_greedily(func, CANONICALIZE_RULES.patterns(), stats=stats)
    assert not stats.counters
    assert [op.name for op in func.body.ops][-2] == "atomic.add"


def _dense(_, value: str, spec: str):
    from tgc.attributes import DenseAttr

    t = tensor(spec)
    return DenseAttr.splat(float(value), t)


# -- the matcher -----------------------------------------------------------------------------------


def _match(pattern, build):
    fb = FunctionBuilder("f", [tensor("4xf32"), tensor("4xf32")], ["a", "b"])
    root = build(fb, *fb.args).defining_op
    m = Match(root)
    return (m if pattern.match_op(root, m) else None), fb.args


def test_commutative_ops_match_either_order():
    m, (a, _) = _match(x * 1, lambda fb, a, b: fb.atomic.mul(_one(fb), a))
    assert m is not None and m["x"] is a


def test_a_repeated_variable_must_be_the_same_value():
    assert _match(x - x, lambda fb, a, b: fb.atomic.sub(a, b))[0] is None
    assert _match(x - x, lambda fb, a, b: fb.atomic.sub(a, a))[0] is not None


def test_literals_tell_signed_zeros_apart():
    def add_zero(value):
        def build(fb, a, b):
            c = fb.atomic.constant(value=_dense(0, value, "f32"), result_type=tensor("f32"))
            return fb.atomic.add(a, c)

        return build

    assert _match(x + -0.0, add_zero("-0.0"))[0] is not None
    assert _match(x + -0.0, add_zero("0.0"))[0] is None
    assert _match(x + 0.0, add_zero("-0.0"))[0] is None


def test_constants_and_attributes_are_captured():
    p = AttrVar("p")
    pattern = atomic.transpose(atomic.transpose(x, perm=p), perm=p)
    fb = FunctionBuilder("f", [tensor("2x3x4xf32")], ["a"])
    t = fb.atomic.transpose(fb.args[0], perm=(1, 2, 0))
    same = fb.atomic.transpose(t, perm=(1, 2, 0)).defining_op
    other = fb.atomic.transpose(t, perm=(2, 0, 1)).defining_op
    m = Match(same)
    assert pattern.match_op(same, m) and m["p"] == (1, 2, 0)
    assert not pattern.match_op(other, Match(other))
    c = Const("c")
    m = Match(same)
    assert not (x + c).match_op(same, m)


def test_rule_pattern_counts_by_rule_name():
    fb = FunctionBuilder("f", [tensor("4xf32")], ["a"])
    func = fb.ret(fb.atomic.mul(fb.args[0], _one(fb))).funcs[0]
    stats = PassStatistics()
    apply_patterns_greedily(func, [RulePattern(rule(x * 1, x))], stats=stats)
    assert stats.counters["x * 1 -> x"] == 1


def test_negative_axes_are_normalised_by_guards():
    fb = FunctionBuilder("f", [tensor("3x1xf32")], ["a"])
    s = fb.atomic.reduce_max(fb.args[0], axes=(-1,))
    func = fb.ret(s).funcs[0]
    stats = PassStatistics()
    apply_patterns_greedily(func, CANONICALIZE_RULES.patterns(), stats=stats)
    assert [op.name for op in func.body.ops] == ["atomic.reshape", "func.return"]
    assert normalize_axes((-1,), 2) == (1,)


def _one(fb):
    from tgc.attributes import DenseAttr

    return fb.atomic.constant(value=DenseAttr.splat(1.0, tensor("f32")), result_type=tensor("f32"))

"""The pattern machinery (tgc.patterns): dispatch on op type, the greedy worklist driver, its
fixpoint, its iteration cap, dead-op erasure, locations and the type guard."""

from __future__ import annotations

import pytest

import tgc.dialects  # noqa: F401
from tgc.builder import FunctionBuilder, tensor
from tgc.diagnostics import Location
from tgc.dialects.atomic import AddOp, ExpOp, NegOp, UnaryOp
from tgc.opdef import ELEMENTWISE
from tgc.pass_manager import PassStatistics
from tgc.patterns import RewritePattern, apply_patterns_greedily, op_pattern
from tgc.printer import print_module
from tgc.verifier import verify

T = tensor("4xf32")


def ops_of(func) -> list[str]:
    return [op.name for op in func.body.ops]


@op_pattern(NegOp)
def double_negation(op, rewriter) -> bool:
    inner = op.operands[0].defining_op
    if inner is None or inner.name != "atomic.neg":
        return False
    rewriter.replace_op(op, inner.operands[0])
    return True


def test_double_negation_chain_reaches_the_fixpoint():
    fb = FunctionBuilder("f", [T], ["x"])
    v = fb.args[0]
    for _ in range(7):
        v = fb.atomic.neg(v)
    module = fb.ret(v)
    func = module.funcs[0]
    stats = PassStatistics()
    result = apply_patterns_greedily(func, [double_negation], stats=stats)
    verify(module)
    assert result.converged
    assert ops_of(func) == ["atomic.neg", "func.return"]
    assert stats.counters["double-negation"] == 3
    assert stats.counters["erased-dead-ops"] >= 1


def test_patterns_only_see_their_op_types():
    seen = []

    class Spy(RewritePattern):
        op_types = (ExpOp, "atomic.add")

        def match_and_rewrite(self, op, rewriter):
            seen.append(op.name)
            return False

    class TraitSpy(RewritePattern):
        traits = frozenset({ELEMENTWISE})

        def match_and_rewrite(self, op, rewriter):
            seen.append("elementwise:" + op.name)
            return False

    fb = FunctionBuilder("f", [T], ["x"])
    x = fb.args[0]
    y = fb.atomic.add(fb.atomic.exp(x), fb.atomic.neg(x))
    r = fb.atomic.reshape(y, result_type=tensor("2x2xf32"))
    func = fb.ret(r).funcs[0]
    apply_patterns_greedily(func, [Spy(), TraitSpy()])
    assert sorted(s for s in seen if ":" not in s) == ["atomic.add", "atomic.exp"]
    assert sorted(s for s in seen if ":" in s) == [
        "elementwise:atomic.add",
        "elementwise:atomic.exp",
        "elementwise:atomic.neg",
    ]


def test_base_classes_dispatch_to_subclasses():
    names = []

    @op_pattern(UnaryOp)
    def spy(op, rewriter):
        names.append(op.name)
        return False

    fb = FunctionBuilder("f", [T], ["x"])
    func = fb.ret(fb.atomic.sqrt(fb.atomic.exp(fb.args[0]))).funcs[0]
    apply_patterns_greedily(func, [spy])
    assert names == ["atomic.exp", "atomic.sqrt"]  # program order: producers first


def test_dead_pure_ops_are_erased_and_results_kept():
    fb = FunctionBuilder("f", [T], ["x"])
    x = fb.args[0]
    fb.atomic.exp(fb.atomic.neg(x))  # dead chain
    func = fb.ret(fb.atomic.sin(x)).funcs[0]
    stats = PassStatistics()
    apply_patterns_greedily(func, [], stats=stats)
    assert ops_of(func) == ["atomic.sin", "func.return"]
    assert stats.counters["erased-dead-ops"] == 2


def test_patterns_that_undo_each_other_hit_the_cap(capsys):
    @op_pattern(AddOp, name="swap")
    def swap(op, rewriter):
        a, b = op.operands
        new = rewriter.builder_before(op).atomic.add(b, a)
        rewriter.replace_op(op, new)
        return True

    fb = FunctionBuilder("f", [T, T], ["x", "y"])
    func = fb.ret(fb.atomic.add(*fb.args)).funcs[0]
    stats = PassStatistics()
    result = apply_patterns_greedily(func, [swap], max_iterations=3, stats=stats, pass_name="test")
    assert not result.converged and result.iterations == 3
    assert any("did not converge after 3 iteration(s)" in n for n in stats.notes)
    assert "warning: test did not converge" in capsys.readouterr().err


def test_rewritten_ops_keep_the_location_of_what_they_replace():
    loc = Location("model.tg", 7, 3)

    @op_pattern(ExpOp)
    def exp_to_neg(op, rewriter):
        rewriter.replace_op(op, rewriter.builder_before(op).atomic.neg(op.operands[0]))
        return True

    fb = FunctionBuilder("f", [T], ["x"])
    e = fb.atomic.exp(fb.args[0])
    e.defining_op.loc = loc
    func = fb.ret(e).funcs[0]
    apply_patterns_greedily(func, [exp_to_neg])
    (neg,) = [op for op in func.body.ops if op.name == "atomic.neg"]
    assert neg.loc == loc
    assert neg.results[0].name_hint == e.name_hint


def test_a_replacement_of_another_type_is_refused():
    @op_pattern("atomic.add")
    def drop_broadcast_add(op, rewriter):
        rewriter.replace_op(op, op.operands[1])  # wrong when the other operand is bigger
        return True

    fb = FunctionBuilder("f", [tensor("4x4xf32"), tensor("4xf32")], ["m", "v"])
    func = fb.ret(fb.atomic.add(*fb.args)).funcs[0]
    with pytest.raises(AssertionError, match="would change result #0"):
        apply_patterns_greedily(func, [drop_broadcast_add])


def test_modified_users_are_revisited():
    # exp -> neg makes neg(neg(x)) appear in the user, which must be simplified in the same sweep.
    @op_pattern(ExpOp)
    def exp_to_neg(op, rewriter):
        rewriter.replace_op(op, rewriter.builder_before(op).atomic.neg(op.operands[0]))
        return True

    fb = FunctionBuilder("f", [T], ["x"])
    func = fb.ret(fb.atomic.neg(fb.atomic.exp(fb.args[0]))).funcs[0]
    stats = PassStatistics()
    result = apply_patterns_greedily(func, [exp_to_neg, double_negation], stats=stats)
    assert result.converged and result.iterations == 2  # the second sweep only confirms
    assert ops_of(func) == ["func.return"]
    assert "%x" in print_module(func.parent_op)


def test_higher_benefit_patterns_go_first():
    order = []

    class Low(RewritePattern):
        op_types = (NegOp,)

        def match_and_rewrite(self, op, rewriter):
            order.append("low")
            return False

    class High(Low):
        benefit = 5

        def match_and_rewrite(self, op, rewriter):
            order.append("high")
            return False

    fb = FunctionBuilder("f", [T], ["x"])
    func = fb.ret(fb.atomic.neg(fb.args[0])).funcs[0]
    apply_patterns_greedily(func, [Low(), High()])
    assert order == ["high", "low"]

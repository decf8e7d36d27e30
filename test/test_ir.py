"""The IR API: use lists, block lists, the rewriter, the builder, walks, types and attributes."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.attributes import DenseAttr, attribute_key
from tgc.builder import Builder, FunctionBuilder, tensor
from tgc.diagnostics import TgcError, VerifyError
from tgc.rewriter import RewriteListener, Rewriter
from tgc.types import TensorType, TypeSyntaxError, parse_type
from tgc.verifier import verify

F4 = tensor("4xf32")


def small_module():
    fb = FunctionBuilder("f", [F4, F4], ["a", "b"])
    a, b = fb.args
    s = fb.atomic.add(a, b)
    n = fb.atomic.neg(s)
    m = fb.atomic.mul(n, s)
    return fb.ret(m), (a, b, s, n, m)


def test_use_lists_track_operands():
    module, (a, b, s, n, m) = small_module()
    assert [op.name for op, _ in s.uses] == ["atomic.neg", "atomic.mul"]
    assert a.users() == [s.defining_op]
    s.replace_all_uses_with(a)
    assert s.uses == []
    assert n.defining_op.operands[0] is a
    assert (m.defining_op, 1) in a.uses


def test_erase_refuses_live_results_and_drops_uses():
    module, (a, b, s, n, m) = small_module()
    with pytest.raises(ValueError, match="still has uses"):
        s.defining_op.erase()
    func = module.funcs[0]
    before = len(func.body)
    ret = func.body.last
    ret.set_operands([a])
    m.defining_op.erase()
    assert len(func.body) == before - 1
    assert all(op is not m.defining_op for op, _ in n.uses)
    verify(module)


def test_block_is_a_linked_list_in_program_order():
    module, (a, b, s, n, m) = small_module()
    body = module.funcs[0].body
    names = [op.name for op in body.ops]
    assert names == ["atomic.add", "atomic.neg", "atomic.mul", "func.return"]
    assert [op.name for op in body.ops_reversed()] == names[::-1]
    neg = n.defining_op
    neg.detach()
    body.insert_before(neg, m.defining_op)
    assert [op.name for op in body.ops] == names
    assert s.defining_op.is_before_in_block(m.defining_op)
    assert not m.defining_op.is_before_in_block(s.defining_op)


def test_walk_is_preorder_program_order():
    module, _ = small_module()
    assert [op.name for op in module.walk()][:3] == ["builtin.module", "func.func", "atomic.add"]


class Recorder(RewriteListener):
    def __init__(self):
        self.events = []

    def on_insert(self, op):
        self.events.append(("insert", op.name))

    def on_erase(self, op):
        self.events.append(("erase", op.name))

    def on_modify(self, op):
        self.events.append(("modify", op.name))


def test_rewriter_replaces_keeps_location_and_reports():
    module = tgc.parse(
        "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %n = atomic.neg %a : (tensor<4xf32>) -> tensor<4xf32>\n"
        "  %y = atomic.neg %n : (tensor<4xf32>) -> tensor<4xf32>\n"
        "  func.return %y : tensor<4xf32>\n}\n",
        "r.tg",
    )
    body = module.funcs[0].body
    outer = list(body.ops)[1]
    rec = Recorder()
    rw = Rewriter(rec)
    b = rw.builder_before(outer)
    replacement = b.atomic.abs(outer.operands[0])
    rw.replace_op(outer, replacement)
    assert replacement.defining_op.loc == outer.loc  # rewrites keep the source location
    assert replacement.name_hint == "y"  # and the source name
    assert ("insert", "atomic.abs") in rec.events and ("erase", "atomic.neg") in rec.events
    verify(module)
    assert "%y = atomic.abs %n" in tgc.print_ir(module)


def test_builder_infers_types_and_rejects_bad_shapes():
    fb = FunctionBuilder("g", [tensor("4x8xf32"), tensor("8x3xf32")])
    x, w = fb.args
    y = fb.atomic.matmul(x, w)
    assert y.type == tensor("4x3xf32")
    with pytest.raises(VerifyError, match="contraction"):
        fb.atomic.matmul(w, w)
    r = fb.atomic.reshape(y, result_type=tensor("12xf32"))
    module = fb.ret(r)
    assert module.funcs[0].function_type.results == (tensor("12xf32"),)
    assert isinstance(Builder.before_op(r.defining_op), Builder)


def test_types_are_interned_and_parse_errors_have_columns():
    assert parse_type("tensor<4x16xf32>") is TensorType((4, 16), "f32")
    assert str(TensorType((), "bf16", "cuda")) == 'tensor<bf16, "cuda">'
    assert TensorType((2, 3), "f16").nbytes == 12
    with pytest.raises(TypeSyntaxError) as e:
        parse_type("tensor<4xq32>")
    assert "unknown element type 'q32'" in str(e.value) and e.value.column == 9


def test_attribute_keys_tell_int_float_and_bool_apart():
    assert attribute_key(1) != attribute_key(1.0) != attribute_key(True)
    assert attribute_key((1, 2)) == attribute_key((1, 2))
    d1 = DenseAttr(np.array([1.0, 2.0]), tensor("2xf32"))
    assert d1 == DenseAttr(np.array([1.0, 2.0]), tensor("2xf32"))
    assert d1 != DenseAttr(np.array([1.0, 3.0]), tensor("2xf32"))
    assert DenseAttr.splat(0.5, tensor("3xf32")).splat_value() == 0.5


def test_api_run_checks_inputs():
    module, _ = small_module()
    a = np.arange(1, 5, dtype=np.float32)
    (y,) = tgc.run(module, [a, a])
    np.testing.assert_allclose(y, -(2 * a) * (2 * a))
    with pytest.raises(TgcError, match="has shape"):
        tgc.run(module, [a[:3], a])
    with pytest.raises(TgcError, match="dtype"):
        tgc.run(module, [a.astype(np.float64), a])


def test_dominance_is_verified():
    module, (a, b, s, n, m) = small_module()
    body = module.funcs[0].body
    mul = m.defining_op
    mul.detach()
    body.insert_before(mul, s.defining_op)  # now uses %n before it is defined
    with pytest.raises(VerifyError, match="does not dominate"):
        verify(module)


def test_isolated_regions_cannot_capture():
    text = """
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %y = kernel.fused %a {name = "k"} : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%p: tensor<4xf32>):
    %s = atomic.add %p, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    kernel.yield %s : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}
"""
    with pytest.raises(TgcError, match="undeclared SSA value name '%a'") as e:
        tgc.parse(text, "iso.tg")
    assert (e.value.loc.line, e.value.loc.col) == (5, 25)


def test_special_float_attributes_round_trip_in_the_generic_form():
    import math

    fb = FunctionBuilder("f", [F4])
    (x,) = fb.args
    y = fb.atomic.neg(x)
    module = fb.ret(y)
    op = y.defining_op
    for value in (math.inf, -math.inf, 1e-5):
        op.attributes["tgc.v"] = value
        generic = tgc.print_ir(module, generic=True)
        again = tgc.parse(generic).funcs[0].body.first.attributes["tgc.v"]
        assert again == value
    op.attributes["tgc.v"] = math.nan
    again = tgc.parse(tgc.print_ir(module, generic=True)).funcs[0].body.first
    assert math.isnan(again.attributes["tgc.v"])

"""Matching kernels by canonical form (issue 12, item 2): planner/match.py.

Programs are written as .tg text, parsed and put in canonical form (`canonicalize,cse`, as
select-kernels does), then searched with `find_matches` / `matches_at`.
"""

from __future__ import annotations

import pytest

import tgc.planner
from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.printer import print_op
from tgc.planner import match as match_module
from tgc.planner.backends.numpy import floats_only
from tgc.planner.kernel import KERNELS, Kernel, register_kernel, unregister_kernel
from tgc.planner.match import Match, find_matches, matches_at
from tgc.verifier import verify

tgc.planner.load_backends(["numpy"])  # numpy's kernels alone, whatever is installed

T = "tensor<4x8xf32>"
S = "tensor<f32>"
LOWER = "lower-hl,canonicalize,cse"


def canonical(
    body: str,
    args: str = f"%x: {T}",
    result: str = "%y",
    rtype: str = T,
    pipeline: str = "canonicalize,cse",
):
    text = f"func.func @f({args}) -> {rtype} {{\n{body}\n  func.return {result} : {rtype}\n}}\n"
    module = parse_module(text, "prog.tg")
    verify(module)
    PassManager.from_text(pipeline).run(module)
    return module.funcs[0]


def graph_matches(func, kernel: str) -> list[Match]:
    return [m for ms in find_matches(func.body).values() for m in ms if m.kernel.name == kernel]


def unary(name: str, x: str, y: str, t: str = T) -> str:
    return f"  %{y} = {name} %{x} : ({t}) -> {t}"


def binary(name: str, a: str, b: str, y: str, ta: str = T, tb: str = T, ty: str = T) -> str:
    return f"  %{y} = {name} %{a}, %{b} : ({ta}, {tb}) -> {ty}"


def tanh_formula(x="x", neg_of="x", numerator="atomic.sub", twice=True, y="y") -> str:
    """(exp(x) - exp(-x)) / (exp(x) + exp(-x)), exp(x) written twice when `twice`."""
    lines = [
        unary("atomic.exp", x, "e1"),
        unary("atomic.neg", neg_of, "n"),
        unary("atomic.exp", "n", "f1"),
        binary(numerator, "e1", "f1", "num"),
    ]
    if twice:
        lines += [
            unary("atomic.exp", x, "e2"),
            unary("atomic.neg", neg_of, "n2"),
            unary("atomic.exp", "n2", "f2"),
            binary("atomic.add", "e2", "f2", "den"),
        ]
    else:
        lines += [binary("atomic.add", "e1", "f1", "den")]
    lines.append(binary("atomic.div", "num", "den", y))
    return "\n".join(lines)


# -- the tanh formula ----------------------------------------------------------------------------


def test_the_hand_written_tanh_formula_matches_numpy_tanh():
    func = canonical(tanh_formula())
    (m,) = graph_matches(func, "numpy.tanh")
    root = func.body.last.operands[0].defining_op
    assert m.root is root and m.ops[-1] is root
    assert [op.name for op in m.ops] == [op.name for op in func.body.ops][:-1]  # all of it
    assert m.inputs == (func.args[0],) and m.outputs == (root.results[0],)
    assert m.reference.sym_name == "exp_formula"


def test_lowered_hl_tanh_matches_numpy_tanh():
    func = canonical(unary("hl.tanh", "x", "y"), pipeline=LOWER)
    (m,) = graph_matches(func, "numpy.tanh")
    assert m.reference.sym_name == "hl_tanh" and len(m.ops) == 9
    assert [c.name for c in m.constants] == ["atomic.constant"] * 3


def test_the_exp2x_formula_matches_in_f16_and_f64_programs():
    """Constants compare by value in the narrower type: 2.0 and 1.0 in f16 or f64."""
    for element in ("f16", "f64"):
        t, s = f"tensor<4x8x{element}>", f"tensor<{element}>"
        body = "\n".join(
            [
                f"  %two = atomic.constant {{value = dense<2.0> : {s}}} : () -> {s}",
                f"  %one = atomic.constant {{value = dense<1.0> : {s}}} : () -> {s}",
                binary("atomic.mul", "two", "x", "x2", s, t, t),
                unary("atomic.exp", "x2", "e", t),
                binary("atomic.sub", "e", "one", "num", t, s, t),
                binary("atomic.add", "one", "e", "den", s, t, t),
                binary("atomic.div", "num", "den", "y", t, t, t),
            ]
        )
        func = canonical(body, f"%x: {t}", rtype=t)
        (m,) = graph_matches(func, "numpy.tanh")
        assert m.reference.sym_name == "exp2x_formula", element


def test_lowered_gelu_in_bf16_matches_with_its_constants_rounded_to_bf16():
    """bf16 (ml_dtypes, numpy kind "V") compares as a float: 0.044715 written in the f32
    reference is 0.0446777 in a bf16 program. A bf16 program with another constant does not
    match."""
    t = "tensor<4x8xbf16>"
    func = canonical(f'  %y = hl.gelu %x {{approximate = "tanh"}} : ({t}) -> {t}', f"%x: {t}",
                     rtype=t, pipeline=LOWER)  # fmt: skip
    (m,) = graph_matches(func, "numpy.gelu_tanh")
    # lowered for planning, the spelled-out reference is raised to hl.gelu first (raise-gelu),
    # so both references are the same graph and either is the one reported
    assert m.reference.sym_name in ("hl_gelu_tanh", "gelu_tanh_formula")
    text = print_op(func).replace("dense<0.0446777>", "dense<0.0500488>")
    assert "dense<0.0500488>" in text
    other = parse_module(text).funcs[0]
    assert graph_matches(other, "numpy.gelu_tanh") == []


def test_a_formula_that_differs_in_one_op_does_not_match():
    """exp(x) + exp(-x) in the numerator."""
    func = canonical(tanh_formula(numerator="atomic.add"))
    assert graph_matches(func, "numpy.tanh") == []


def test_a_formula_that_differs_in_one_constant_does_not_match():
    body = "\n".join(
        [
            f"  %three = atomic.constant {{value = dense<3.0> : {S}}} : () -> {S}",
            f"  %one = atomic.constant {{value = dense<1.0> : {S}}} : () -> {S}",
            binary("atomic.mul", "x", "three", "x2", T, S),
            unary("atomic.exp", "x2", "e"),
            binary("atomic.sub", "e", "one", "num", T, S),
            binary("atomic.add", "e", "one", "den", T, S),
            binary("atomic.div", "num", "den", "y"),
        ]
    )
    assert graph_matches(canonical(body), "numpy.tanh") == []
    two = canonical(body.replace("dense<3.0>", "dense<2.0>"))
    assert len(graph_matches(two, "numpy.tanh")) == 1  # the same text with 2.0 does


def test_a_covered_value_used_outside_the_match_blocks_it():
    """exp(x) is also returned: the kernel would have to compute it twice."""
    body = tanh_formula(twice=False) + "\n" + binary("atomic.add", "y", "e1", "z")
    func = canonical(body, result="%z")
    assert graph_matches(func, "numpy.tanh") == []
    # without the outside use it matches
    assert len(graph_matches(canonical(tanh_formula(twice=False)), "numpy.tanh")) == 1


def test_a_constant_shared_with_other_ops_does_not_block_the_match():
    body = "\n".join(
        [
            f"  %two = atomic.constant {{value = dense<2.0> : {S}}} : () -> {S}",
            f"  %one = atomic.constant {{value = dense<1.0> : {S}}} : () -> {S}",
            binary("atomic.mul", "x", "two", "x2", T, S),
            unary("atomic.exp", "x2", "e"),
            binary("atomic.sub", "e", "one", "num", T, S),
            binary("atomic.add", "e", "one", "den", T, S),
            binary("atomic.div", "num", "den", "t"),
            binary("atomic.add", "t", "one", "y", T, S),  # `one` used outside too
        ]
    )
    func = canonical(body)
    (m,) = graph_matches(func, "numpy.tanh")
    assert {c.attr("value").splat_value() for c in m.constants} == {2.0, -1.0, 1.0}
    assert not any(op.name == "atomic.constant" for op in m.ops)


def test_dag_sharing_binds_one_argument_to_one_value():
    """exp(x) ... exp(-y): the reference's x is one value, so x and y must be the same."""
    func = canonical(tanh_formula(neg_of="z"), f"%x: {T}, %z: {T}")
    assert graph_matches(func, "numpy.tanh") == []
    func = canonical(tanh_formula(neg_of="x"), f"%x: {T}, %z: {T}")
    assert len(graph_matches(func, "numpy.tanh")) == 1


def test_a_shared_reference_op_binds_one_program_op():
    """The reference uses one exp(x) in numerator and denominator; the program uses exp(x)
    and exp(z) (z another value): no match."""
    body = "\n".join(
        [
            unary("atomic.exp", "x", "e"),
            unary("atomic.exp", "z", "g"),
            unary("atomic.neg", "x", "n"),
            unary("atomic.exp", "n", "f"),
            binary("atomic.sub", "e", "f", "num"),
            binary("atomic.add", "g", "f", "den"),
            binary("atomic.div", "num", "den", "y"),
        ]
    )
    assert graph_matches(canonical(body, f"%x: {T}, %z: {T}"), "numpy.tanh") == []


# -- fma: commutative operands ------------------------------------------------------------------


@pytest.mark.parametrize("order", ["b*c + a", "a + b*c", "a + c*b", "c*b + a"])
def test_b_times_c_plus_a_matches_fma_in_any_operand_order(order):
    product = ("b", "c") if "b*c" in order else ("c", "b")
    lines = [binary("atomic.mul", *product, "m")]
    lines.append(
        binary("atomic.add", "m", "a", "y")
        if order.endswith("+ a")
        else binary("atomic.add", "a", "m", "y")
    )
    func = canonical("\n".join(lines), f"%a: {T}, %b: {T}, %c: {T}")
    (m,) = graph_matches(func, "numpy.fma")  # the b/c swap is the same cover: kept once
    a, b, c = func.args
    assert m.inputs[0] is a and set(m.inputs[1:]) == {b, c}
    assert [op.name for op in m.ops] == ["atomic.mul", "atomic.add"]


def test_fma_is_refused_on_integers_by_its_constraint():
    t = "tensor<4xi32>"
    body = "\n".join(
        [binary("atomic.mul", "b", "c", "m", t, t, t), binary("atomic.add", "a", "m", "y", t, t, t)]
    )
    func = canonical(body, f"%a: {t}, %b: {t}, %c: {t}", rtype=t)
    assert graph_matches(func, "numpy.fma") == []
    assert floats_only(([func.args[0].type], [])) == "takes floats only, not i32"


def test_a_product_feeding_two_sums_is_not_covered():
    """m = b*c is used by two adds: neither fma may take it."""
    body = "\n".join(
        [
            binary("atomic.mul", "b", "c", "m"),
            binary("atomic.add", "a", "m", "s"),
            binary("atomic.sub", "m", "s", "y"),
        ]
    )
    func = canonical(body, f"%a: {T}, %b: {T}, %c: {T}")
    assert graph_matches(func, "numpy.fma") == []


# -- gelu and softmax ---------------------------------------------------------------------------


def test_lowered_gelu_tanh_and_softmax_match_their_kernels():
    body = "\n".join(
        [
            f'  %g = hl.gelu %x {{approximate = "tanh"}} : ({T}) -> {T}',
            f"  %y = hl.softmax %g {{axis = -1}} : ({T}) -> {T}",
        ]
    )
    func = canonical(body, pipeline=LOWER)
    (gelu,) = graph_matches(func, "numpy.gelu_tanh")
    (softmax,) = graph_matches(func, "numpy.softmax")
    assert softmax.inputs == gelu.outputs
    assert softmax.root is func.body.last.operands[0].defining_op


def test_an_attribute_that_differs_blocks_the_match():
    """The same softmax ops over axis 0 are not the kernel's softmax over the last axis."""
    func = canonical(f"  %y = hl.softmax %x {{axis = 0}} : ({T}) -> {T}", pipeline=LOWER)
    assert graph_matches(func, "numpy.softmax") == []


# -- roots with several results, op kernels, the API ---------------------------------------------

SPLIT_KERNEL_TEXT = """
func.func @first_half_exp(%x: tensor<4xf32>) -> tensor<2xf32> {
  %a, %b = atomic.split %x {axis = 0, sizes = [2, 2]} : (tensor<4xf32>) -> (tensor<2xf32>, tensor<2xf32>)
  func.return %a : tensor<2xf32>
}
"""


def test_a_root_whose_other_result_is_used_is_not_matched():
    kernel = register_kernel(Kernel("numpy.test_first_half", "numpy", reference=SPLIT_KERNEL_TEXT))
    try:
        t, h = "tensor<4xf32>", "tensor<2xf32>"
        split = f"  %a, %b = atomic.split %x {{axis = 0, sizes = [2, 2]}} : ({t}) -> ({h}, {h})"
        alone = canonical(split, f"%x: {t}", "%a", h)
        assert len(graph_matches(alone, kernel.name)) == 1
        both = canonical(
            split + "\n" + binary("atomic.add", "a", "b", "y", h, h, h), f"%x: {t}", "%y", h
        )
        assert graph_matches(both, kernel.name) == []
    finally:
        unregister_kernel(kernel.name)
    assert graph_matches(alone, kernel.name) == []  # the index follows the registry


def test_every_atomic_op_gets_its_op_kernel_match():
    func = canonical(tanh_formula())
    found = find_matches(func.body)
    assert list(found) == list(func.body.ops)  # every op, in block order
    for op, ms in found.items():
        if op.name.startswith("atomic."):
            (m,) = [m for m in ms if m.kernel.op is not None]
            assert m.kernel.name == f"numpy.{op.name}" and m.ops == (op,)
            assert m.inputs == tuple(op.operands) and m.outputs == tuple(op.results)
    assert found[func.body.last] == []


def test_matches_at_with_given_kernels_and_without_positions():
    func = canonical(tanh_formula())
    root = func.body.last.operands[0].defining_op
    (m,) = matches_at(root, [KERNELS["numpy.tanh"]])
    (same,) = graph_matches(func, "numpy.tanh")
    assert m.ops == same.ops  # block order by walking back equals the positions' order
    assert matches_at(root, [KERNELS["numpy.fma"]]) == []


def test_matching_is_linear_in_the_block():
    """Count matcher steps (not time) on n copies of the formula plus n unrelated ops: an op no
    graph kernel can end at costs no matcher step, so 4x the ops cost 4x the steps."""
    calls = {"n": 0}
    original = match_module._Matcher.value

    def counting(self, rv, pv):
        calls["n"] += 1
        return original(self, rv, pv)

    def steps(n: int) -> int:
        lines, x = [], "x"
        for i in range(n):  # a chain: copy i reads copy i-1 through an abs, so CSE keeps all
            copy = tanh_formula(x="X", neg_of="X", y="Y").replace("%", f"%k{i}_")
            lines.append(copy.replace(f"%k{i}_X", f"%{x}").replace(f"%k{i}_Y", f"%t{i}"))
            lines.append(unary("atomic.abs", f"t{i}", f"u{i}"))
            x = f"u{i}"
        lines.append(unary("atomic.neg", x, "y"))
        func = canonical("\n".join(lines))
        calls["n"] = 0
        found = find_matches(func.body)
        assert sum(m.kernel.name == "numpy.tanh" for ms in found.values() for m in ms) == n
        return calls["n"]

    match_module._Matcher.value = counting
    try:
        small, large = steps(5), steps(20)
    finally:
        match_module._Matcher.value = original
    assert 0 < small and large == 4 * small


CAST_KERNEL_TEXT = """
func.func @exp_to_f16(%x: tensor<4xf32>) -> tensor<4xf16> {
  %e = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %y = atomic.cast %e : (tensor<4xf32>) -> tensor<4xf16>
  func.return %y : tensor<4xf16>
}
"""


@pytest.mark.parametrize("element, matches", [("f16", 1), ("bf16", 0)])
def test_an_op_whose_result_type_is_its_meaning_matches_that_type_only(element, matches):
    """A cast's result type is what it does: exp then cast to f16 is not exp then cast to bf16."""
    kernel = register_kernel(Kernel("numpy.test_exp_f16", "numpy", reference=CAST_KERNEL_TEXT))
    try:
        t, r = "tensor<4xf32>", f"tensor<4x{element}>"
        body = unary("atomic.exp", "x", "e", t) + f"\n  %y = atomic.cast %e : ({t}) -> {r}"
        func = canonical(body, f"%x: {t}", rtype=r)
        assert len(graph_matches(func, kernel.name)) == matches
    finally:
        unregister_kernel(kernel.name)

"""The template dispatch of codegen/kernels.py: every template a `kernel.fused` may name has a
generator, a "generic" region picks one by its ops, and each generator's refusal of a region it
cannot generate is one located error (the kernel's location unless an inner op is to blame).
Regions are written by hand here: the planner offers only regions whose code generates, so these
refusals are what a hand-written region (or a new fusion rule) meets."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from tgc.codegen.kernels import GENERATORS, generate_kernel, template_of
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import TEMPLATES, FusedOp
from tgc.parser import parse_module
from tgc.verifier import verify


@dataclass(frozen=True)
class Region:
    """A function whose body is one kernel.fused (on line 2, at column 9 with one result, 14
    with two) over the function's arguments, named %b_<name> inside the region."""

    template: str
    args: str  # "%x: tensor<4x8xf32>, ..."
    results: str  # "tensor<4xf32>, ..."
    body: tuple[str, ...]  # one op per line, from line 4 on
    yields: str  # "%s, ..."

    def text(self) -> str:
        args = self.args.split(", ")
        arg_types = ", ".join(a.split(": ", 1)[1] for a in args)
        names = ", ".join(a.split(": ", 1)[0] for a in args)
        inner = ", ".join(a.replace("%", "%b_") for a in args)
        outs = ", ".join(f"%r{i}" for i in range(len(self.results.split(", "))))
        body = "".join(f"    {line}\n" for line in self.body)
        return (
            f"func.func @f({self.args}) -> ({self.results}) {{\n"
            f'  {outs} = kernel.fused {names} {{name = "k", template = "{self.template}"}} : '
            f"({arg_types}) -> ({self.results}) {{\n"
            f"  ^bb0({inner}):\n{body}"
            f"    kernel.yield {self.yields} : {self.results}\n"
            f"  }}\n"
            f"  func.return {outs} : {self.results}\n"
            f"}}\n"
        )

    def fused(self) -> FusedOp:
        """The kernel.fused of the verified module (file "case.tg")."""
        module = parse_module(self.text(), "case.tg")
        verify(module)
        (op,) = [o for o in module.walk() if isinstance(o, FusedOp)]
        return op


X = "%x: tensor<4x8xf32>"
XW = "%x: tensor<4x8xf32>, %w: tensor<8x16xf32>"
SUM_ROWS = "%s = atomic.reduce_sum %b_x {axes = [1]} : (tensor<4x8xf32>) -> tensor<4xf32>"
SUM_COLS = "%s = atomic.reduce_sum %b_x {axes = [0]} : (tensor<4x8xf32>) -> tensor<8xf32>"
EXP = "%e = atomic.exp %b_x : (tensor<4x8xf32>) -> tensor<4x8xf32>"
EXP_W = "%f = atomic.exp %b_w : (tensor<8x16xf32>) -> tensor<8x16xf32>"
MATMUL = "(tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>"
ATTENTION = "(tensor<4x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>"
WIDE_ATTENTION = "(tensor<4x200xf32>, tensor<8x200xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>"
SLICE = "(tensor<4xf32>) -> tensor<2xf32>"


def test_every_template_has_a_generator():
    assert set(GENERATORS) == set(TEMPLATES) - {"generic"}


@pytest.mark.parametrize(
    ("body", "yields", "results", "template"),
    [
        (SUM_ROWS, "%s", "tensor<4xf32>", "row_reduction"),
        (EXP, "%e", "tensor<4x8xf32>", "elementwise"),
    ],
)
def test_a_generic_region_generates_as_the_template_its_ops_pick(body, yields, results, template):
    generic = Region("generic", X, results, (body,), yields).fused()
    named = Region(template, X, results, (body,), yields).fused()
    assert template_of(generic) == template
    got, want = generate_kernel(generic), generate_kernel(named)
    assert got.template == template
    assert (got.source, got.grid, got.block, got.params) == (
        want.source,
        want.grid,
        want.block,
        want.params,
    )


# case -> (region, message, line:col of the error in case.tg)
REFUSED = {
    # (outputs of several shapes are parts of one launch: the part of the sums still refuses)
    "a reduction in an elementwise kernel": (
        Region("elementwise", X, "tensor<4x8xf32>, tensor<4xf32>", (EXP, SUM_ROWS), "%e, %s"),
        "'atomic.reduce_sum' cannot be generated inside this kernel",
        "5:10",
    ),
    "reductions over different rows": (
        Region(
            "row_reduction",
            X,
            "tensor<4xf32>, tensor<8xf32>",
            (SUM_ROWS, SUM_COLS.replace("%s", "%t")),
            "%s, %t",
        ),
        "kernel 'k' reduces over different rows",
        "5:10",
    ),
    "an output neither a row nor per row": (
        Region(
            "row_reduction",
            X,
            "tensor<4xf32>, tensor<2xf32>",
            (
                SUM_ROWS,
                f"%t = atomic.slice %s {{start = [0], stop = [2], step = [1]}} : {SLICE}",
            ),
            "%s, %t",
        ),
        "kernel 'k' yields a value that is neither a row nor one value per row",
        "2:14",
    ),
    "full rows of a non-suffix reduction": (
        Region("row_reduction", X, "tensor<8xf32>, tensor<4x8xf32>", (SUM_COLS, EXP), "%s, %e"),
        "kernel 'k' writes full rows of a non-suffix reduction",
        "2:14",
    ),
    "a matmul kernel without a matmul": (
        Region("matmul", X, "tensor<4x8xf32>", (EXP,), "%e"),
        "matmul kernel 'k' needs exactly one atomic.matmul",
        "2:9",
    ),
    "a matmul's B computed in the kernel": (
        Region(
            "matmul",
            XW,
            "tensor<4x16xf32>",
            (EXP_W, f"%m = atomic.matmul %b_x, %f : {MATMUL}"),
            "%m",
        ),
        "matmul operands must be kernel inputs",
        "5:10",
    ),
    "a matmul's A computed in the kernel, where the few-rows skeleton cannot run": (
        Region(
            "matmul", XW, "tensor<4x16xf32>", (EXP, f"%m = atomic.matmul %e, %b_w : {MATMUL}"), "%m"
        ),
        "the few-rows matmul cannot run 'k': B is not transposed (its rows must be k, as a "
        "weight [n][k] is stored)",
        "2:9",
    ),
    "a matmul kernel output of another shape": (
        Region(
            "matmul",
            XW,
            "tensor<4x16xf32>, tensor<4x8xf32>",
            (f"%m = atomic.matmul %b_x, %b_w : {MATMUL}", EXP),
            "%m, %e",
        ),
        "matmul kernel 'k' yields a value of another shape",
        "2:14",
    ),
    "an attention kernel without attention": (
        Region("attention", X, "tensor<4x8xf32>", (EXP,), "%e"),
        "attention kernel 'k' needs exactly one hl.attention",
        "2:9",
    ),
    "an attention the kernel cannot run (head dim over 128)": (
        Region(
            "attention",
            "%q: tensor<4x200xf32>, %k: tensor<8x200xf32>, %v: tensor<8x16xf32>",
            "tensor<4x16xf32>",
            (f"%o = hl.attention %b_q, %b_k, %b_v : {WIDE_ATTENTION}",),
            "%o",
        ),
        "this hl.attention cannot run as a fused kernel (lower it first)",
        "4:10",
    ),
    "an attention operand computed in the kernel": (
        Region(
            "attention",
            "%q: tensor<4x16xf32>, %k: tensor<8x16xf32>, %v: tensor<8x16xf32>",
            "tensor<4x16xf32>",
            (
                "%e = atomic.exp %b_q : (tensor<4x16xf32>) -> tensor<4x16xf32>",
                f"%o = hl.attention %e, %b_k, %b_v : {ATTENTION}",
            ),
            "%o",
        ),
        "attention operand 'q' is not a strided view of a kernel input",
        "2:9",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_region_the_template_cannot_generate_is_one_located_error(case):
    region, message, where = REFUSED[case]
    with pytest.raises(TgcError) as info:
        generate_kernel(region.fused())
    assert info.value.message == message
    assert str(info.value.loc) == f"case.tg:{where}"


@pytest.mark.parametrize(
    "exponent, product",
    [("2.0", "(x * x)"), ("3.0", "(x * x * x)"), ("2.5", None), ("-3.0", None)],
)
@pytest.mark.parametrize("template", ["elementwise", "row_reduction"])
def test_small_integer_powers_are_products_not_powf(exponent, product, template):
    """x**3 (GPT-2's GELU) as x*x*x: powf costs several times the multiplications and is no
    more exact. Other exponents keep powf."""
    body = [
        f"%c = atomic.constant {{value = dense<{exponent}> : tensor<4x8xf32>}} : () -> tensor<4x8xf32>",
        "%p = atomic.pow %b_x, %c : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>",
    ]
    if template == "row_reduction":
        body.append("%s = atomic.reduce_sum %p {axes = [1]} : (tensor<4x8xf32>) -> tensor<4xf32>")
        region = Region(template, X, "tensor<4xf32>", tuple(body), "%s")
    else:
        region = Region(template, X, "tensor<4x8xf32>", tuple(body), "%p")
    source = generate_kernel(region.fused()).source
    if product is None:
        assert "powf(" in source
    else:
        assert "powf(" not in source
        factors = product.count("x")  # the base, whatever the generator names it, n times
        pattern = r"\(([^()]+?)" + r" \* \1" * (factors - 1) + r"\)"
        assert re.search(pattern, source), source

"""`fuse` preserves results: every case of the fuse lit tests and every example, interpreted
before and after the pass in float64, must agree; and the structure the pass promises holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tgc.dialects.kernel import FusedOp
from tgc.parser import parse_module
from tgc.pass_manager import PASSES, PassManager
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.verifier import verify

ROOT = Path(__file__).resolve().parent.parent
LIT_CASES = [
    (path.name, i, text)
    for path in sorted((ROOT / "test/lit/fuse").glob("*.tg"))
    for i, text in enumerate(path.read_text().split("// -----"))
]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.tg"))


def _check_fuse_preserves(text: str, pre: str = "") -> list[FusedOp]:
    before = parse_module(text)
    verify(before)
    if pre:
        PassManager.from_text(pre).run(before)
    after = parse_module(text)
    PassManager.from_text(",".join(p for p in (pre, "fuse") if p)).run(after)
    fused = []
    for f_before, f_after in zip(before.funcs, after.funcs):
        inputs = random_inputs(f_before, 7)
        want = run_function(f_before, inputs, "f64")
        got = run_function(f_after, inputs, "f64")
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        fused += [op for op in f_after.body.ops if isinstance(op, FusedOp)]
    return fused


@pytest.mark.parametrize("name,index,text", LIT_CASES, ids=[f"{n}-{i}" for n, i, _ in LIT_CASES])
def test_fuse_lit_cases_preserve_results(name, index, text):
    _check_fuse_preserves(text)


@pytest.mark.parametrize("name", EXAMPLES)
def test_fuse_examples_preserve_results(name):
    pre = "lower-hl" if "lower-hl" in PASSES else ""
    if not pre:
        pytest.skip("lower-hl is not registered yet")
    fused = _check_fuse_preserves((ROOT / "examples" / name).read_text(), pre)
    assert fused, "no kernel was formed"
    names = [op.attr("name") for op in fused]
    assert len(set(names)) == len(names)


def test_softmax_is_one_kernel():
    text = (ROOT / "test/lit/fuse/row_reduction.tg").read_text().split("// -----")[0]
    (op,) = _check_fuse_preserves(text)
    assert op.attr("template") == "row_reduction"
    assert len(op.results) == 1


def test_every_op_lands_in_one_kernel_and_names_are_identifiers():
    for _, _, text in LIT_CASES:
        module = parse_module(text)
        PassManager.from_text("fuse").run(module)
        for op in module.walk():
            if isinstance(op, FusedOp):
                assert op.attr("name").isidentifier()
                assert all(not isinstance(inner, FusedOp) for inner in op.body.ops)

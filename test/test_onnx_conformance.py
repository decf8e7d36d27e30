"""The ONNX backend node tests (onnx 1.22.0) imported with tgc-import and run on the numpy
interpreter, compared with the expected outputs at the ONNX runner's tolerances.

Scope and expected failures: test/onnx_conformance_cases.py (its docstring states the rule).
Every case is one test named after its folder: in scope it must pass, or is an
xfail(strict=True) with its reason; out of scope it is skipped with "out of scope: ..." (so
`pytest -rs` lists them and the summary counts them). test_node_optimized runs the in-scope
cases again after `-p optimize`. docs/onnx.md's "Conformance" table is
written from the same data (test/onnx_conformance_table.py); `test_doc_table_is_current` fails
when it is stale.
"""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install tgc[onnx])")

import onnx_conformance_cases as cases  # noqa: E402  (after the importorskip)
import onnx_conformance_table as table  # noqa: E402


def _params():
    params = []
    for case in cases.all_cases():
        marks = []
        skip = cases.out_of_scope(case)
        if skip:
            marks.append(pytest.mark.skip(reason=skip))
        else:
            reason = cases.expected_failure(case)
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_node(case):
    cases.run_case(case)


def _optimized_params():
    params = []
    for case in cases.all_cases():
        if cases.out_of_scope(case):
            continue  # reported once, by test_node
        reason = cases.expected_failure(case, optimized=True)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _optimized_params())
def test_node_optimized(case):
    """The in-scope cases again, after `-p optimize` (decompositions and rewrites)."""
    cases.run_case(case, pipeline=cases.PIPELINE)


def test_suite_is_the_one_of_onnx_1_22():
    """The cases are onnx 1.22.0's (later releases ship no test data): 1765 of them."""
    assert onnx.__version__ == "1.22.0"
    assert len(cases.all_cases()) == 1765


def test_expected_failures_name_in_scope_cases():
    """Every entry of the xfail lists names an in-scope case or op (a stale entry is an error:
    it would hide nothing, or hide a case that is out of scope anyway)."""
    in_scope = [c for c in cases.all_cases() if cases.out_of_scope(c) is None]
    names = {c.name for c in in_scope}
    ops = {op for c in in_scope for op in c.op_types}
    assert sorted(set(cases.EXPECTED_FAILURES) - names) == []
    assert sorted(set(cases.EXPECTED_FAILURES_OPTIMIZED) - names) == []
    assert sorted(set(cases.EXPECTED_FAILING_OPS) - ops) == []
    listed = [
        cases.EXPECTED_FAILURES,
        cases.EXPECTED_FAILING_OPS,
        cases.EXPECTED_FAILURES_OPTIMIZED,
    ]
    assert all(reason for found in listed for reason in found.values())


def test_scope_rule():
    """The rule on known cases: a single-node float case of a listed op is in; another domain,
    an old opset, a type tgc lacks, a sequence and an unlisted op are out, each saying why."""
    by_name = {c.name: c for c in cases.all_cases()}
    assert cases.out_of_scope(by_name["test_relu"]) is None
    assert cases.out_of_scope(by_name["test_softmax_axis_0_expanded"]) is None
    assert by_name["test_softmax_axis_0_expanded"].op == "Softmax"
    reasons = {
        "test_ai_onnx_ml_binarizer": "out of scope: domain ai.onnx.ml",
        "test_and2d": "out of scope: opset 7",
        "test_bitcast_int8_to_uint8": "out of scope: element type uint8 (tgc has no",
        "test_cast_FLOAT_to_BFLOAT16": "out of scope: element type bfloat16 (not a numpy",
        "test_identity_sequence": "out of scope: sequence",
        "test_lppool_1d_default": "out of scope: op LpPool",
    }
    for name, start in reasons.items():
        found = cases.out_of_scope(by_name[name])
        assert found is not None and found.startswith(start), (name, found)


def test_compare_fails_on_a_wrong_answer():
    """The check can fail: a value off by more than the tolerance, a wrong dtype or shape."""
    import numpy as np

    expected = [np.array([1.0, 2.0], np.float32)]
    cases.compare([expected[0] * (1 + 1e-4)], expected, 1e-3, 1e-7, "ok")
    wrong = [
        [np.array([1.0, 2.01], np.float32)],
        [np.array([1.0, 2.0], np.float64)],
        [np.array([[1.0, 2.0]], np.float32)],
        [],
    ]
    for got in wrong:
        with pytest.raises(AssertionError):
            cases.compare(got, expected, 1e-3, 1e-7, "wrong")


def test_doc_table_is_current():
    """docs/onnx.md's Conformance section is what the script writes from the data above."""
    current = table.read_section()
    assert current == table.render(), (
        "docs/onnx.md is stale: run `python test/onnx_conformance_table.py --write`"
    )

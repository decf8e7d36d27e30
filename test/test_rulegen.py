"""tgc-rulegen (passes/rulegen/): a tiny configuration runs in about a second here; its counts are
deterministic (seeded), known rules must be among the kept ones, and a candidate that agrees on
the fingerprint draw but not in general must be rejected by verification."""

from __future__ import annotations

import numpy as np
import pytest

from tgc.parser import parse_module
from tgc.passes.rulegen.enumerate import Config, enumerate_terms
from tgc.passes.rulegen.generate import generate
from tgc.passes.rulegen.known import known_rules, rediscovered
from tgc.passes.rulegen.prune import Matcher, renaming_key
from tgc.passes.rulegen.table import write_table
from tgc.passes.rulegen.terms import Maker
from tgc.passes.rulegen.verify import verify_candidate
from tgc.tools import rulegen
from tgc.types import TensorType
from tgc.verifier import verify

TINY = Config(ops=("add", "mul", "matmul"), max_ops=3, inputs=3)


@pytest.fixture(scope="module")
def tiny():
    return generate(TINY)


def test_tiny_counts(tiny):
    assert tiny.counts == {
        "graphs": 5831,
        "classes": 4228,
        "candidates": 1606,
        "renamings": 1230,
        "instances": 317,
        "tested": 59,
        "rejected": 0,
        "no_table_form": 0,
        "verified": 59,
        "kept": 59,
        "exact": 59,  # add, mul and matmul: every rule is a polynomial identity
    }


def _has(gen, src, tgt) -> bool:
    matcher = Matcher()
    return any(matcher.instance_of((r.src, r.tgt), src, tgt) for r in gen.rules)


def test_finds_distributivity(tiny):
    m = Maker()
    a, b, c = m.input(0), m.input(1), m.input(2)
    # A@B + A@C = A@(B+C), and x*a + x*b = x*(a+b), with the inputs renamed
    assert _has(tiny, m.op("add", m.op("matmul", a, b), m.op("matmul", a, c)),
                m.op("matmul", a, m.op("add", b, c)))  # fmt: skip
    assert _has(tiny, m.op("add", m.op("mul", c, a), m.op("mul", b, c)),
                m.op("mul", c, m.op("add", a, b)))  # fmt: skip
    # and not a false one: A@B + A@C = (B+C)@A
    assert not _has(tiny, m.op("add", m.op("matmul", a, b), m.op("matmul", a, c)),
                    m.op("matmul", m.op("add", b, c), a))  # fmt: skip


def test_rediscovery_report(tiny):
    found = rediscovered(known_rules(), [(r.src, r.tgt) for r in tiny.rules], TINY.ops, 3)
    assert found["algebraic:distribute-matmul-left (+)"] == "found"
    assert found["algebraic:reassociate-matmul"] == "found"
    assert found["algebraic:distribute-mul (-)"] == "out of reach"  # no sub enumerated
    assert list(found.values()).count("found") == 4


def test_every_kept_rule_holds_on_fresh_inputs(tiny):
    rng = np.random.default_rng(12345)
    for r in tiny.rules[::5]:
        assert verify_candidate(r.src, r.tgt, rng, shapes_tried=2, draws=3).ok, str(r.src)


def test_verification_rejects_a_coincidence():
    """a*b and a+b agree wherever b = a/(a-1): on such a draw their fingerprints collide."""
    m = Maker()
    a, b = m.input(0), m.input(1)
    result = verify_candidate(m.op("mul", a, b), m.op("add", a, b), np.random.default_rng(0))
    assert not result.ok and result.reason.startswith("differs by")
    # rectangular shapes are what tell A@B from (A@B)ᵀ-like coincidences of square ones
    wrong = verify_candidate(m.op("matmul", a, b), m.op("matmul", b, a), np.random.default_rng(0))
    assert not wrong.ok


def test_polynomial_rules_are_also_checked_in_exact_arithmetic():
    """Rules over polynomial ops are compared on random integers exactly (a polynomial identity
    test); a rule with exp rests on the float tests alone; sides that differ exactly are told
    apart however close they are in floats."""
    from tgc.passes.rulegen.verify import exactly_equal

    m = Maker()
    a, b, c = m.input(0), m.input(1), m.input(2)
    rng = np.random.default_rng(0)
    distribute = verify_candidate(
        m.op("add", m.op("matmul", a, b), m.op("matmul", a, c)),
        m.op("matmul", a, m.op("add", b, c)),
        rng,
    )
    assert distribute.ok and distribute.exact
    exp = verify_candidate(
        m.op("mul", m.op("exp", a), m.op("exp", b)), m.op("exp", m.op("add", a, b)), rng
    )
    assert exp.ok and not exp.exact
    types = {0: TensorType.get((3, 4), "f64"), 1: TensorType.get((3, 4), "f64")}
    assert exactly_equal(m.op("add", a, b), m.op("add", b, a), types, rng)
    # a - (a - b) = b exactly; a*b and a + b differ
    assert exactly_equal(m.op("sub", a, m.op("sub", a, b)), b, types, rng)
    assert not exactly_equal(m.op("mul", a, b), m.op("add", a, b), types, rng)


def test_forced_collisions_are_rejected(tiny):
    """With 0 significant digits many fingerprints collide: verification rejects the false
    candidates, and the rules kept are the same as with real fingerprints."""
    coarse = generate(Config(ops=TINY.ops, max_ops=3, inputs=3, digits=0))
    assert coarse.counts["rejected"] > 0
    assert coarse.counts["candidates"] > tiny.counts["candidates"]
    keys = {renaming_key(r.src, r.tgt) for r in coarse.rules}
    assert keys == {renaming_key(r.src, r.tgt) for r in tiny.rules}


def test_enumeration_sizes():
    e = enumerate_terms(Config(ops=("add", "matmul"), max_ops=1, inputs=2))
    # add: {a+a, a+b, b+b}; matmul: 4 ordered pairs; a+a and ... all distinct classes
    assert e.graphs == 7 and len(e.reps) == 9 and not e.candidates


def test_table_parses_and_verifies(tiny):
    text = write_table(tiny, ["test"])
    module = parse_module(text, "table.tg")
    verify(module)
    assert len(module.funcs) == 2 * len(tiny.rules)
    assert "// evidence: 48 draws of N(0,1) float64 inputs" in text


def test_cli_report_and_errors(tmp_path, capsys):
    out = tmp_path / "rules.tg"
    assert rulegen.main(["--max-ops", "2", "--ops", "add,matmul", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "graphs " in err and "rediscovered 1 of the 1 hand-written rule forms" in err
    assert "@r1_src" in out.read_text()
    assert rulegen.main(["--ops", "add,nope"]) == 2
    assert "unknown op 'nope'" in capsys.readouterr().err


def test_apply_rules_keeps_values(tiny, tmp_path):
    """Each kept rule's source, at sizes other than the table's, rewritten by `apply-rules` with
    the whole tiny table: float64 results agree within 1e-9 (relative to the largest entry)."""
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.passes.rulegen.verify import Shapes, arg_types_for, build_function, relative_error
    from tgc.evaluate import evaluate_block

    path = tmp_path / "tiny.tg"
    path.write_text(write_table(tiny, ["tiny"]))
    rng = np.random.default_rng(7)
    fired = 0
    for r in tiny.rules:
        ev = r.evidence
        symbols = sorted({d for shape in ev.arg_shapes for d in shape})
        sizes = dict(zip(symbols, (4, 6, 3, 5)))
        types = arg_types_for(Shapes(), dict(zip(ev.inputs, ev.arg_shapes)), sizes, "f32")
        func = build_function(r.src, "f", types)
        inputs = [rng.standard_normal(t.shape) for _, t in sorted(types.items())]
        (before,) = evaluate_block(func.body, inputs, "f64")
        ops_before = [op.name for op in func.body.ops]
        PassManager(parse_pipeline(f"apply-rules{{file={path}}},dce")).run(func.parent_op)
        (after,) = evaluate_block(func.body, inputs, "f64")
        assert relative_error(before, after) <= 1e-9, str(r.src)
        fired += [op.name for op in func.body.ops] != ops_before
    assert fired >= 5  # the rules whose target has fewer ops (apply-rules fires only those)

"""The committed rule table (rules/generated.tg, written by `tgc-rulegen -o rules/generated.tg`;
docs/rulegen.md) re-verified on fresh inputs: each run checks SAMPLE rules drawn at random, at
sizes the table was not written at and on fresh float64 inputs, so over many runs every rule is
checked again. A failure names the rule and the seed; `TGC_RULES_SEED=<seed>` replays it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np

from tgc.builder import Builder
from tgc.builtin import ReturnOp
from tgc.evaluate import evaluate_block
from tgc.ir import Block
from tgc.passes.rule_file import PVar, load_rules
from tgc.types import TensorType

TABLE = Path(__file__).resolve().parent.parent / "rules" / "generated.tg"
SAMPLE = 40  # rules a run checks (about 0.3 s of the run)
SIZES = 3  # size instantiations per rule, each with its own inputs
TOLERANCE = 1e-9  # largest difference, relative to the largest entry of the source's result


def _seed() -> int:
    return int(os.environ.get("TGC_RULES_SEED", random.randrange(2**32)))


def _built(pattern, args, builder: Builder):
    if isinstance(pattern, PVar):
        return args[pattern.index]
    operands = [_built(c, args, builder) for c in pattern.children]
    return builder.create(pattern.op, operands, dict(pattern.attributes)).results[0]


def _both_sides(rule, arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The rule's source and target evaluated in float64 on `arrays` (their ops built anew at
    the arrays' shapes, so every result type is inferred again)."""
    block = Block([TensorType.get(a.shape, "f64") for a in arrays])
    builder = Builder.at_end(block)
    src = _built(rule.src, block.args, builder)
    tgt = _built(rule.tgt, block.args, builder)
    block.append(ReturnOp([src, tgt], []))
    got_src, got_tgt = evaluate_block(block, arrays, "f64")
    return np.asarray(got_src), np.asarray(got_tgt)


def _resized(rule, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """The rule's argument shapes with each shape symbol (a size other than 1) drawn anew,
    distinct symbols distinct sizes."""
    symbols = sorted({d for t in rule.arg_types for d in t.shape if d != 1})
    sizes = rng.choice(np.arange(2, 14), size=len(symbols), replace=False)
    new = dict(zip(symbols, (int(s) for s in sizes)))
    return [tuple(new.get(d, 1) for d in t.shape) for t in rule.arg_types]


def test_the_committed_table_holds_on_fresh_sizes_and_inputs():
    rules = load_rules(str(TABLE))
    assert len(rules) > 1000  # the whole default table, not a stub
    seed = _seed()
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(rules), size=SAMPLE, replace=False)
    for index in picked:
        rule = rules[int(index)]
        for _ in range(SIZES):
            arrays = [rng.standard_normal(shape) for shape in _resized(rule, rng)]
            src, tgt = _both_sides(rule, arrays)
            scale = max(float(np.max(np.abs(src))), 1.0)
            error = float(np.max(np.abs(src - tgt))) / scale
            shapes = [a.shape for a in arrays]
            assert src.shape == tgt.shape and error <= TOLERANCE, (
                f"rule {rule.name} ({rule.loc}) differs by {error:.3g} at shapes {shapes} "
                f"(TGC_RULES_SEED={seed} replays this run)"
            )


def test_a_wrong_rule_is_caught():
    """The check can fail: a rule whose target is another input's value differs."""
    rules = load_rules(str(TABLE))
    rule = next(r for r in rules if isinstance(r.tgt, PVar) and len(r.arg_types) > 1)
    other = next(i for i in range(len(rule.arg_types)) if i != rule.tgt.index)
    wrong = type(rule)(rule.name, rule.src, PVar(other), rule.arg_types, rule.loc)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape) for shape in _resized(rule, rng)]
    src, tgt = _both_sides(wrong, arrays)
    assert src.shape != tgt.shape or np.max(np.abs(src - tgt)) > TOLERANCE

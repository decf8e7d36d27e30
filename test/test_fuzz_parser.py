"""Mutation fuzzing of the front end: thousands of damaged inputs (bytes flipped, lines dropped
or duplicated, tokens swapped, hostile characters put into strings and names) must each give
either a valid module or a clean TgcError with a location inside the input, never any other
exception; a valid module must print, and its printed text must read back to the same text.

Each test runs once with a fresh seed, printed on failure (replay with TGC_FUZZ_SEED=<seed>),
and once with every seed that ever failed (FAILED_SEEDS: add a seed there when one fails).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from tgc.diagnostics import TgcError
from tgc.parser import parse_module
from tgc.printer import print_module
from tgc.verifier import verify

ROOT = Path(__file__).resolve().parent.parent
CORPUS = sorted(ROOT.glob("examples/*.tg")) + sorted(ROOT.glob("test/lit/roundtrip/Inputs/*.tg"))
TOKEN = re.compile(r"%[\w.$-]+|@[\w.$-]+|\"[^\"\n]*\"|tensor<[^>\n]*>|[\w.]+|->|\S")
STRING = re.compile(r'"[^"\n]*"')
N_MUTANTS = 1500

# Seeds that once failed, each replayed on every run. mutate 1792854811: a NUL byte inside a
# string attribute reached Python's own string parser (issue 10, item 2). hostile 1791126896:
# a U+2028 inside a tensor type was whitespace to the type's regex and then not a digit to int().
# hostile 3284266606: 73 valid mutants of 1,500, under the bound of 75 the test then had (60
# seeds gave 75 to 123: the bound failed about one run in thirty; it is 30 now).
FAILED_SEEDS = {
    "mutate": [1792854811],
    "hostile": [1791126896, 3284266606],
}

# Characters that once broke, or could break, the lexer, the string decoder or the printer:
# controls, a BOM, line and paragraph separators, a bidi override, a lone surrogate, escapes
# that are Python's and not MLIR's, quotes and backslashes.
HOSTILE = [
    "\x00",
    "\x01",
    "\x1b",
    "\x7f",
    "\x85",
    "\r",
    "\x0b",
    "\x0c",
    "\t",
    "\ufeff",
    "\u2028",
    "\u2029",
    "\u202e",
    "\ud800",
    "é",
    "中",
    "\U0001f600",
    "\\",
    '"',
    "\\x41",
    "\\N{DASH}",
    "\\u0041",
    "\\41",
    "\\C3\\A9",
    "\\FF",
    "\\n",
    "*/",
    "%",
    "@",
    "^",
    "1e400",
    "300",
    "[" * 300,
]


def fresh_seed() -> int:
    return int(os.environ.get("TGC_FUZZ_SEED", random.randrange(2**32)))


def mutate(text: str, rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:  # flip a byte to a random printable or special character
        i = rng.randrange(len(text))
        ch = rng.choice('%@{}()<>[],:="^x-0123456789.\n\t #' + "ÿ\x00")
        return text[:i] + ch + text[i + 1 :]
    lines = text.split("\n")
    if kind == 1:  # drop a line
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines)
    if kind == 2:  # duplicate a line
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return "\n".join(lines)
    tokens = [m for m in TOKEN.finditer(text)]
    if kind == 3:  # swap two tokens
        a, b = sorted(rng.sample(range(len(tokens)), 2))
        ta, tb = tokens[a], tokens[b]
        return (
            text[: ta.start()]
            + tb.group()
            + text[ta.end() : tb.start()]
            + ta.group()
            + text[tb.end() :]
        )
    if kind == 4:  # delete a token
        t = rng.choice(tokens)
        return text[: t.start()] + text[t.end() :]
    t = rng.choice(tokens)  # replace a token by another one from the text
    return text[: t.start()] + rng.choice(tokens).group() + text[t.end() :]


def mutate_hostile(text: str, rng: random.Random) -> str:
    """Put a hostile piece inside a string literal (half the time) or anywhere."""
    piece = rng.choice(HOSTILE)
    strings = list(STRING.finditer(text))
    if strings and rng.random() < 0.5:
        s = rng.choice(strings)
        i = rng.randrange(s.start() + 1, s.end())
    else:
        i = rng.randrange(len(text) + 1)
    return text[:i] + piece + text[i:]


def check_mutant(text: str, where: str) -> str:
    """'valid' or 'diagnosed'; anything else fails with `where` (seed and mutant number)."""
    n_lines = text.count("\n") + 1
    try:
        module = parse_module(text, "fuzz.tg")
        verify(module)
        printed = print_module(module)
        assert print_module(parse_module(printed, "again.tg")) == printed, where
        return "valid"
    except TgcError as e:
        rendered = e.render()
        if e.loc is not None and e.loc.line:
            assert 1 <= e.loc.line <= n_lines, (where, rendered)
            assert rendered.startswith("fuzz.tg:"), (where, rendered)
        return "diagnosed"
    except Exception as e:  # pragma: no cover - the failure report
        raise AssertionError(
            f"{where} raised {type(e).__name__}: {e}\n--- input ---\n{text!r}"
        ) from e


def run_fuzz(seed: int, mutator) -> dict[str, int]:
    rng = random.Random(seed)
    sources = [p.read_text() for p in CORPUS]
    outcomes = {"valid": 0, "diagnosed": 0}
    for i in range(N_MUTANTS):
        text = rng.choice(sources)
        for _ in range(rng.randint(1, 3)):
            text = mutator(text, rng)
        outcomes[check_mutant(text, f"mutant {i} of seed {seed} (TGC_FUZZ_SEED={seed})")] += 1
    return outcomes


@pytest.mark.parametrize("seed", [None, *FAILED_SEEDS["mutate"]], ids=lambda s: f"seed={s}")
def test_mutated_inputs_give_only_clean_diagnostics(seed):
    seed = fresh_seed() if seed is None else seed
    outcomes = run_fuzz(seed, mutate)
    assert outcomes["diagnosed"] > N_MUTANTS // 2, outcomes  # the mutations really damage input


@pytest.mark.parametrize("seed", [None, *FAILED_SEEDS["hostile"]], ids=lambda s: f"seed={s}")
def test_hostile_characters_give_only_clean_diagnostics(seed):
    seed = fresh_seed() if seed is None else seed
    outcomes = run_fuzz(seed, mutate_hostile)
    # Both outcomes occur: a hostile piece inside a string is often legal (é, \41) and often
    # not (a NUL, \x41), so neither side is vacuous (valid: 5-8% of the mutants over 60 seeds).
    assert outcomes["valid"] > N_MUTANTS // 50 and outcomes["diagnosed"] > N_MUTANTS // 2, outcomes

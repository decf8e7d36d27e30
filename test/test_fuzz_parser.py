"""Mutation fuzzing of the front end: thousands of damaged inputs (bytes flipped, lines dropped
or duplicated, tokens swapped) must each give either a valid module or a clean TgcError with a
location inside the input, never any other exception.

The seed is fresh each run and printed on failure; replay with TGC_FUZZ_SEED=<seed>.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

from tgc.diagnostics import TgcError
from tgc.parser import parse_module
from tgc.printer import print_module
from tgc.verifier import verify

ROOT = Path(__file__).resolve().parent.parent
CORPUS = sorted(ROOT.glob("examples/*.tg")) + sorted(ROOT.glob("test/lit/roundtrip/Inputs/*.tg"))
TOKEN = re.compile(r"%[\w.$-]+|@[\w.$-]+|\"[^\"\n]*\"|tensor<[^>\n]*>|[\w.]+|->|\S")
N_MUTANTS = 3000


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
        return (text[: ta.start()] + tb.group() + text[ta.end() : tb.start()] + ta.group()
                + text[tb.end() :])
    if kind == 4:  # delete a token
        t = rng.choice(tokens)
        return text[: t.start()] + text[t.end() :]
    t = rng.choice(tokens)  # replace a token by another one from the text
    return text[: t.start()] + rng.choice(tokens).group() + text[t.end() :]


def test_mutated_inputs_give_only_clean_diagnostics():
    seed = int(os.environ.get("TGC_FUZZ_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    sources = [p.read_text() for p in CORPUS]
    outcomes = {"valid": 0, "diagnosed": 0}
    for i in range(N_MUTANTS):
        text = rng.choice(sources)
        for _ in range(rng.randint(1, 3)):
            text = mutate(text, rng)
        n_lines = text.count("\n") + 1
        try:
            module = parse_module(text, "fuzz.tg")
            verify(module)
            printed = print_module(module)
            assert print_module(parse_module(printed, "again.tg")) == printed, (seed, i)
            outcomes["valid"] += 1
        except TgcError as e:
            outcomes["diagnosed"] += 1
            rendered = e.render()
            assert "\n" not in rendered.split("\n")[0]
            if e.loc is not None and e.loc.line:
                assert 1 <= e.loc.line <= n_lines, (seed, i, rendered)
                assert rendered.startswith("fuzz.tg:"), (seed, i, rendered)
        except Exception as e:  # pragma: no cover - the failure report
            raise AssertionError(
                f"mutant {i} of seed {seed} raised {type(e).__name__}: {e}\n--- input ---\n{text}"
            ) from e
    assert outcomes["diagnosed"] > N_MUTANTS // 2, outcomes  # the mutations really damage input

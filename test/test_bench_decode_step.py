"""bench/decode_step.py on the CPU: its dry run, a tiny Llama in float32 (eager and tgc, prompt
8, the decode step called back to back). It fails unless tgc's logits are eager's within 1e-4
and every graph tgc compiled ran in tgc; a mode that fails is a row saying why, and the run
exits non-zero when that mode is tgc. Skipped without PyTorch or transformers (optional extras;
CI has neither).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch", reason="bench/decode_step.py times torch.compile modes and needs PyTorch"
)
transformers = pytest.importorskip(
    "transformers", reason="bench/decode_step.py builds its Llama with transformers"
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import decode_step  # noqa: E402


def test_dry_run_tgc_logits_are_eagers_and_the_report_says_so(tmp_path):
    assert decode_step.main(["--dry-run", "--out", str(tmp_path)]) == 0
    (report,) = tmp_path.glob("decode_step-dry-run-*.md")
    text = report.read_text()
    # 6 warm-up calls, 3 rounds of 3 timed
    assert "prompt 8, the step at positions 8 to 22" in text and "3 rounds of 3 calls" in text
    tgc = next(line for line in text.splitlines() if line.startswith("| tgc |"))
    assert tgc.endswith("| 1 of 1 |")  # the one graph of the step, compiled, ran in tgc
    # no device on the CPU: no device time, no count of the device's kernels and copies
    assert tgc.split(" | ")[2:4] == ["-", "-"]


def test_a_failing_mode_is_a_row_saying_why_and_fails_the_dry_run(monkeypatch, tmp_path, capsys):
    compile_forward = decode_step.gen.compile_forward

    def failing(model, mode, args):
        if mode == "tgc":
            raise MemoryError("out of memory (a stand-in)")
        compile_forward(model, mode, args)

    monkeypatch.setattr(decode_step.gen, "compile_forward", failing)
    assert decode_step.main(["--dry-run", "--out", str(tmp_path)]) == 1
    (report,) = tmp_path.glob("decode_step-dry-run-*.md")
    assert "| tgc | failed: MemoryError: out of memory (a stand-in) |" in report.read_text()


def test_a_step_time_is_the_median_round_with_the_rounds_beside_it_when_apart():
    """Rounds within 2% of each other: the median alone; further apart: the fastest and the
    slowest beside it (a mode timed first in a process once ran 26% slower)."""
    assert decode_step.spread([1.035, 1.04, 1.03]) == ""
    assert decode_step.spread([1.301, 1.035, 1.04]) == " (1.035-1.301)"


def test_every_variant_undoes_an_attribute_tgc_has():
    """A variant sets a module attribute for its mode (bench/decode_step.py): each must exist,
    so that a renamed one fails here, not an hour into a GPU session."""
    import importlib

    for mode, (module, name, value) in decode_step.TGC_VARIANTS.items():
        kept = getattr(importlib.import_module(module), name)
        assert type(kept) is type(value), (mode, kept, value)

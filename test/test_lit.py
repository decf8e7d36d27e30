"""Runs the lit/FileCheck suite from pytest, one test per folder of test/lit/."""

import subprocess
import sys
from pathlib import Path

import pytest

LIT_ROOT = Path(__file__).parent / "lit"
FOLDERS = sorted(p.name for p in LIT_ROOT.iterdir() if p.is_dir() and p.name != "Output")


@pytest.mark.parametrize("folder", FOLDERS)
def test_lit_folder(folder):
    proc = subprocess.run(
        [sys.executable, "-c", "import lit.main; lit.main.main()", "-sv", str(LIT_ROOT / folder)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-20000:] + proc.stderr[-5000:]

"""bench/wgmma_probe.py: its sm_90a kernels assemble (nvcc, no GPU needed); on a Hopper GPU the
probe itself is the measurement (issue 8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import wgmma_probe  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(wgmma_probe.NVCC is None, reason="nvcc is not installed")
def test_the_probe_compiles_for_sm_90a():
    env = dict(os.environ, PATH=f"{Path(wgmma_probe.NVCC).parent}:{os.environ.get('PATH', '')}")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "wgmma_probe.py"), "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bytes of sm_90a code" in proc.stdout


def test_every_layout_is_tried_with_both_descriptor_assignments():
    """2 ways to read B x 2 x 2 stored layouts x 2 x 2 descriptor assignments; each stored
    layout's two steps are the two offsets a descriptor can give."""
    cases = list(wgmma_probe.cases())
    assert len(cases) == 32 and len(set(cases)) == 32
    for _, _, a_steps, a_desc, _, b_steps, b_desc in cases:
        assert sorted(a_desc) == sorted(a_steps) and sorted(b_desc) == sorted(b_steps)

"""The torch.compile backend's options and what it does without PyTorch: these need no PyTorch,
so they run in CI too (the backend itself is tested in test_dynamo_backend.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tgc.diagnostics import TgcError
from tgc.dynamo import OPTION_NAMES, BackendOptions, parse_options, tgc_backend


def test_no_options_are_the_defaults():
    assert parse_options(None) == parse_options({}) == BackendOptions()
    assert BackendOptions().tolerance is None and BackendOptions().db is None


def test_each_option_is_read():
    options = {"tolerance": 1e-3, "db": Path("/tmp/m.db"), "measure_budget": 5}
    got = parse_options({**options, "compare_eager": False})
    want = BackendOptions(tolerance=1e-3, db="/tmp/m.db", measure_budget=5.0, compare_eager=False)
    assert got == want
    assert OPTION_NAMES == (
        "tolerance",
        "db",
        "measure_budget",
        "new_shapes_measure_budget",
        "compare_eager",
        "whole_graphs",
    )
    assert BackendOptions().compare_eager is True
    assert BackendOptions().whole_graphs is True  # docs/torch-compile.md says why


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"tolerance": 1e-3, "budget": 3},
            "unknown torch.compile option 'budget' for backend 'tgc' "
            "(its options: tolerance, db, measure_budget, new_shapes_measure_budget, "
            "compare_eager, whole_graphs)",
        ),
        ([("tolerance", 1)], "torch.compile options for backend 'tgc' must be a dict, got list"),
        (
            {"tolerance": -1e-3},
            "torch.compile option 'tolerance' of backend 'tgc' must be a non-negative number, "
            "got -0.001",
        ),
        ({"tolerance": math.nan}, "option 'tolerance' of backend 'tgc' must be a non-negative"),
        ({"tolerance": True}, "option 'tolerance' of backend 'tgc' must be a non-negative"),
        ({"tolerance": "1e-3"}, "must be a non-negative number, got '1e-3'"),
        ({"measure_budget": math.inf}, "option 'measure_budget' of backend 'tgc' must be a"),
        (
            {"new_shapes_measure_budget": -1},
            "option 'new_shapes_measure_budget' of backend 'tgc' must be a non-negative number",
        ),
        ({"db": 3}, "torch.compile option 'db' of backend 'tgc' must be a path, got int"),
        ({"compare_eager": 1}, "option 'compare_eager' of backend 'tgc' must be True or False"),
        ({"whole_graphs": "yes"}, "option 'whole_graphs' of backend 'tgc' must be True or False"),
    ],
)
def test_a_bad_option_is_one_error_naming_it(options, message):
    with pytest.raises(TgcError) as info:
        parse_options(options)
    assert message in info.value.message


def test_a_mode_is_refused_before_anything_else():
    with pytest.raises(TgcError) as info:
        tgc_backend(None, [], mode="max-autotune")
    assert info.value.message == (
        "backend 'tgc' has no modes (got mode='max-autotune'); it takes options "
        "(tolerance, db, measure_budget, new_shapes_measure_budget, compare_eager, whole_graphs)"
    )


SCRIPT = """
import sys
sys.modules["torch"] = None  # `import torch` raises ImportError from here on

import tgc.dynamo
import tgc.importers.torch as importer
from tgc.diagnostics import TgcError

for name, call in {
    "tgc_backend": lambda: tgc.dynamo.tgc_backend(None, []),
    "core_aten_program": lambda: importer.core_aten_program(None),
}.items():
    try:
        call()
    except TgcError as e:
        print(name, "|", e.message)
    else:
        print(name, "| no error")
"""


def test_without_pytorch_the_backend_says_it_is_needed():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "tgc_backend | the tgc backend of torch.compile needs PyTorch (pip install 'tgc[torch]')",
        "core_aten_program | the torch.export importer needs PyTorch, which is not installed "
        "(pip install 'tgc[torch]')",
    ]

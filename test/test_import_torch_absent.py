"""Without PyTorch (as in CI), tgc.importers.torch imports, and each of its functions says in one
line that PyTorch is needed. PyTorch is hidden from a fresh interpreter, so this runs whether or
not it is installed here."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["torch"] = None  # `import torch` raises ImportError from here on

import tgc.importers
import tgc.importers.torch as importer
from tgc.diagnostics import TgcError

calls = {
    "import_exported_program": lambda: importer.import_exported_program(None),
    "import_module": lambda: importer.import_module(None, ()),
    "import_file": lambda: importer.import_file("model.pt2"),
    "parameter_values": lambda: importer.parameter_values(None),
}
for name, call in calls.items():
    try:
        call()
    except TgcError as e:
        print(name, "|", e)
    else:
        print(name, "| no error")
"""


def test_importer_without_pytorch():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    message = (
        "error: the torch.export importer needs PyTorch, which is not installed "
        "(pip install 'tgc[torch]')"
    )
    assert lines == [
        f"{name} | {message}"
        for name in ("import_exported_program", "import_module", "import_file", "parameter_values")
    ]

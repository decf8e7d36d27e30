"""Without PyTorch (as in CI), tgc.importers.torch imports, and each of its functions says in one
line that PyTorch is needed; so does `tgc-import model.pt2`. PyTorch is hidden from a fresh
interpreter, so this runs whether or not it is installed here. Also tgc-import's .pt2 options,
which need no PyTorch: --input-shape refused, --help."""

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


TOOL_SCRIPT = """
import sys
sys.modules["torch"] = None  # `import torch` raises ImportError from here on

from tgc.tools.import_ import main
sys.exit(main(sys.argv[1:]))
"""


def _tgc_import_without_torch(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", TOOL_SCRIPT, *argv], capture_output=True, text=True, timeout=120
    )


def test_tgc_import_pt2_without_pytorch(tmp_path):
    """tgc-import model.pt2 without PyTorch: one line saying so, exit 1, nothing written."""
    pt2 = tmp_path / "model.pt2"
    pt2.write_bytes(b"PK\x03\x04")
    done = _tgc_import_without_torch(str(pt2), "-o", str(tmp_path / "model.tg"))
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        "error: the torch.export importer needs PyTorch, which is not installed "
        "(pip install 'tgc[torch]')\n"
    )
    assert not (tmp_path / "model.tg").exists()


def test_tgc_import_pt2_refuses_input_shape():
    """--input-shape is ONNX's: with a .pt2 it is a usage error naming the option (exit 2),
    before anything is read."""
    done = _tgc_import_without_torch("missing.pt2", "--input-shape", "x=1x16")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "tgc-import: error: --input-shape is for ONNX models only: a .pt2 program has the "
        "static shapes it was exported with"
    )


def test_tgc_import_help_names_pt2():
    from tgc.tools.import_ import build_arg_parser

    text = build_arg_parser().format_help()
    assert "torch.export.save (a .pt2 file)" in text
    assert "(repeatable; ONNX only)" in text

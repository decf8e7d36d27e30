"""Exit codes and the no-traceback rule of the command-line tools."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def tool(name: str, *args: str, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", f"tgc.tools.{name}", *args], input=stdin,
                          capture_output=True, text=True)


BAD_INPUTS = {
    "syntax": "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  func.return %x tensor<4xf32>\n}\n",
    "empty_type": "func.func @f(%x: tensor<>) {\n  func.return\n}\n",
    "garbage": "\x00\x01\x02 ÿþ }}}} ((((",
    "unterminated": 'func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = hl.gelu %x {approximate = "tanh',
    "verifier": "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
                "  %y = hl.softmax %x {axis = 3} : (tensor<4xf32>) -> tensor<4xf32>\n"
                "  func.return %y : tensor<4xf32>\n}\n",
    "two_modules": "module {\n}\nmodule {\n}\n",
    "missing_return": "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n}\n",
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_diagnostic_and_exit_1(case):
    proc = tool("opt", "-", stdin=BAD_INPUTS[case])
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "error:" in first, proc.stderr
    if case not in ("two_modules",):
        assert first.startswith("<stdin>:"), first  # file:line:col


def test_located_error_shows_line_and_caret():
    proc = tool("opt", "-", stdin=BAD_INPUTS["verifier"])
    lines = proc.stderr.splitlines()
    assert lines[0] == "<stdin>:2:8: error: 'hl.softmax' op axis 3 out of range for rank 1"
    assert lines[1] == "  %y = hl.softmax %x {axis = 3} : (tensor<4xf32>) -> tensor<4xf32>"
    assert lines[2] == "       ^"


def test_unknown_pass_is_a_usage_error():
    proc = tool("opt", str(EXAMPLES / "mlp.tg"), "-p", "no-such-pass")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "does not refer to a registered pass" in proc.stderr


def test_bad_flag_is_a_usage_error():
    assert tool("opt", "--no-such-flag").returncode == 2
    assert tool("run").returncode == 2


def test_missing_file_and_directory():
    proc = tool("opt", "/no/such/file.tg")
    assert proc.returncode == 1 and "no such file" in proc.stderr
    proc = tool("opt", str(EXAMPLES))
    assert proc.returncode == 1 and "directory" in proc.stderr


def test_unwritable_output():
    proc = tool("opt", str(EXAMPLES / "mlp.tg"), "-o", "/no/such/dir/out.tg")
    assert proc.returncode == 1 and "could not write output file" in proc.stderr


def test_debug_shows_the_traceback():
    proc = tool("opt", "-", "--debug", stdin=BAD_INPUTS["verifier"])
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_success_is_exit_0_and_run_works_after_a_pipeline():
    assert tool("opt", str(EXAMPLES / "softmax.tg"), "-p", "verify").returncode == 0
    proc = tool("run", str(EXAMPLES / "softmax.tg"), "-p", "verify", "--random-inputs", "7")
    assert proc.returncode == 0 and proc.stdout.startswith("result 0: shape (256, 1024)")


def test_translate_dot():
    proc = tool("translate", str(EXAMPLES / "mlp.tg"), "--emit=dot")
    assert proc.returncode == 0 and proc.stdout.startswith("digraph tgc {")
    assert '"hl.gelu"' in proc.stdout

"""Exit codes and the no-traceback rule of the command-line tools."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def tool(name: str, *args: str, stdin: str | None = None):
    return subprocess.run(
        [sys.executable, "-m", f"tgc.tools.{name}", *args],
        check=False,
        input=stdin,
        capture_output=True,
        text=True,
    )


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


# -- tgc-run: --check with NaN and inf, usage errors, random inputs -------------------------------


def test_check_rule_accepts_nan_and_inf_where_the_reference_has_them():
    from tgc.tools.run import check_result

    want = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0])
    got = (want + np.array([0, 0, 0, 1e-5, -1e-5])).astype(np.float32)
    line = check_result(0, got, want, "f32")
    assert line.startswith("check: result 0 ok"), line
    assert "1 NaN and 2 inf, as in the reference" in line


@pytest.mark.parametrize(
    "got_value, want_value, expected",
    [
        (np.nan, 1.5, "is nan at index (1, 0) where the float64 reference is 1.5"),
        (1.5, np.nan, "is 1.5 at index (1, 0) where the float64 reference is nan"),
        (np.inf, -np.inf, "is inf at index (1, 0) where the float64 reference is -inf"),
        (np.inf, 3.0e38, "is inf at index (1, 0) where the float64 reference is 3e+38"),
    ],
)
def test_check_rule_names_an_unmatched_special_value(got_value, want_value, expected):
    from tgc.diagnostics import TgcError
    from tgc.tools.run import check_result

    want = np.arange(6.0).reshape(3, 2)
    got = want.astype(np.float32)
    want[1, 0], got[1, 0] = want_value, got_value
    with pytest.raises(TgcError) as info:
        check_result(2, got, want, "f32")
    assert info.value.message.startswith("check failed: result 2 ")
    assert expected in info.value.message


def test_check_rule_tolerance_is_relative_to_the_largest_finite_reference():
    from tgc.diagnostics import TgcError
    from tgc.tools.run import CHECK_TOLERANCE, check_result

    want = np.array([np.inf, 1000.0, 3.0])
    tolerance = CHECK_TOLERANCE["f32"] * 1000.0  # NaN/inf do not count towards the scale
    ok = want + np.array([0.0, 0.0, 0.9 * tolerance])
    assert "ok" in check_result(0, ok.astype(np.float32), want, "f32")
    bad = want + np.array([0.0, 0.0, 1.5 * tolerance])
    with pytest.raises(TgcError) as info:
        check_result(0, bad, want, "f32")
    assert "differs from the float64 reference by 0.3 at index (2,)" in info.value.message
    assert "tolerance 0.2" in info.value.message
    with pytest.raises(TgcError):  # integers compare exactly
        check_result(0, np.array([1, 2], np.int32), np.array([1, 3]), "i32")


def test_check_rule_is_in_the_help():
    proc = tool("run", "--help")
    help_text = " ".join(proc.stdout.split())
    assert "NaN exactly where the float64 reference does" in help_text
    assert "f32 2e-4" in help_text and "N(0, 1/fan_in)" in help_text


@pytest.mark.parametrize("seed", ["-1", "x", "1.5"])
def test_bad_seed_is_a_usage_error(seed):
    proc = tool("run", str(EXAMPLES / "softmax.tg"), "--random-inputs", seed)
    assert proc.returncode == 2
    assert f"SEED must be a non-negative integer, got '{seed}'" in proc.stderr


BAD_RUNS = {
    "out-dir-in-proc": ["-o", "/proc/nope"],
    "out-dir-under-a-file": ["-o", __file__ + "/sub"],
    "missing-input-file": ["--input", "x=/no/such.npy"],
    "unknown-argument": ["--input", "nope=/no/such.npy"],
    "unknown-function": ["--func", "nope"],
    "bad-pipeline": ["-p", "canonicalize{max-iterations=-1}"],
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_run_errors_are_never_internal(case):
    proc = tool("run", str(EXAMPLES / "softmax.tg"), *BAD_RUNS[case])
    assert proc.returncode in (1, 2), proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "error:" in proc.stderr


def test_random_weights_are_scaled_by_fan_in():
    from tgc.parser import parse_file
    from tgc.runtime.interpreter import random_inputs

    func = parse_file(str(EXAMPLES / "gpt2_block.tg")).funcs[0]
    first = dict(zip((a.name_hint for a in func.args), random_inputs(func, 11)))
    again = random_inputs(func, 11)
    assert all(np.array_equal(a, b) for a, b in zip(first.values(), again))  # same seed, same
    assert not np.array_equal(first["x"], random_inputs(func, 12)[0])
    # weights (right-hand operands of hl.linear): std 1/sqrt(fan_in); everything else: std 1.
    for name, fan_in in [("w_qkv", 768), ("w_o", 768), ("w_fc", 768), ("w_proj", 3072)]:
        assert abs(first[name].std() * np.sqrt(fan_in) - 1) < 0.02, name
    for name in ["x", "ln1_g", "b_qkv", "b_proj"]:
        assert abs(first[name].std() - 1) < 0.1, name


def test_main_command_prints_order_one_results():
    # The README's main command: unit-scale inputs and fan-in-scaled weights keep the block's
    # output of order 1 (unscaled weights gave a standard deviation near 2000).
    proc = tool(
        "run", str(EXAMPLES / "gpt2_block.tg"), "-p", "optimize", "--random-inputs", "0", "--check"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    summary = proc.stdout.splitlines()[-1]
    std = float(summary.split(" std=")[1].split()[0])
    assert 0.5 < std < 10, summary


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "canonicalize{max-iterations=-1}"], "needs max-iterations >= 1, got -1"),
        (["-p", "cse", "--print-ir-after=csee"], "'csee' does not refer to a registered pass"),
    ],
)
def test_bad_pass_options_are_usage_errors(args, message):
    proc = tool("opt", str(EXAMPLES / "mlp.tg"), *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("tgc-opt: error: ") and message in proc.stderr


def test_out_of_memory_outside_the_interpreter_is_one_line(capsys):
    from tgc.tools._common import EXIT_INPUT, guarded

    def body() -> int:
        raise MemoryError("Unable to allocate 3.00 GiB for an array")

    assert guarded("tgc-run", body, debug=False) == EXIT_INPUT
    err = capsys.readouterr().err
    assert err == "tgc-run: error: out of memory: Unable to allocate 3.00 GiB for an array\n"
    with pytest.raises(MemoryError):
        guarded("tgc-run", body, debug=True)


TWO_BIG_HALVES = """func.func @f(%a: tensor<2200000000xf16>, %b: tensor<2200000000xf16>) -> tensor<2200000000xf16> {
  %s = atomic.add %a, %b : (tensor<2200000000xf16>, tensor<2200000000xf16>) -> tensor<2200000000xf16>
  func.return %s : tensor<2200000000xf16>
}
"""  # noqa: E501

BIG_INTERMEDIATES = """func.func @f(%a: tensor<1xf16>) -> tensor<2200000000xf16> {
  %b = atomic.broadcast %a : (tensor<1xf16>) -> tensor<2200000000xf16>
  %e = atomic.exp %b : (tensor<2200000000xf16>) -> tensor<2200000000xf16>
  %s = atomic.add %e, %b : (tensor<2200000000xf16>, tensor<2200000000xf16>) -> tensor<2200000000xf16>
  func.return %s : tensor<2200000000xf16>
}
"""  # noqa: E501


def refused(tmp_path, monkeypatch, capsys, program: str, available: int, *extra: str) -> str:
    """tgc-run's stderr for `program` on a machine with `available` bytes free, where drawing
    the inputs (with --check) or running the program fails the test: the refusal comes first."""
    from tgc import evaluate
    from tgc.tools import run as run_tool

    path = tmp_path / "big.tg"
    path.write_text(program)
    monkeypatch.setattr(evaluate, "available_memory", lambda: available)
    if "--check" in extra:
        monkeypatch.setattr(run_tool, "bind_inputs", lambda *a: pytest.fail("inputs were drawn"))
    monkeypatch.setattr(run_tool, "execute", lambda *a: pytest.fail("the program ran"))
    assert run_tool.main([str(path), "--random-inputs", "0", *extra]) == 1
    err = capsys.readouterr().err.splitlines()[0]  # then the source line and a caret
    assert err.startswith(f"{path}:1:1: error: this run needs "), err
    assert err.endswith("this machine has available")
    return err


def test_a_check_that_cannot_fit_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """Issue 27: two 2.2e9-element f16 tensors with --check ran for minutes (the float64
    reference holds every value in float64: 52.8 GB) instead of saying at once that they need
    more memory than there is. Each value fits in the 20 GiB on its own; together they do not."""
    err = refused(tmp_path, monkeypatch, capsys, TWO_BIG_HALVES, 20 * 2**30, "--check")
    assert "the inputs: 8800000000 bytes (8.2 GiB)" in err
    assert "--check's float64 reference: 52800000000 bytes (49.2 GiB)" in err


def test_a_numpy_run_that_cannot_fit_is_refused_before_it_starts(tmp_path, monkeypatch, capsys):
    """The interpreter keeps every value until the function returns: three 4.4 GB values do not
    fit in 10 GiB, though each does."""
    err = refused(tmp_path, monkeypatch, capsys, BIG_INTERMEDIATES, 10 * 2**30)
    assert "the numpy run: 13200000000 bytes (12.3 GiB)" in err


def test_a_run_that_fits_is_not_refused(tmp_path, monkeypatch):
    from tgc import evaluate
    from tgc.tools import run as run_tool

    path = tmp_path / "small.tg"
    path.write_text(TWO_BIG_HALVES.replace("2200000000", "22"))
    monkeypatch.setattr(evaluate, "available_memory", lambda: 2 * 2**10)  # 2 KiB: enough
    assert run_tool.main([str(path), "--random-inputs", "0", "--check"]) == 0


# -- the CUDA route: a pipeline, kernels made by -p, no environment ------------------------------


def test_precision_f64_with_the_cuda_backend_is_a_usage_error():
    proc = tool("run", str(EXAMPLES / "softmax.tg"), "--backend", "cuda", "--precision", "f64")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tgc-run: error: --precision f64 is not supported with --backend cuda")
    # f64 stays a numpy-backend option.
    proc = tool("run", str(EXAMPLES / "softmax.tg"), "--precision", "f64")
    assert proc.returncode == 0 and proc.stdout.startswith("result 0: shape (256, 1024)")


def test_the_gpu_route_without_pycuda_says_why_in_one_line():
    """tgc-run --backend cuda is the planner's GPU route: where the cuda backend cannot load
    (no PyCUDA, no GPU) it says so in one line, exit code 1, before any work."""
    import importlib.util

    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("PyCUDA is installed here: the route runs (tests marked cuda)")
    proc = tool("run", str(EXAMPLES / "mlp.tg"), "--backend", "cuda")
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: planner backend 'cuda' does not load here")


def test_cuda_plans_what_the_users_pipeline_leaves_and_refuses_kernels_it_made():
    """-p says what --emit=cuda plans; a pipeline that makes kernels itself is a located error
    at the first kernel op (before any GPU or PyCUDA is needed), and nothing is written."""
    tool_name = "translate"
    proc = tool(tool_name, str(EXAMPLES / "mlp.tg"), "--emit=cuda", "-p", "optimize")
    assert proc.returncode == 0 and 'extern "C" cudaError_t tgc_run_mlp(' in proc.stdout
    proc = tool(tool_name, str(EXAMPLES / "mlp.tg"), "--emit=cuda", "-p", "optimize,fuse")
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"{EXAMPLES / 'mlp.tg'}:5:8: error: 'kernel.fused' is a kernel already")


def test_no_environment_variable_changes_the_cuda_file():
    """Whether attention runs as its kernel is the plan's choice (-p optimize lowers it first);
    the variable that once switched it is ignored."""
    import os

    example = str(EXAMPLES / "attention.tg")
    plain = tool("translate", example, "--emit=cuda")
    env = dict(os.environ, TGC_ATTENTION_KERNEL="0")
    with_env = subprocess.run(
        [sys.executable, "-m", "tgc.tools.translate", example, "--emit=cuda"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert plain.returncode == with_env.returncode == 0
    assert with_env.stdout == plain.stdout and "fused attention" in plain.stdout
    off = tool("translate", example, "--emit=cuda", "-p", "optimize")
    assert off.returncode == 0 and "fused attention" not in off.stdout

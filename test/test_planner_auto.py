"""`tgc-run --backend auto` (issue 12, item 6): select-kernels with the backends that load, then
the planned function on the kernels it chose (planner/executor.py), checked against float64.

Every example passes `--check` with the numpy backend alone and, where PyTorch imports, with
numpy and torch-cpu (the backends a run loads are chosen with TGC_PLANNER_BACKENDS). The CUDA
side of the same command is in test_planner_cuda.py (marked cuda, run on a GPU).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import tgc
import tgc.planner
from tgc.diagnostics import TgcError
from tgc.tools import run as run_tool

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.tg"))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
BACKEND_SETS = ["numpy"] + (["numpy,torch"] if HAVE_TORCH else [])


@pytest.fixture
def planner_backends(monkeypatch):
    """Set TGC_PLANNER_BACKENDS for one test; the optional backends it loaded are removed
    afterwards (other tests plan with numpy alone)."""

    def use(names: str) -> None:
        monkeypatch.setenv("TGC_PLANNER_BACKENDS", names)

    yield use
    tgc.planner.unload_backends()


def tgc_run(capsys, *argv: str) -> tuple[int, str, str]:
    code = run_tool.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("backends", BACKEND_SETS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_auto_check_passes_for_every_example(example, backends, planner_backends, capsys):
    planner_backends(backends)
    for seed in ("0", "1"):
        code, out, err = tgc_run(
            capsys, str(example), "--backend", "auto", "--check", "--random-inputs", seed
        )
        assert code == 0, err
        assert "check: result 0 ok" in out and "error" not in err


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_with_torch_loaded_the_gpt2_block_plan_uses_torch(planner_backends):
    """So the torch runs above do run torch kernels: the roofline gives torch's BLAS the
    linears of a GPT-2 block (4x numpy's flop rate in the table)."""
    planner_backends("numpy,torch")
    module = tgc.parse((EXAMPLES[0].parent / "gpt2_block.tg").read_text())
    tgc.run_pipeline(module, "select-kernels")
    callees = {op.attr("callee") for op in module.funcs[0].body.ops if op.name == "kernel.call"}
    # torch-cuda's on a GPU: same name but the backend
    assert callees & {"torch-cpu.hl.linear", "torch-cuda.hl.linear"}, callees
    assert any(c.startswith("numpy.") for c in callees)


def test_auto_runs_a_given_pipeline_that_ends_in_planned_ir(planner_backends, capsys):
    planner_backends("numpy")
    example = str(EXAMPLES[0].parent / "gelu_scale.tg")
    code, out, err = tgc_run(
        capsys, example, "--backend", "auto", "-p", "lower-hl,select-kernels", "--check"
    )
    assert code == 0, err
    assert "check: result 0 ok" in out


def test_a_pipeline_that_does_not_plan_is_a_located_error(planner_backends, capsys):
    planner_backends("numpy")
    example = str(EXAMPLES[0].parent / "gelu_scale.tg")
    code, _, err = tgc_run(capsys, example, "--backend", "auto", "-p", "lower-hl")
    assert code == 1
    assert "gelu_scale.tg:" in err
    assert "error: 'atomic." in err and "is not planned: --backend auto runs planned IR" in err
    assert "Traceback" not in err


def test_auto_refuses_the_f64_precision(capsys):
    with pytest.raises(SystemExit) as e:
        run_tool.main([str(EXAMPLES[0]), "--backend", "auto", "--precision", "f64"])
    assert e.value.code == 2
    assert "--precision f64 is not supported with --backend auto" in capsys.readouterr().err


def test_an_unknown_backend_name_is_one_diagnostic(planner_backends, capsys):
    planner_backends("numpy,tpu")
    code, _, err = tgc_run(capsys, str(EXAMPLES[0]), "--backend", "auto")
    assert code == 1
    assert err.strip().endswith(
        "error: TGC_PLANNER_BACKENDS names unknown backend 'tpu' (known: numpy, cuda, torch)"
    )


def test_load_backends_says_why_a_backend_was_not_loaded(planner_backends):
    planner_backends("numpy")
    loaded = tgc.planner.load_backends()
    assert loaded == ["tgc.planner.backends.numpy"]
    for name in tgc.planner.OPTIONAL_BACKENDS:
        assert tgc.planner.UNAVAILABLE[name] == "not requested (TGC_PLANNER_BACKENDS=numpy)"
    planner_backends("numpy,cuda")
    tgc.planner.load_backends()
    reason = tgc.planner.UNAVAILABLE.get("tgc.planner.backends.cuda")
    assert reason is None or "not requested" not in reason


def test_an_out_of_range_index_is_located_at_the_kernel_call(planner_backends):
    """A kernel's own error (the gather's bounds check) points at the op it runs."""
    from tgc.planner.executor import run_plan

    planner_backends("numpy")
    text = (
        "func.func @g(%t: tensor<5x2xf32>, %i: tensor<3xi32>) -> tensor<3x2xf32> {\n"
        "  %y = atomic.gather %t, %i : (tensor<5x2xf32>, tensor<3xi32>) -> tensor<3x2xf32>\n"
        "  func.return %y : tensor<3x2xf32>\n}\n"
    )
    module = tgc.parse(text, "g.tg")
    tgc.run_pipeline(module, "select-kernels")
    inputs = [np.zeros((5, 2), np.float32), np.array([0, 4, 5], np.int32)]
    with pytest.raises(TgcError, match="index 5 .* is out of range") as e:
        run_plan(module.funcs[0], inputs)
    assert (e.value.loc.file, e.value.loc.line, e.value.loc.col) == ("g.tg", 2, 8)

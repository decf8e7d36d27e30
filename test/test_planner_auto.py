"""`tgc-run --backend auto` (issue 12, item 6): select-kernels with the backends that load, then
the planned function on the kernels it chose (planner/executor.py), checked against float64.

Every example passes `--check` with the numpy backend alone and, where PyTorch imports, with
numpy and torch-cpu (the backends a run plans with are chosen with `--planner-backends`, which
sets `select-kernels{backends=...}`). The CUDA side of the same command is in
test_planner_cuda.py (marked cuda, run on a GPU).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import tgc
import tgc.planner
from tgc.diagnostics import TgcError
from tgc.planner.backends import BACKENDS
from tgc.planner.executor import run_plan
from tgc.runtime.interpreter import random_inputs
from tgc.tools import run as run_tool

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.tg"))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
BACKEND_SETS = ["numpy"] + (["numpy,torch"] if HAVE_TORCH else [])


def tgc_run(capsys, *argv: str) -> tuple[int, str, str]:
    code = run_tool.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("backends", BACKEND_SETS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_auto_check_passes_for_every_example(example, backends, capsys):
    for seed in ("0", "1"):
        code, out, err = tgc_run(
            capsys,
            str(example),
            "--backend",
            "auto",
            "--planner-backends",
            backends,
            "--check",
            "--random-inputs",
            seed,
        )
        assert code == 0, err
        assert "check: result 0 ok" in out and "error" not in err


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_with_torch_loaded_the_gpt2_block_plan_uses_torch():
    """So the torch runs above do run torch kernels: the roofline gives torch's BLAS the
    linears of a GPT-2 block (4x numpy's flop rate in the table)."""
    module = tgc.parse((EXAMPLES[0].parent / "gpt2_block.tg").read_text())
    tgc.run_pipeline(module, "select-kernels{backends=numpy,torch}")
    callees = {op.attr("callee") for op in module.funcs[0].body.ops if op.name == "kernel.call"}
    # torch-cuda's on a GPU: same name but the backend
    assert callees & {"torch-cpu.hl.linear", "torch-cuda.hl.linear"}, callees
    assert any(c.startswith("numpy.") for c in callees)


def test_auto_runs_a_given_pipeline_that_ends_in_planned_ir(capsys):
    example = str(EXAMPLES[0].parent / "gelu_scale.tg")
    code, out, err = tgc_run(
        capsys,
        example,
        "--backend",
        "auto",
        "--planner-backends",
        "numpy",
        "-p",
        "lower-hl,select-kernels",
        "--check",
    )
    assert code == 0, err
    assert "check: result 0 ok" in out


def test_a_pipeline_that_does_not_plan_is_a_located_error(capsys):
    example = str(EXAMPLES[0].parent / "gelu_scale.tg")
    code, _, err = tgc_run(
        capsys, example, "--backend", "auto", "--planner-backends", "numpy", "-p", "lower-hl"
    )
    assert code == 1
    assert "gelu_scale.tg:" in err
    assert "error: 'atomic." in err and "is not planned: --backend auto runs planned IR" in err
    assert "Traceback" not in err


def test_auto_refuses_the_f64_precision(capsys):
    with pytest.raises(SystemExit) as e:
        run_tool.main([str(EXAMPLES[0]), "--backend", "auto", "--precision", "f64"])
    assert e.value.code == 2
    assert "--precision f64 is not supported with --backend auto" in capsys.readouterr().err


@pytest.mark.parametrize("names", ["numpy,tpu", "tpu", ",", "numpy,,Torch"])
def test_an_unknown_backend_name_is_one_usage_diagnostic(names, capsys):
    with pytest.raises(SystemExit) as e:
        run_tool.main([str(EXAMPLES[0]), "--backend", "auto", "--planner-backends", names])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "tgc-run: error: argument --planner-backends: " in err and "Traceback" not in err
    if names == ",":
        assert "expected a comma-separated list of planner backends (numpy, cuda, torch)" in err
    else:
        bad = "tpu" if "tpu" in names else "Torch"
        assert f"unknown planner backend '{bad}' (known: numpy, cuda, torch)" in err


def test_planner_backends_needs_the_auto_backend(capsys):
    with pytest.raises(SystemExit) as e:
        run_tool.main([str(EXAMPLES[0]), "--planner-backends", "numpy"])
    assert e.value.code == 2
    assert "--planner-backends needs --backend auto" in capsys.readouterr().err


def test_planner_backends_sets_the_option_of_every_select_kernels_pass():
    """The flag wins over a -p's own `backends`: the run plans with what the flag says."""
    from tgc.pass_manager import parse_pipeline
    from tgc.planner.select import SelectKernels, with_backends

    passes = parse_pipeline("lower-hl,select-kernels{backends=torch tolerance=0},cse")
    changed = with_backends(passes, ("numpy",))
    (select,) = [p for p in changed if isinstance(p, SelectKernels)]
    assert select.backends == ("numpy",) and select.tolerance == 0
    assert [p.name for p in changed] == [p.name for p in passes]


def test_load_backends_loads_the_families_named_and_checks_the_names():
    tgc.planner.unload_backends()
    loaded = tgc.planner.load_backends(["numpy"])
    assert loaded == ["tgc.planner.backends.numpy"]
    assert not {"torch-cpu", "torch-cuda", "cuda"} & set(BACKENDS)
    loaded = tgc.planner.load_backends(["numpy", "cuda"])
    # cuda loads on a GPU with PyCUDA; elsewhere the reason is kept
    assert (
        "tgc.planner.backends.cuda" in loaded
        or tgc.planner.UNAVAILABLE["tgc.planner.backends.cuda"]
    )
    assert "tgc.planner.backends.torch" not in loaded
    with pytest.raises(
        TgcError, match=r"unknown planner backend 'tpu' \(known: numpy, cuda, torch\)"
    ):
        tgc.planner.load_backends(["numpy", "tpu"])


def test_a_required_backend_that_does_not_import_is_an_error_saying_why(monkeypatch):
    """`required` (the tools' --planner-backends, the pass option): a family named that does
    not load is a TgcError with the import's reason; without it, the reason is kept."""
    tgc.planner.unload_backends(["torch"])
    monkeypatch.setitem(sys.modules, "tgc.planner.backends.torch", None)
    with pytest.raises(TgcError, match="planner backend 'torch' does not load here: .*import"):
        tgc.planner.load_backends(["numpy", "torch"], required=True)
    loaded = tgc.planner.load_backends(["numpy", "torch"])
    assert loaded == ["tgc.planner.backends.numpy"]
    assert "tgc.planner.backends.torch" in tgc.planner.UNAVAILABLE
    assert "torch-cpu" not in BACKENDS


def test_run_plan_loads_only_the_backends_the_plan_calls():
    """A numpy plan runs without loading torch (or cuda); where PyTorch imports, a plan that
    calls torch kernels loads torch itself when it runs."""
    module = tgc.parse((EXAMPLES[0].parent / "gelu_scale.tg").read_text())
    tgc.run_pipeline(module, "select-kernels{backends=numpy}")
    tgc.planner.unload_backends()
    func = module.funcs[0]
    run_plan(func, random_inputs(func, 0))
    assert not {"torch-cpu", "torch-cuda", "cuda"} & set(BACKENDS)
    if HAVE_TORCH:
        module = tgc.parse((EXAMPLES[0].parent / "gpt2_block.tg").read_text())
        tgc.run_pipeline(module, "select-kernels{backends=numpy,torch}")
        func = module.funcs[0]
        assert any(
            op.attributes.get("plan.backend", "").startswith("torch") for op in func.body.ops
        )
        tgc.planner.unload_backends()
        got = run_plan(func, random_inputs(func, 0))
        assert "torch-cpu" in BACKENDS and got[0].shape == func.function_type.results[0].shape


def test_an_out_of_range_index_is_located_at_the_kernel_call():
    """A kernel's own error (the gather's bounds check) points at the op it runs."""
    text = (
        "func.func @g(%t: tensor<5x2xf32>, %i: tensor<3xi32>) -> tensor<3x2xf32> {\n"
        "  %y = atomic.gather %t, %i : (tensor<5x2xf32>, tensor<3xi32>) -> tensor<3x2xf32>\n"
        "  func.return %y : tensor<3x2xf32>\n}\n"
    )
    module = tgc.parse(text, "g.tg")
    tgc.run_pipeline(module, "select-kernels{backends=numpy}")
    inputs = [np.zeros((5, 2), np.float32), np.array([0, 4, 5], np.int32)]
    with pytest.raises(TgcError, match="index 5 .* is out of range") as e:
        run_plan(module.funcs[0], inputs)
    assert (e.value.loc.file, e.value.loc.line, e.value.loc.col) == ("g.tg", 2, 8)

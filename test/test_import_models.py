"""Real models end to end (issue 9, item 4): the tiny GPT-2 and BERT exports in test/models/
(made by bench/make_tiny_models.py, which holds the recipe) imported, optimised with `optimize`
and run on the numpy interpreter.

References and tolerances (rtol 1e-3, atol 1e-4 absolute; the outputs are of order 1, at most
about 5, and PyTorch's float32 run is within 3e-6 of its float64 run):
- the stored inputs against PyTorch's outputs of the same model run in float64
  (reference_f64_<i>.pb), and against its float32 outputs (output_<i>.pb, the ONNX layout);
- fresh random inputs (ids, right padding of random length, token types) against onnx's
  ReferenceEvaluator on the same model (no PyTorch needed, so this runs in CI);
- where PyTorch and transformers are installed, fresh inputs against the generator's model run
  by PyTorch in float64 (the committed file must still be the model the script makes);
- the command line: tgc-import, tgc-opt -p optimize, tgc-run --input NAME=FILE.npy -o DIR.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install tgc[onnx])")

from onnx import numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tgc  # noqa: E402
from tgc.pass_manager import PassManager  # noqa: E402
from tgc.printer import print_module  # noqa: E402
from tgc.runtime.interpreter import run_function  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "test" / "models"
RTOL, ATOL = 1e-3, 1e-4

# Every folder the generator makes; listed, not globbed, so that a lost folder fails.
NAMES = ("tiny_gpt2", "tiny_bert", "tiny_gpt2_dynamo", "tiny_bert_dynamo")


def load_tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    """<prefix>_0.pb, <prefix>_1.pb, ... in index order."""
    paths = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in paths]


def stored_case(name: str) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(inputs, PyTorch float32 outputs, PyTorch float64 outputs) of test_data_set_0."""
    folder = MODELS / name / "test_data_set_0"
    return (
        load_tensors(folder, "input"),
        load_tensors(folder, "output"),
        load_tensors(folder, "reference_f64"),
    )


def import_and_optimize(name: str, passes: str = "optimize"):
    from tgc.importers.onnx import import_onnx

    tgc.load_all()
    module = import_onnx(MODELS / name / "model.onnx")
    if passes:
        PassManager.from_text(passes).run(module)
    return module


def run(module, inputs: list[np.ndarray]) -> list[np.ndarray]:
    (func,) = module.funcs
    assert len(func.body.args) == len(inputs), "one function argument per graph input"
    return run_function(func, inputs)


def assert_close(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} results, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what}: result {i} has shape {g.shape}, expected {w.shape}"
        assert g.dtype == np.float32, f"{what}: result {i} is {g.dtype}, the model's is float32"
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{what}: result {i}")


def fresh_inputs(name: str, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs shaped and typed as the stored ones: ids over the whole vocabulary, a right-padded
    mask keeping at least one token per row, token types 0 or 1."""
    stored, _, _ = stored_case(name)
    batch, seq = stored[0].shape
    vocab = vocab_size(name)
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    lengths = rng.integers(1, seq + 1, size=batch)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    extra = [rng.integers(0, 2, size=(batch, seq), dtype=np.int64)] if len(stored) == 3 else []
    return [ids, mask, *extra]


def vocab_size(name: str) -> int:
    """Rows of the token embedding: the first input of the graph's first Gather."""
    model = onnx.load(str(MODELS / name / "model.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits]
    return int(inits[gathers[0].input[0]].dims[0])


# -- the stored data ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_stored_outputs_agree(name):
    """The folder is complete and PyTorch's float32 outputs are within the tolerance of its
    float64 ones (what the models are compared with below is itself that close)."""
    inputs, f32, f64 = stored_case(name)
    assert (MODELS / name / "model.onnx").is_file()
    assert inputs and all(x.dtype == np.int64 for x in inputs)
    assert f32 and len(f32) == len(f64)
    for a, b in zip(f32, f64):
        assert a.dtype == np.float32 and b.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
        assert np.abs(b).max() > 0.5, "outputs of order 1, so that atol does not swallow them"


# -- import, optimize, run ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_optimized_model_matches_pytorch(name):
    inputs, f32, f64 = stored_case(name)
    module = import_and_optimize(name)
    text = print_module(module)
    assert not re.search(r"= hl\.", text), "optimize lowers every hl op"
    got = run(module, inputs)
    assert_close(got, f64, f"{name} optimised vs PyTorch float64")
    assert_close(got, f32, f"{name} optimised vs PyTorch float32")


@pytest.mark.parametrize("name", NAMES)
def test_imported_model_matches_pytorch(name):
    """The import alone, before any pass: a mismatch here is the importer's, not a pass's."""
    inputs, _, f64 = stored_case(name)
    got = run(import_and_optimize(name, passes=""), inputs)
    assert_close(got, f64, f"{name} as imported vs PyTorch float64")


@pytest.mark.parametrize("name", NAMES)
def test_fresh_inputs_match_onnx_reference(name):
    """New ids, padding lengths and token types each run, against onnx's own evaluator: the
    import holds for the model's inputs, not only the stored ones (which it must not bake in)."""
    rng = np.random.default_rng()
    module = import_and_optimize(name)
    proto = onnx.load(str(MODELS / name / "model.onnx"))
    reference = ReferenceEvaluator(proto)
    names = [i.name for i in proto.graph.input]
    for _ in range(2):
        inputs = fresh_inputs(name, rng)
        want = reference.run(None, dict(zip(names, inputs)))
        assert_close(run(module, inputs), want, f"{name} on fresh inputs vs onnx reference")


@pytest.mark.parametrize("name", NAMES)
def test_fresh_inputs_match_pytorch_float64(name):
    """Where PyTorch and transformers are installed: the generator's model (same seed, so the
    committed weights) in float64 on fresh inputs."""
    pytest.importorskip("torch", reason="PyTorch is not installed (CI has none)")
    pytest.importorskip("transformers", reason="transformers is not installed")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import make_tiny_models as gen
    finally:
        sys.path.remove(str(ROOT / "bench"))
    import torch

    spec = next(s for s in gen.SPECS if s.name == name)
    model, _ = gen.build(spec.arch)
    inputs = fresh_inputs(name, np.random.default_rng())
    want = gen.run_torch(model, inputs, torch.float64)
    assert_close(run(import_and_optimize(name), inputs), want, f"{name} vs PyTorch float64")


# -- the command line ---------------------------------------------------------------------------


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"tgc.tools.{name}", *args],
        check=False,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("name", NAMES)
def test_command_line_import_optimize_run(name, tmp_path):
    """tgc-import (weights in .npy files beside the .tg), tgc-opt -p optimize into the same
    folder, tgc-run with the stored inputs bound by argument name."""
    inputs, _, f64 = stored_case(name)
    imported, optimized, results = tmp_path / "model.tg", tmp_path / "opt.tg", tmp_path / "out"
    proc = tool("import_", str(MODELS / name / "model.onnx"), "-o", str(imported))
    assert proc.returncode == 0, proc.stderr
    proc = tool("opt", str(imported), "-p", "optimize", "-o", str(optimized))
    assert proc.returncode == 0, proc.stderr
    graph_inputs = [i.name for i in onnx.load(str(MODELS / name / "model.onnx")).graph.input]
    binds = []
    for i, (input_name, x) in enumerate(zip(graph_inputs, inputs)):
        np.save(tmp_path / f"in{i}.npy", x)
        binds += ["--input", f"{input_name}={tmp_path / f'in{i}.npy'}"]
    proc = tool("run", str(optimized), *binds, "-o", str(results))
    assert proc.returncode == 0, proc.stderr
    got = [np.load(results / f"result_{i}.npy") for i in range(len(f64))]
    assert not (results / f"result_{len(f64)}.npy").exists(), "one result per graph output"
    assert_close(got, f64, f"{name} through the tools vs PyTorch float64")


# -- the GPU benchmark's CPU part ---------------------------------------------------------------


def test_gpu_benchmark_dry_run(capsys):
    """bench/models_gpu.py --dry-run (no GPU, PyTorch or PyCUDA): every model imports, matches
    PyTorch on numpy and gets the GPU route's plan with nothing measured (the standalone file's,
    planner/standalone.py), so the GPU session only times."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import models_gpu
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert models_gpu.NAMES == NAMES
    assert models_gpu.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        row = next(line for line in out.splitlines() if line.startswith(f"| {name} |"))
        # the plan's kernels with their counts, every cost from the roofline (nothing measured)
        kernels = r"[\w.-]+(?: x\d+)?"
        assert re.search(rf"\| (?:{kernels}, )*{kernels} \(costs: roofline \d+\) \|", row), row
        assert "cuda." in row, row

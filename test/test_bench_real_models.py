"""bench/real_models.py's vision and diffusion models (issue 25, item 5), checked on the CPU.

The GPU rows (ResNet-50, ViT-base, a diffusers UNet2DConditionModel and AutoencoderKL's decode,
beside eager and torch.compile) need the GPU; what can fail before them is checked here with the
benchmark's own builders at their tiny configs: each model is built with random weights, exported
with torch.export, imported with tgc's torch importer, and run on tgc's numpy interpreter in
float64 on fresh inputs (not the export's), against PyTorch's float64 output: max |tgc - PyTorch|
at most the dry run's tolerance x max |PyTorch| (1e-10; the UNet 1e-6, its timestep embedding
being float32 in diffusers). Each model needs PyTorch and transformers (the UNet and VAE
diffusers), optional extras CI does not install: without them the checks skip with that reason.
The argument checks need none of them.

Also on the CPU: the breakdown of a planned function by its kernels' planned costs (what each
GPU row writes as plan-<model>-<dtype>-b<batch>.txt), on examples/mlp.tg planned for the numpy
backend; the accuracy rule (`error_limit`: a bf16 result against the float32 reference may be
as far off as the dtype's tolerance or twice eager bf16's own error) as a pure function, and on a
tiny BERT in bf16 through the dry run; and, with a stand-in for a GPU row, that `--keep-db`
copies the measurement database after each row and the report shows the errors against the
reference and the plan.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import real_models  # noqa: E402  (bench/ is on the path only now; it imports torch lazily)


def _absent(*modules: str) -> str | None:
    missing = [m for m in modules if find_spec(m) is None]
    return ", ".join(missing) or None


def _needs(*modules: str):
    missing = _absent(*modules)
    return pytest.mark.skipif(
        missing is not None,
        reason=f"{missing} not installed: PyTorch, transformers and diffusers are optional "
        "extras (CI has none); bench/real_models.py's models are checked where they are",
    )


CASES = [
    pytest.param("vit", 2, {}, marks=_needs("torch", "transformers"), id="vit"),
    pytest.param("resnet50", 2, {"resnet": "hf"}, marks=_needs("torch", "transformers"), id="hf"),
    pytest.param(
        "resnet50", 1, {"resnet": "torchvision"}, marks=_needs("torch", "torchvision"), id="tv"
    ),
    pytest.param("unet", 2, {}, marks=_needs("torch", "diffusers"), id="unet"),
    pytest.param("vae", 2, {}, marks=_needs("torch", "diffusers"), id="vae"),
]


@pytest.mark.parametrize("name, batch, kw", CASES)
def test_tiny_model_float64_matches_pytorch(name: str, batch: int, kw: dict) -> None:
    import tgc

    tgc.load_all()
    case = real_models.dry_case(name, "f64", batch, tiny=True, **kw)
    assert case.want.dtype == np.float64
    (got,) = tgc.run(case.imported, case.arguments)
    assert got.shape == case.want.shape and got.dtype == np.float64
    error = real_models.rel_error(got, case.want)
    tolerance = real_models.dry_tolerance(name, "f64")
    assert error <= tolerance, f"{name}: max error {error:.2e} x max |PyTorch| > {tolerance:g}"
    # the fresh inputs are not the export's: the check is not a replay of the traced values
    first = case.built.inputs(1)[0].numpy()
    assert not np.array_equal(first, case.arguments[-len(case.built.inputs(2))])


def test_batches_and_dtypes_by_model() -> None:
    assert real_models.batches("vit", None, dry=False) == [1, 8]
    assert real_models.batches("unet", None, dry=False) == [2, 8]
    assert real_models.batches("resnet50", None, dry=True) == [1, 2]
    assert real_models.batches("gpt2", None, dry=False) == [4]
    assert real_models.batches("vae", "1,4", dry=False) == [1, 4]
    assert real_models.dry_dtype("vit", None) == "f64"
    assert real_models.dry_dtype("gpt2", None) == "f32"
    assert real_models.dry_tolerance("unet", "f64") == 1e-6
    assert set(real_models.VISION) == {"resnet50", "vit", "unet", "vae"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "resnet", "--dry-run"], "unknown model(s) ['resnet']"),
        (["--vision", "--batch", "1,x", "--dry-run"], "--batch takes comma-separated integers"),
        (["--vision", "--resnet", "keras"], "invalid choice: 'keras'"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        real_models.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@_needs("torch")
def test_a_row_cut_off_by_its_timeout_keeps_what_it_had(tmp_path, monkeypatch) -> None:
    """gpu_session.sh runs each row under `timeout`: its SIGTERM ends the run, but the row is
    saved with the steps it finished and the one it was in (no GPU: the row is a stand-in)."""
    import json
    import os
    import signal

    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    # the run turns cuDNN's TF32 off for its f32 rows: put it back after
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)

    def gpu_one(row, args, db, save):
        row.shape, row.running = "8 x 3 x 224 x 224", "PyTorch eager"
        row.modes["eager"] = {"first_s": 0.1, "ms": 2.0, "error": 0.0, "note": ""}
        row.running = "tgc compile_module (first use) and first call"
        save()
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the row")

    monkeypatch.setattr(real_models, "gpu_one", gpu_one)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = real_models.main(["--only", "vit", "--dtypes", "bf16", "--out", str(tmp_path)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 124
    assert torch.backends.cudnn.allow_tf32 is False
    (store,) = tmp_path.glob("real-models-*.json")
    (row,) = json.loads(store.read_text()).values()
    assert row["modes"]["eager"]["ms"] == 2.0
    assert row["running"] == "tgc compile_module (first use) and first call"
    assert "cut off by SIGTERM (its timeout) during tgc compile_module" in row["note"]
    report = store.with_suffix(".md").read_text()
    assert "| vit | bf16 | 8 x 3 x 224 x 224 |" in report


# -- the plan breakdown ---------------------------------------------------------------------------


def _planned(text: str):
    import tgc
    from tgc.pass_manager import PassManager
    from tgc.planner.select import select_kernels

    tgc.load_all()
    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    select_kernels(module.funcs[0], tolerance=1e-5, backends=("numpy",))
    return module.funcs[0]


def test_plan_breakdown_sums_planned_costs_per_callee() -> None:
    func = _planned((ROOT / "examples" / "mlp.tg").read_text())
    calls = [op for op in func.walk() if op.name == "kernel.call"]
    # one matmul's cost said measured, as a database's would be: the breakdown tells them apart
    head = next(op for op in calls if op.attributes["callee"] == "numpy.atomic.matmul")
    head.attributes["plan.source"] = "measured"
    b = real_models.plan_breakdown(func, top=2)
    assert b["calls"] == len(calls) == 5
    assert b["seconds"] == pytest.approx(sum(op.attributes["plan.seconds"] for op in calls))
    assert b["sources"] == {"measured": 1, "roofline": 4}
    # the two dearest callees, dearest first: both matmuls under one name, then the gelu region
    matmul, second = b["callees"]
    assert matmul == {
        "callee": "numpy.atomic.matmul",
        "calls": 2,
        "seconds": pytest.approx(
            sum(
                op.attributes["plan.seconds"]
                for op in calls
                if op.attributes["callee"] == matmul["callee"]
            )
        ),
        "measured": 1,
        "guessed": 1,
    }
    assert second["seconds"] <= matmul["seconds"] and second["callee"] != matmul["callee"]
    (first, other) = b["largest"]
    assert first["seconds"] >= other["seconds"]
    assert first["what"].startswith("atomic.matmul (tensor<")
    gelu = next(c for c in real_models.plan_calls(func) if "region" in c["what"])
    assert gelu["callee"] == "numpy.gelu_tanh" and "atomic.exp" in gelu["what"]
    text = real_models.plan_text(b, "mlp")
    assert "5 kernel calls and copies" in text and "1 measured, 4 roofline" in text
    assert "numpy.atomic.matmul: 2 call(s)" in text and "1 measured / 1 guessed" in text
    summary = real_models.plan_summary(b, "planned")
    assert summary["chosen"] == "planned" and summary["calls"] == 5
    assert summary["planned_ms"] == pytest.approx(b["seconds"] * 1e3, abs=1e-4)
    assert summary["callees"][0].startswith("numpy.atomic.matmul: 2 call(s)")
    assert len(summary["largest"]) == 2


def test_plan_breakdown_counts_once_steps_apart() -> None:
    """A step that reads only parameters and constants (packing weights, copying a constant to
    the device) runs when the parameters change, not per call: it is not in the planned sum."""
    func = _planned(
        """func.func @f(%x: tensor<4x8xf32>, %w: tensor<8x8xf32> {tgc.param}) -> tensor<4x8xf32> {
  %t = atomic.exp %w : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %y = atomic.matmul %x, %t : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}"""
    )
    calls = real_models.plan_calls(func)
    once = [c for c in calls if c["once"]]
    assert once and all("matmul" not in c["what"] for c in once), calls
    b = real_models.plan_breakdown(func)
    assert b["once_calls"] == len(once) and b["calls"] == len(calls) - len(once)
    assert b["once_seconds"] == pytest.approx(sum(c["seconds"] for c in once))
    assert b["seconds"] == pytest.approx(sum(c["seconds"] for c in calls if not c["once"]))
    assert f"and {len(once)} once steps" in real_models.plan_text(b, "f")


def test_plan_breakdown_names_copies_by_their_spaces() -> None:
    func = _planned(
        """func.func @f(%x: tensor<4xf32, "cuda">) -> tensor<4xf32, "cuda"> {
  %e = atomic.exp %x : (tensor<4xf32, "cuda">) -> tensor<4xf32, "cuda">
  func.return %e : tensor<4xf32, "cuda">
}"""
    )
    callees = [c["callee"] for c in real_models.plan_calls(func)]
    assert callees == ["kernel.copy cuda->host", "numpy.atomic.exp", "kernel.copy host->cuda"]
    b = real_models.plan_breakdown(func)
    assert b["calls"] == 3 and sum(e["calls"] for e in b["callees"]) == 3


# -- the accuracy check ---------------------------------------------------------------------------


def test_error_limit_is_the_tolerance_or_twice_eagers_own_error() -> None:
    limit = real_models.error_limit
    bf16, f32 = real_models.TOLERANCE["bf16"], real_models.TOLERANCE["f32"]
    assert limit(bf16, 0.004) == bf16  # eager close to float32: the dtype's tolerance holds
    assert limit(bf16, 0.015) == pytest.approx(0.03)  # eager's rounding alone is 1.5e-2
    assert 0.026 <= limit(bf16, 0.015) and not 0.031 <= limit(bf16, 0.015)
    assert limit(f32, 0.0) == f32  # an f32 row: eager is the reference, the tolerance as before
    assert limit(bf16, None) == bf16  # no eager error (eager itself is the reference)
    # eager overflowed: that says nothing of what bf16 can do, so no licence for tgc to
    for broken in (float("inf"), float("nan")):
        assert limit(bf16, broken) == bf16
    assert not float("nan") <= limit(bf16, 0.015)  # a NaN result never passes


@_needs("torch", "transformers")
def test_tiny_bert_bf16_against_the_float32_reference(tmp_path) -> None:
    """The dry run's bf16 check: the float32 reference on the CPU (the bf16 weights upcast), eager
    bf16's own error against it, and tgc's numpy interpreter and numpy plan within the limit."""
    import tgc

    tgc.load_all()
    case = real_models.dry_case("bert", "bf16", 2, tiny=True)
    assert case.want.dtype == np.float64
    # bf16 rounding is visible in eager, and the reference is not eager over again
    assert 1e-4 < case.eager_error < real_models.TOLERANCE["bf16"]
    (got,) = tgc.run(case.imported, case.arguments)
    error = real_models.rel_error(got, case.want)
    assert error <= real_models.error_limit(real_models.TOLERANCE["bf16"], case.eager_error)
    code = real_models.main(
        ["--dry-run", "--tiny", "--only", "bert", "--dry-dtype", "bf16", "--out", str(tmp_path)]
    )
    assert code == 0
    (report,) = tmp_path.glob("real-models-dry-run-*.md")
    assert "| bert | bf16 | 2 x 16 |" in report.read_text()
    assert "PyTorch f32 (its bf16" in report.read_text()
    plan = (tmp_path / "plan-bert-bf16-b2.txt").read_text()
    assert "## by callee, the 12 dearest" in plan and "roofline" in plan


# -- a GPU row's files, with a stand-in for the row -----------------------------------------------


@_needs("torch")
def test_keep_db_copies_the_database_after_each_row_and_the_report_shows_errors(
    tmp_path, monkeypatch
) -> None:
    import json
    import sqlite3
    from dataclasses import asdict

    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stand-in GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", torch.backends.cudnn.allow_tf32)
    # a row of an earlier run of the same day, written before rows had a reference: still shown
    old = asdict(
        real_models.Row("gpt2", "bf16", shape="4 x 512", batch=4, tgc_error=0.013, tgc_ms=2.0)
    )
    for key in ("reference", "eager_error", "tgc_limit", "tgc_plan"):
        del old[key]
    store = real_models.results_path(tmp_path, "Stand-in GPU").with_suffix(".json")
    store.write_text(json.dumps({"gpt2/bf16/4 x 512": old}))
    plan = real_models.plan_summary(
        real_models.plan_breakdown(_planned((ROOT / "examples" / "mlp.tg").read_text())), "default"
    )

    def gpu_one(row, args, db, save):  # what a row leaves: measurements, errors, a plan
        con = sqlite3.connect(db)
        con.execute("create table if not exists rows (name text)")
        con.execute("insert into rows values (?)", (row.dtype,))
        con.commit()
        con.close()
        row.shape, row.reference = "8 x 3 x 224 x 224", "f32" if row.dtype == "bf16" else "eager"
        row.modes["default"] = {"first_s": 9.0, "ms": 2.0, "error": 0.026, "note": ""}
        row.eager_error = 0.015 if row.dtype == "bf16" else 0.0
        row.tgc_error = 0.0263 if row.dtype == "bf16" else 5e-4
        row.tgc_ms, row.tgc_plan = 1.5, plan
        row.tgc_limit = real_models.error_limit(real_models.TOLERANCE[row.dtype], row.eager_error)
        return row

    monkeypatch.setattr(real_models, "gpu_one", gpu_one)
    argv = ["--only", "vit", "--dtypes", "bf16,f32", "--batch", "8", "--out", str(tmp_path)]
    assert real_models.main([*argv, "--keep-db"]) == 0
    # a copy after each row, of the run's one database as it was then
    for dtype, names in (("bf16", ["bf16"]), ("f32", ["bf16", "f32"])):
        con = sqlite3.connect(tmp_path / f"measurements-vit-{dtype}-b8.sqlite")
        assert [n for (n,) in con.execute("select name from rows")] == names
        con.close()
    report = store.with_suffix(".md").read_text()
    assert "max(0.02 (bf16) / 0.001 (f32), 2 x eager's own error)" in report
    assert "| 2.6e-02 (<= 3.0e-02) |" in report  # tgc's error and its limit
    assert "| 5.0e-04 (<= 1.0e-03) |" in report  # the f32 row: eager is its reference
    assert real_models._error_cell({"tgc_error": 0.031, "tgc_limit": 0.03, "reference": "f32"}) == (
        "3.1e-02 (> 3.0e-02)"
    )
    assert "| 1.3e-02 vs eager |" in report  # the older row, its error against eager
    assert (
        "vit bf16 8 x 3 x 224 x 224: errors against the f32 reference: default 2.6e-02, "
        "eager 1.5e-02, tgc 2.6e-02" in report
    )
    assert "plan 'default', 5 calls" in report and "numpy.atomic.matmul: 2 call(s)" in report
    rows = json.loads(store.read_text())
    assert rows["vit/bf16/8 x 3 x 224 x 224"]["tgc_plan"]["calls"] == 5
    # without --keep-db, nothing is copied
    for f in tmp_path.glob("measurements-*.sqlite"):
        f.unlink()
    assert real_models.main(argv) == 0
    assert not list(tmp_path.glob("measurements-*.sqlite"))


@_needs("torch", "transformers")
def test_the_tgc_backend_mode_compiles_the_model_through_dynamo() -> None:
    """`--modes tgc-backend` runs the model as torch.compile(model, backend="tgc") (issue 26's
    first item, timed beside the other modes on a GPU): on the CPU, a tiny GPT-2 in float32
    matches eager on fresh ids, and the note says how many of Dynamo's graphs tgc compiled."""
    import torch

    from tgc.dynamo import coverage

    spec = real_models.SPECS["gpt2"]
    module = real_models.wrap(real_models.build(spec, True, {}, torch.float32), spec.output)
    ids = real_models.token_ids(spec.config(True, {}).vocab_size, 2, 8, seed=3)
    torch._dynamo.reset()
    try:
        fn = real_models.compiled_for(module, real_models.BACKEND_MODE)
        with torch.no_grad():
            got, want = fn(ids), module(ids)
        note = real_models.backend_tally()
        tally = coverage()
    finally:
        torch._dynamo.reset()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    # one graph compiled by tgc (whether tgc or eager then ran it is compare_eager's timing)
    assert tally.graphs == 1 and note == tally.summary()

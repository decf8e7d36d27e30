"""The tiny GPT-2 and BERT of test/models/ on the GPU: tgc's CUDA backend beside PyTorch eager and
torch.compile on the same inputs (issue 9, item 4).

On the GPU machine (PyTorch, transformers, PyCUDA and nvcc there), from the repository root:

    python3 bench/models_gpu.py [--only tiny_gpt2,...] [--commit HASH] [--out bench/results]

For each model: tgc imports the committed model.onnx and runs it through the GPU route (`tgc-run
--backend cuda`, planner/route.py) with `--no-measure` on an empty database, as
bench/gpu_suite.py's tgc column does; PyTorch runs the model that bench/make_tiny_models.py builds (same
config, same seed), on the stored inputs. When that model does not reproduce the stored outputs
(other torch or transformers versions may draw other weights), it is exported again here and tgc
imports that export instead; the report says which. Every tgc result is checked against PyTorch's
float32 result on the GPU (max |difference| <= 1e-3 x max |PyTorch|) before its time is kept.
Times: bench/gpu_suite.py's method (CUDA events around each of 30 repetitions after warm-up, a
sleep kernel queued first so the host runs ahead, the median), for tgc, eager, torch.compile and
torch.compile(mode="reduce-overhead") (CUDA graphs). Writes
bench/results/models-<device>-<date>.md with the device, date, commit and versions.

Without a GPU, `--dry-run` does the parts that need none: import, `optimize` and a numpy run
against PyTorch's stored float64 outputs (rtol 1e-3, atol 1e-4, as test/test_import_models.py),
then the plan the route makes where nothing is measured, on tgc's own kernels (the standalone
file's: `tgc-translate --emit=cuda`), and with `--nvcc` that file compiled by nvcc for `--arch`
(default sm_90). It needs neither PyTorch nor PyCUDA.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_suite import device_slug  # noqa: E402  (bench/ is on the path only now)

MODELS = ROOT / "test" / "models"
NAMES = ("tiny_gpt2", "tiny_bert", "tiny_gpt2_dynamo", "tiny_bert_dynamo")
RTOL, ATOL = 1e-3, 1e-4  # numpy run against PyTorch float64 (test/test_import_models.py's)
GPU_TOL = 1e-3  # tgc on the GPU against PyTorch float32 on the GPU, relative to max |PyTorch|


@dataclass
class Row:
    name: str
    source: str = "committed"
    steps: str = "-"
    tgc_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    graphs_ms: float | None = None
    error: float | None = None
    note: str = ""
    failed: bool = False


# -- the stored test folders (no PyTorch needed) ----------------------------------------------------


def load_tensors(folder: Path, prefix: str) -> list[np.ndarray]:
    """<prefix>_0.pb, <prefix>_1.pb, ... in index order."""
    import onnx
    from onnx import numpy_helper

    paths = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in paths]


def stored(name: str) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(inputs, PyTorch float32 outputs, PyTorch float64 outputs) of test_data_set_0."""
    folder = MODELS / name / "test_data_set_0"
    return tuple(load_tensors(folder, p) for p in ("input", "output", "reference_f64"))


def import_module(path: Path):
    import tgc
    from tgc.importers.onnx import import_onnx

    tgc.load_all()
    return import_onnx(path)


def dry_run_one(name: str, nvcc: bool, arch: str) -> Row:
    """Everything but the GPU: numpy against PyTorch float64, the plan of the standalone file,
    and that file compiled (with `nvcc`)."""
    from gpu_suite import plan_summary

    from tgc.pass_manager import PassManager
    from tgc.planner.standalone import emit_standalone_cuda
    from tgc.runtime.interpreter import run_function

    row = Row(name)
    inputs, _, f64 = stored(name)
    module = import_module(MODELS / name / "model.onnx")
    PassManager.from_text("optimize").run(module)
    got = run_function(module.funcs[0], inputs)
    for g, w in zip(got, f64, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=name)
    row.error = max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, f64))
    module = import_module(MODELS / name / "model.onnx")
    PassManager.from_text("lower-for-planning").run(module)
    source = emit_standalone_cuda(module, name, arch=arch)  # plans the function in place
    row.steps = plan_summary(module.funcs[0])
    if nvcc:
        compile_file(source, arch)
        row.note = f"standalone file compiled for {arch}"
    return row


def compile_file(source: str, arch: str) -> None:
    """nvcc -c on a standalone file (with its own target where a kernel needs one)."""
    target = next((w for w in source.split() if w.startswith("-gencode=")), f"-arch={arch}")
    with tempfile.TemporaryDirectory(prefix="tgc-models-") as tmp:
        src = Path(tmp) / "model.cu"
        src.write_text(source)
        cmd = ["nvcc", target, "-c", "-o", f"{src}.o", str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"nvcc failed:\n{proc.stderr[:2000]}")


# -- on the GPU ---------------------------------------------------------------------------------


def torch_model(name: str):
    """(the PyTorch model of `name` on the GPU, the path of the ONNX file tgc imports, where
    that file comes from)."""
    import make_tiny_models as gen
    import torch

    spec = next(s for s in gen.SPECS if s.name == name)
    model, _ = gen.build(spec.arch)
    inputs, f32, _ = stored(name)
    here = gen.run_torch(model, inputs, torch.float32)
    path, source = MODELS / name / "model.onnx", "committed"
    if not all(np.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(here, f32)):
        out = Path(tempfile.mkdtemp(prefix="tgc-models-"))
        gen.make(spec, out, log=lambda _: None)
        path, source = out / name / "model.onnx", "re-exported here (weights differ)"
    return model.cuda(), path, source


def gpu_one(name: str, do_compile: bool) -> Row:
    import torch
    from gpu_suite import checked_result, plan_summary, rel_error, tgc_program, time_ms

    from tgc.printer import print_module

    row = Row(name)
    model, path, row.source = torch_model(name)
    inputs = [torch.tensor(x, device="cuda") for x in stored(name)[0]]
    program = tgc_program(print_module(import_module(path)))
    row.steps = plan_summary(program.func)

    def eager():
        with torch.no_grad():
            return model(*inputs)

    stream = torch.cuda.current_stream()
    want = eager()
    want = list(want) if isinstance(want, tuple) else [want]
    torch.cuda.synchronize()
    outs = [checked_result(o) for o in program(list(inputs))]
    row.error = max(rel_error(o, w) for o, w in zip(outs, want, strict=True))
    if row.error <= GPU_TOL:
        row.tgc_ms = time_ms(lambda: program(list(inputs)), stream)
    else:
        row.note += f" tgc differs from PyTorch by {row.error:.2e} (tolerance {GPU_TOL:g});"
        row.failed = True
    with torch.cuda.stream(stream):
        row.eager_ms = time_ms(eager, stream)
        if do_compile:
            row.compile_ms = compiled_ms(model, inputs, stream, None, row)
            row.graphs_ms = compiled_ms(model, inputs, stream, "reduce-overhead", row)
    return row


def compiled_ms(model, inputs, stream, mode: str | None, row: Row) -> float | None:
    import torch
    from gpu_suite import time_ms

    try:
        compiled = torch.compile(model, mode=mode)

        def call():
            with torch.no_grad():
                return compiled(*inputs)

        call()
        return time_ms(call, stream)
    except Exception as e:  # noqa: BLE001  (report whatever torch.compile raises, go on)
        row.note += (
            f" torch.compile({mode or 'default'}) failed: {type(e).__name__}: {str(e)[:160]};"
        )
        return None


# -- the report ---------------------------------------------------------------------------------


def commit_of(given: str | None) -> str:
    if given:
        return given
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        if proc.returncode == 0:
            return proc.stdout.strip()
    except OSError:
        pass
    return os.environ.get("TGC_COMMIT", "unknown")


def versions() -> str:
    parts = [f"python {sys.version.split()[0]}", f"numpy {np.__version__}"]
    for module in ("torch", "transformers", "onnx", "pycuda"):
        try:  # the installed distribution's version: not every module has `__version__`
            parts.append(f"{module} {importlib.metadata.version(module)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{module} absent")
    return ", ".join(parts)


def fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.4f} ms"


def table(rows: list[Row], dry_run: bool) -> list[str]:
    if dry_run:
        lines = [
            "| model | numpy max rel. error vs PyTorch f64 | cuda plan | note |",
            "|---|---|---|---|",
        ]
        for r in rows:
            err = "-" if r.error is None else f"{r.error:.1e}"
            lines.append(f"| {r.name} | {err} | {r.steps} | {r.note.strip()} |")
        return lines
    lines = [
        "| model | onnx file | tgc plan | tgc | PyTorch eager | torch.compile | "
        "torch.compile reduce-overhead | max rel. error vs PyTorch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = "-" if r.error is None else f"{r.error:.1e}"
        lines.append(
            f"| {r.name} | {r.source} | {r.steps} | {fmt(r.tgc_ms)} | {fmt(r.eager_ms)} | "
            f"{fmt(r.compile_ms)} | {fmt(r.graphs_ms)} | {err} |"
        )
    return lines


def report(rows: list[Row], device: str, commit: str, dry_run: bool) -> list[str]:
    today = datetime.date.today().isoformat()
    lines = [
        f"# tgc on tiny transformers: {device}, {today}",
        "",
        f"- device: {device}; date: {today}; commit: {commit}",
        f"- versions: {versions()}",
        "- models: test/models/ (bench/make_tiny_models.py): batch 2 x 16 tokens, 2 layers, "
        "hidden 64, 4 heads, vocab 512, float32",
    ]
    if not dry_run:
        lines.append(
            "- method: bench/gpu_suite.py's: medians of 30 repetitions timed with CUDA events "
            "after 3 warm-ups, a sleep kernel queued first; tgc through the GPU route with "
            "`--no-measure` on an empty database; every "
            f"tgc result within {GPU_TOL:g} x max |PyTorch| of PyTorch's before its time is kept"
        )
    lines += ["", *table(rows, dry_run), ""]
    lines += [f"- {r.name}: {r.note.strip()}" for r in rows if r.note.strip() and not dry_run]
    failed = [r.name for r in rows if r.failed]
    if failed:
        lines += [f"- failed: {', '.join(failed)} (see the notes)", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: numpy check and plans only")
    ap.add_argument("--nvcc", action="store_true", help="--dry-run: also compile the kernels")
    ap.add_argument("--arch", default="sm_90", help="--nvcc's target (default sm_90)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--commit", default=None, help="commit to report (default: git's HEAD)")
    ap.add_argument(
        "--out",
        default=None,
        help="folder of the report (default bench/results; --dry-run writes none unless given)",
    )
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(NAMES)
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(NAMES)}")
    rows = []
    for name in names:
        t0 = time.time()
        rows.append(measure(name, args))
        print(f"{name}: {time.time() - t0:.1f} s {rows[-1]}", flush=True)
    device = "no GPU (dry run)" if args.dry_run else gpu_name()
    lines = report(rows, device, commit_of(args.commit), args.dry_run)
    print("\n".join(lines))
    out = args.out or (None if args.dry_run else str(ROOT / "bench" / "results"))
    if out:
        write(lines, Path(out), device, args.dry_run)
    return 1 if any(r.failed for r in rows) else 0


def measure(name: str, args) -> Row:
    """One model's row; a model tgc cannot import or run gets a row saying why (the others
    still run)."""
    from tgc.diagnostics import TgcError

    try:
        if args.dry_run:
            return dry_run_one(name, args.nvcc, args.arch)
        return gpu_one(name, not args.no_compile)
    except (TgcError, AssertionError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return Row(name, note=f"failed: {first}", failed=True)


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def write(lines: list[str], out: Path, device: str, dry_run: bool) -> None:
    slug = "dry-run" if dry_run else device_slug(device)
    path = out / f"models-{slug}-{datetime.date.today().isoformat()}.md"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())

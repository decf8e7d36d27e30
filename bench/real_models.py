"""Real Hugging Face models through tgc's GPU route, beside PyTorch (issue 22, item 6).

On the GPU machine (PyTorch, transformers, PyCUDA and nvcc there), from the repository root:

    python3 bench/real_models.py [--only gpt2,llama,...] [--dtypes bf16,f32] [--batch 4] [--seq 512]
        [--modes eager,default,max-autotune-no-cudagraphs,reduce-overhead] [--db PATH]
        [--measure-budget 30] [--llama-hidden 2048] [--commit HASH] [--out bench/results]

Each model is built by transformers from its config with random weights (seeded; nothing is
downloaded), cast with `.to(dtype)`, wrapped to return one tensor (the logits of a causal LM, the
last hidden state of an encoder; `use_cache=False`) and exported with `torch.export` on the CPU,
then imported with `tgc.importers.torch.import_exported_program` (parameters as `{tgc.param}`
arguments). Then, on one GPU in one process:

- tgc: `compile_module` (planner/route.py: lower for planning, measure on first use within
  `--measure-budget` seconds, plan, check the whole plan) and a first call; its *first run* is
  import + compile + first call, wall clock. The measurement database is a fresh one in a
  temporary folder unless `--db` names one, so the first run is a real first use. Then
  `compile_module` again on a fresh import with the same database: its *second plan* time (what a
  user's second run pays, nothing left to measure). The steady state is the median of 30 calls
  timed with CUDA events after 3 warm-ups, a sleep kernel queued first so the host runs ahead
  (bench/gpu_suite.py's `time_ms`), on the inputs and parameters as torch CUDA tensors.
- PyTorch: eager, `torch.compile` (default mode), `mode="max-autotune-no-cudagraphs"` and
  `mode="reduce-overhead"` (CUDA graphs) on the same inputs: first call (compile) and steady
  state timed alike.

Every tgc result is checked against PyTorch eager's in the same dtype: max |tgc - eager| at most
`TOLERANCE[dtype]` x max |eager| (bf16 2e-2, f32 1e-3); a time is kept only for a result that
passes. The compiled modes' results are compared the same way and their errors reported.
Rows go to bench/results/real-models-<device>-<date>.json (keyed by model and dtype, so that
runs with `--only` / `--dtypes` add to one report) and the report, with the device, date,
commit and versions, to the .md of the same name. A model that fails (export, import, tgc or a
PyTorch mode) gets its one-line error in its row; the others still run.

Without a GPU, `--dry-run` builds, exports and imports each model (`--tiny`: small configs, 2
layers), runs the imported module through tgc's numpy interpreter (`tgc.run`) in f32 on small
inputs (batch 2 x 16 tokens unless given) and checks it against PyTorch's CPU output (rtol
`DRY_TOLERANCE` of max |PyTorch|); then plans it on the numpy backend (lower-for-planning,
select-kernels) and runs that plan, checked alike. It writes no file unless `--out` is given.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_suite import time_ms  # noqa: E402  (bench/ is on the path only now; the house method)

TOLERANCE = {"bf16": 2e-2, "f32": 1e-3}  # tgc vs eager, relative to max |eager|
DRY_TOLERANCE = 1e-4  # numpy interpreter (f32) vs PyTorch on the CPU (f32)
MODES = ("eager", "default", "max-autotune-no-cudagraphs", "reduce-overhead")
DTYPES = ("bf16", "f32")


# -- the models ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A model: how transformers builds it (class name and config) and what it returns."""

    name: str
    title: str
    model_class: str
    config_class: str
    full: dict
    tiny: dict
    output: str  # "logits" or "last_hidden_state"

    def config(self, tiny: bool, overrides: dict):
        import transformers

        values = {**(self.tiny if tiny else self.full), **overrides}
        return getattr(transformers, self.config_class)(**values)


_TINY_DECODER = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "max_position_embeddings": 128,
}

SPECS = {
    s.name: s
    for s in (
        Spec(
            "gpt2",
            "GPT-2 small (12 layers, 768 hidden, 12 heads, LM head of 50257)",
            "GPT2LMHeadModel",
            "GPT2Config",
            {},  # GPT2Config's defaults are GPT-2 small
            {"vocab_size": 256, "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 4},
            "logits",
        ),
        Spec(
            "llama",
            "Llama-family (4 layers, GQA 32 q / 4 kv heads, RoPE, RMSNorm, SiLU MLP)",
            "LlamaForCausalLM",
            "LlamaConfig",
            {
                "vocab_size": 32000,
                "hidden_size": 2048,
                "intermediate_size": 5632,
                "num_hidden_layers": 4,
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "max_position_embeddings": 2048,
            },
            {**_TINY_DECODER, "num_key_value_heads": 2},
            "logits",
        ),
        Spec(
            "bert",
            "BERT-base (12 layers, 768 hidden, 12 heads), last hidden state",
            "BertModel",
            "BertConfig",
            {},  # BertConfig's defaults are BERT-base
            {
                "vocab_size": 256,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 128,
            },
            "last_hidden_state",
        ),
        Spec(
            "qwen2",
            "Qwen2-1.5B-shaped (4 layers, 1536 hidden, GQA 12 q / 2 kv, q/k/v biases, "
            "vocab 151936, tied embeddings)",
            "Qwen2ForCausalLM",
            "Qwen2Config",
            {
                "vocab_size": 151936,
                "hidden_size": 1536,
                "intermediate_size": 8960,
                "num_hidden_layers": 4,
                "num_attention_heads": 12,
                "num_key_value_heads": 2,
                "max_position_embeddings": 4096,
                "tie_word_embeddings": True,
            },
            {**_TINY_DECODER, "num_key_value_heads": 2, "tie_word_embeddings": True},
            "logits",
        ),
        Spec(
            "mistral",
            "Mistral-shaped (4 layers, 2048 hidden, GQA 32 q / 8 kv, sliding window 4096)",
            "MistralForCausalLM",
            "MistralConfig",
            {
                "vocab_size": 32000,
                "hidden_size": 2048,
                "intermediate_size": 7168,
                "num_hidden_layers": 4,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "max_position_embeddings": 4096,
                "sliding_window": 4096,
            },
            {**_TINY_DECODER, "num_key_value_heads": 4, "sliding_window": 64},
            "logits",
        ),
    )
}


def build(spec: Spec, tiny: bool, overrides: dict, dtype):
    """The model in eval mode, weights drawn with seed 0, cast to `dtype`, on the CPU."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = spec.config(tiny, overrides)
    config.use_cache = False
    model = getattr(transformers, spec.model_class)(config)
    return model.to(dtype).eval()


def wrap(model, output: str):
    """`model` as a module of `input_ids` returning the one tensor `output`."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return getattr(self.model(input_ids=input_ids, use_cache=False), output)

    return Wrapped().eval()


def token_ids(vocab: int, batch: int, seq: int, seed: int):
    import torch

    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def export_and_import(module, ids):
    """(the exported program, the imported tgc module, seconds of export, seconds of import)."""
    import torch

    from tgc.importers.torch import import_exported_program

    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(module, (ids,))
    t1 = time.perf_counter()
    imported = import_exported_program(ep)
    return ep, imported, t1 - t0, time.perf_counter() - t1


def parameter_tensors(ep) -> list:
    """The parameters and buffers of `ep` in the order of the imported function's parameter
    arguments (importers/torch `parameter_values`' order), as torch tensors."""
    from torch.export.graph_signature import InputKind

    out = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            found = ep.state_dict.get(spec.target)
            out.append(found if found is not None else ep.constants[spec.target])
    return out


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:300]


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def count_ops(module) -> int:
    return sum(1 for f in module.funcs for _ in f.body.ops)


# -- the dry run (no GPU) ---------------------------------------------------------------------------


@dataclass
class DryRow:
    model: str
    params: str = "-"
    imported: str = "-"
    interpreter: str = "-"
    planned: str = "-"
    note: str = ""
    failed: bool = False


def dry_run_one(name: str, args) -> DryRow:
    import torch

    import tgc
    from tgc.pass_manager import PassManager
    from tgc.planner.executor import run_plan
    from tgc.planner.select import select_kernels

    spec = SPECS[name]
    row = DryRow(name)
    batch, seq = args.batch or 2, args.seq or 16
    try:
        model = build(spec, args.tiny, overrides(name, args), torch.float32)
        row.params = f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M"
        module = wrap(model, spec.output)
        ids = token_ids(model.config.vocab_size, batch, seq, seed=1)
        ep, imported, export_s, import_s = export_and_import(module, ids)
        row.imported = (
            f"ok ({count_ops(imported)} ops; export {export_s:.1f} s, import {import_s:.1f} s)"
        )
    except Exception as e:  # noqa: BLE001  (a model that fails gets its row, the others run)
        row.imported, row.note, row.failed = "failed", one_line(e), True
        return row
    fresh = token_ids(model.config.vocab_size, batch, seq, seed=2)
    with torch.no_grad():
        want = module(fresh).numpy()
    inputs = [t.detach().numpy() for t in parameter_tensors(ep)] + [fresh.numpy()]
    row.interpreter = _checked(lambda: tgc.run(imported, inputs)[0], want, row, "interpreter")
    try:
        PassManager.from_text("lower-for-planning").run(imported)
        select_kernels(imported.funcs[0], tolerance=1e-5, backends=("numpy",))
    except Exception as e:  # noqa: BLE001
        row.planned, row.failed = "failed", True
        row.note += f" numpy plan: {one_line(e)};"
        return row
    row.planned = _checked(lambda: run_plan(imported.funcs[0], inputs)[0], want, row, "numpy plan")
    return row


def _checked(run: Callable[[], np.ndarray], want: np.ndarray, row: DryRow, what: str) -> str:
    t0 = time.perf_counter()
    try:
        got = run()
    except Exception as e:  # noqa: BLE001
        row.failed = True
        row.note += f" {what}: {one_line(e)};"
        return "failed"
    err = rel_error(got, want)
    verdict = "ok" if err <= DRY_TOLERANCE else "WRONG"
    row.failed |= verdict != "ok"
    return f"{verdict}, error {err:.1e} ({time.perf_counter() - t0:.1f} s)"


def dry_table(rows: list[DryRow]) -> list[str]:
    lines = [
        "| model | parameters | export + import | numpy interpreter vs PyTorch CPU | "
        "numpy plan (lower-for-planning, select-kernels) vs PyTorch CPU | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.params} | {r.imported} | {r.interpreter} | {r.planned} | "
            f"{r.note.strip()} |"
        )
    return lines


# -- on the GPU ---------------------------------------------------------------------------------


@dataclass
class ModeResult:
    first_s: float | None = None  # first call, compile included
    ms: float | None = None  # steady state, median
    error: float | None = None  # against eager, relative to max |eager|
    note: str = ""


@dataclass
class Row:
    model: str
    dtype: str
    shape: str = ""
    params: str = ""
    tgc_first_s: float | None = None  # import + compile_module + first call
    tgc_import_s: float | None = None
    tgc_compile_s: float | None = None  # compile_module's first use (lower, measure, plan, check)
    tgc_steps_s: dict = field(default_factory=dict)  # its steps: lower, measure, plan, check
    tgc_measured: int | None = None
    tgc_second_plan_s: float | None = None  # compile_module again, same database: its plan time
    tgc_second_first_use_s: float | None = None
    tgc_second_measured: int | None = None
    tgc_ms: float | None = None  # calls replayed as CUDA graphs (the route's default)
    tgc_plain_ms: float | None = None  # the same plan launched kernel by kernel
    tgc_host_us: float | None = None  # host time to queue one call, replayed
    tgc_plain_host_us: float | None = None  # and launched kernel by kernel
    tgc_graphs: str = ""  # "replayed", or why not
    tgc_error: float | None = None
    tgc_chosen: str = ""
    tgc_candidates: dict = field(default_factory=dict)
    modes: dict = field(default_factory=dict)  # mode -> ModeResult as a dict
    note: str = ""


def as_host(value) -> np.ndarray:
    """A tgc result (or a torch tensor) as a float64 host array: bf16 goes through float32
    (a torch CUDA tensor's `__cuda_array_interface__` has no bf16)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy().astype(np.float64)
    if hasattr(value, "get"):  # the CUDA backend's DeviceArray
        return np.asarray(value.get()).astype(np.float64)
    return torch.as_tensor(value, device="cuda").float().cpu().numpy().astype(np.float64)


def gpu_one(name: str, dtype_name: str, args, db: str) -> Row:
    import torch

    spec = SPECS[name]
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    batch, seq = args.batch or 4, args.seq or 512
    row = Row(name, dtype_name, shape=f"{batch} x {seq}")
    try:
        model = build(spec, args.tiny, overrides(name, args), dtype)
        row.params = f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M"
        module = wrap(model, spec.output)
        ids = token_ids(model.config.vocab_size, batch, seq, seed=1)
        t0 = time.perf_counter()
        ep, imported, _, import_s = export_and_import(module, ids)
        row.tgc_import_s = import_s
        export_s = time.perf_counter() - t0 - import_s
        params = [t.detach().to("cuda").contiguous() for t in parameter_tensors(ep)]
    except Exception as e:  # noqa: BLE001
        row.note = f"export/import failed: {one_line(e)}"
        return row
    module = module.to("cuda")
    ids_cuda = token_ids(model.config.vocab_size, batch, seq, seed=2).to("cuda")
    stream = torch.cuda.current_stream()

    def eager():
        with torch.no_grad():
            return module(ids_cuda)

    want = as_host(eager())
    torch.cuda.synchronize()
    profiles = [] if args.profile else None
    for mode in args.modes:
        row.modes[mode] = asdict(torch_mode(module, ids_cuda, mode, want, stream, profiles))
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    run_tgc(row, imported, params, ids_cuda, want, stream, args, db, dtype_name, profiles)
    if profiles:
        out = Path(args.out or ROOT / "bench" / "results") / f"profile-{name}-{dtype_name}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(profiles))
    row.note = (row.note + f" (torch.export {export_s:.1f} s, not in tgc's first run)").strip()
    return row


def run_tgc(
    row: Row, imported, params, ids, want, stream, args, db: str, dtype_name: str, profiles=None
):
    """tgc's first run, second plan and steady state into `row` (errors noted, not raised)."""
    import torch

    import tgc
    from tgc.planner.route import RouteOptions, compile_module
    from tgc.printer import print_module

    options = RouteOptions(db=db, measure_budget=args.measure_budget)
    values = [*params, ids]
    # the second compile's module: compile_module lowers its module in place, and importing
    # `ep` again fails once the model's parameters have moved to the GPU
    text = print_module(imported)
    try:
        t0 = time.perf_counter()
        prog = compile_module(imported, options=options)
        row.tgc_compile_s = time.perf_counter() - t0
        outs = prog(values)
        got = as_host(outs[0])  # synchronises
        row.tgc_first_s = row.tgc_import_s + time.perf_counter() - t0
        report = prog.report
        row.tgc_steps_s = {
            step: round(getattr(report, f"{step}_s"), 2)
            for step in ("lower", "measure", "plan", "check")
        }
        row.tgc_measured = report.measured
        row.tgc_chosen = str(report.chosen)
        row.tgc_candidates = {k: round(float(v), 4) for k, v in report.candidates.items()}
        row.tgc_error = rel_error(got, want)
        if row.tgc_error <= TOLERANCE[dtype_name]:
            row.tgc_ms = time_ms(lambda: prog(values), stream)
            row.tgc_plain_ms = time_ms(lambda: prog.planned(values), stream)
            row.tgc_host_us = host_us(lambda: prog(values))
            row.tgc_plain_host_us = host_us(lambda: prog.planned(values))
            reason = getattr(prog.runner, "reason", "graphs off")
            row.tgc_graphs = "replayed" if reason is None else reason
            if profiles is not None:
                profiles.append(kernel_table(lambda: prog(values), "tgc"))
        else:
            row.note += (
                f" tgc differs from eager by {row.tgc_error:.2e} "
                f"(tolerance {TOLERANCE[dtype_name]:g});"
            )
    except Exception as e:  # noqa: BLE001
        row.note += f" tgc failed: {one_line(e)};"
        return
    finally:
        prog = None
        gc.collect()
        torch.cuda.empty_cache()
    try:
        second = compile_module(tgc.parse(text), options=options)
        row.tgc_second_plan_s = second.report.plan_s
        row.tgc_second_first_use_s = second.report.first_use_s
        row.tgc_second_measured = second.report.measured
    except Exception as e:  # noqa: BLE001
        row.note += f" tgc second compile failed: {one_line(e)};"


def host_us(call, calls: int = 20) -> float:
    """Microseconds of host time to queue one call (the GPU may still be running them)."""
    import torch

    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    queued = time.perf_counter() - start
    torch.cuda.synchronize()
    return queued / calls * 1e6


def kernel_table(call, title: str, rows: int = 25) -> str:
    """The GPU kernels of 3 calls of `call` by total time (torch.profiler), as text."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    table = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90
    )
    return f"## {title} (3 calls)\n\n{table}\n"


def torch_mode(module, ids, mode: str, want: np.ndarray, stream, profiles=None) -> ModeResult:
    import torch

    result = ModeResult()
    try:
        fn = (
            module
            if mode == "eager"
            else torch.compile(module, mode=None if mode == "default" else mode)
        )

        def call():
            with torch.no_grad():
                return fn(ids)

        t0 = time.perf_counter()
        got = as_host(call())  # copies out before a CUDA graph replay can overwrite it
        result.first_s = time.perf_counter() - t0
        result.error = rel_error(got, want)
        result.ms = time_ms(call, stream)
        if profiles is not None:
            profiles.append(kernel_table(call, f"PyTorch {mode}"))
    except Exception as e:  # noqa: BLE001  (whatever torch.compile raises: report, go on)
        result.note = one_line(e)
    return result


# -- the report ---------------------------------------------------------------------------------


def commit_of(given: str | None) -> str:
    import subprocess

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
    return "unknown"


def versions() -> str:
    parts = [f"python {sys.version.split()[0]}", f"numpy {np.__version__}"]
    for module in ("torch", "transformers", "pycuda", "triton"):
        try:
            parts.append(f"{module} {importlib.metadata.version(module)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{module} absent")
    return ", ".join(parts)


def fmt_ms(ms) -> str:
    return "-" if ms is None else f"{ms:.3f} ms"


def fmt_s(s) -> str:
    return "-" if s is None else f"{s:.1f} s"


def gpu_table(rows: list[dict], modes: list[str]) -> list[str]:
    head = [
        "model",
        "dtype",
        "tokens",
        "tgc first run",
        "tgc 2nd plan",
        "tgc",
        "tgc, no graphs",
        "host per call (graphs / none)",
        "tgc error",
        *[m if m != "default" else "compile default" for m in modes],
        "note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["dtype"], r["shape"]]
        first = fmt_s(r["tgc_first_s"])
        if r["tgc_measured"] is not None:
            first += f" ({r['tgc_measured']} measured)"
        cells.append(first)
        second = "-"
        if r["tgc_second_plan_s"] is not None:
            second = (
                f"{r['tgc_second_plan_s']:.2f} s (compile {r['tgc_second_first_use_s']:.1f} s, "
                f"{r['tgc_second_measured']} measured)"
            )
        cells.append(second)
        ms = fmt_ms(r["tgc_ms"])
        cells.append(f"**{ms}**" if r["tgc_ms"] is not None and _fastest(r) else ms)
        cells.append(fmt_ms(r.get("tgc_plain_ms")))
        host, plain_host = r.get("tgc_host_us"), r.get("tgc_plain_host_us")
        cells.append("-" if host is None else f"{host:.0f} / {plain_host:.0f} µs")
        cells.append("-" if r["tgc_error"] is None else f"{r['tgc_error']:.1e}")
        notes = [r["note"]] if r["note"] else []
        for m in modes:
            res = r["modes"].get(m)
            if res is None:
                cells.append("not run")
                continue
            cell = fmt_ms(res["ms"])
            if res["first_s"] is not None and m != "eager":
                cell += f" (first {res['first_s']:.0f} s)"
            cells.append(cell)
            if res["note"]:
                notes.append(f"{m}: {res['note']}")
        cells.append("; ".join(n.replace("|", "/") for n in notes))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fastest(r: dict) -> bool:
    others = [m["ms"] for m in r["modes"].values() if m["ms"] is not None]
    return all(r["tgc_ms"] <= o for o in others)


def gpu_report(rows: list[dict], device: str, commit: str, args) -> list[str]:
    today = datetime.date.today().isoformat()
    names = sorted({r["model"] for r in rows}, key=list(SPECS).index)
    lines = [
        f"# Real models through tgc's GPU route: {device}, {today}",
        "",
        f"- device: {device}; date: {today}; commit: {commit}",
        f"- versions: {versions()}",
        "- models (transformers, from their configs with random weights, seed 0; exported with "
        "torch.export on the CPU, imported with tgc's torch importer, parameters as arguments):",
        *[f"  - {n}: {SPECS[n].title}" for n in names],
        "- tgc: `compile_module` (planner/route.py) with a fresh measurement database "
        f"(measure budget {args.measure_budget:g} s); *first run* = import + compile_module "
        "(lower, measure, plan, whole-plan check) + first call; *2nd plan* = compile_module again "
        "on a fresh import with the same database (its plan time)",
        "- method: bench/gpu_suite.py's: medians of 30 calls timed with CUDA events after 3 "
        "warm-ups, a sleep kernel queued first; PyTorch modes on the same inputs, `(first N s)` "
        "their first call, compile included",
        f"- checks: tgc against eager, max |difference| <= {TOLERANCE['bf16']:g} (bf16) / "
        f"{TOLERANCE['f32']:g} (f32) x max |eager|, before its time is kept; **bold**: tgc "
        "fastest of the row",
        "",
        *gpu_table(rows, args.modes),
        "",
    ]
    for r in rows:
        if r["tgc_candidates"]:
            times = ", ".join(f"{k} {v:.3f} ms" for k, v in r["tgc_candidates"].items())
            lines.append(
                f"- {r['model']} {r['dtype']}: whole plans {times}; ran '{r['tgc_chosen']}'; "
                f"CUDA graphs: {r.get('tgc_graphs') or '-'}"
            )
        errors = {m: v["error"] for m, v in r["modes"].items() if v["error"] is not None}
        if any(m != "eager" for m in errors):
            text = ", ".join(f"{m} {e:.1e}" for m, e in errors.items() if m != "eager")
            lines.append(f"- {r['model']} {r['dtype']}: PyTorch modes against eager: {text}")
    return lines + [""]


def overrides(name: str, args) -> dict:
    if name == "llama" and args.llama_hidden and not args.tiny:
        hidden = args.llama_hidden
        return {"hidden_size": hidden, "intermediate_size": int(hidden * 11008 / 4096)}
    return {}


def results_path(out: Path, device: str) -> Path:
    from gpu_suite import device_slug

    return out / f"real-models-{device_slug(device)}-{datetime.date.today().isoformat()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", default="", help=f"comma-separated models (default all: {','.join(SPECS)})"
    )
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: bf16,f32")
    ap.add_argument("--modes", default=",".join(MODES), help="PyTorch modes to run beside tgc")
    ap.add_argument("--batch", type=int, default=None, help="sequences (default 4; dry run 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens each (default 512; dry run 16)")
    ap.add_argument("--tiny", action="store_true", help="small configs (2 layers, hidden 64)")
    ap.add_argument("--llama-hidden", type=int, default=None, help="Llama's hidden size (2048)")
    ap.add_argument("--measure-budget", type=float, default=30.0, help="tgc's, seconds")
    ap.add_argument("--db", default=None, help="measurement database (default: a fresh one)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: import and numpy checks")
    ap.add_argument("--commit", default=None, help="commit to report (default: git's HEAD)")
    ap.add_argument(
        "--out", default=None, help="report folder (default bench/results; dry run none)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="also write each run's GPU kernels by time"
    )
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SPECS)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.modes = [m for m in args.modes.split(",") if m]
    for given, known, what in (
        (names, SPECS, "model"),
        (args.dtypes, DTYPES, "dtype"),
        (args.modes, MODES, "mode"),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            ap.error(f"unknown {what}(s) {unknown}; known: {list(known)}")
    import tgc

    tgc.load_all()
    if args.dry_run:
        return dry_run(names, args)
    return gpu_run(names, args)


def dry_run(names: list[str], args) -> int:
    rows = []
    for name in names:
        t0 = time.time()
        rows.append(dry_run_one(name, args))
        print(f"{name}: {time.time() - t0:.1f} s {rows[-1]}", flush=True)
    lines = [
        f"# Real models, dry run (no GPU): {datetime.date.today().isoformat()}",
        "",
        f"- commit: {commit_of(args.commit)}; versions: {versions()}",
        f"- {'tiny configs' if args.tiny else 'full configs'}, f32, batch {args.batch or 2} x "
        f"{args.seq or 16} tokens; checks relative to max |PyTorch|, at most {DRY_TOLERANCE:g}",
        "",
        *dry_table(rows),
        "",
    ]
    print("\n".join(lines))
    if args.out:
        path = Path(args.out) / f"real-models-dry-run-{datetime.date.today().isoformat()}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path}")
    return 1 if any(r.failed for r in rows) else 0


def gpu_run(names: list[str], args) -> int:
    import torch

    device = torch.cuda.get_device_name()
    base = results_path(Path(args.out or ROOT / "bench" / "results"), device)
    store = base.with_suffix(".json")
    rows = json.loads(store.read_text()) if store.exists() else {}
    commit = commit_of(args.commit)
    with tempfile.TemporaryDirectory(prefix="tgc-real-models-") as tmp:
        db = args.db or str(Path(tmp) / "measurements.sqlite")
        for name in names:
            for dtype_name in args.dtypes:
                t0 = time.time()
                row = gpu_one(name, dtype_name, args, db)
                print(f"{name} {dtype_name}: {time.time() - t0:.0f} s {row}", flush=True)
                rows[f"{name}/{dtype_name}"] = asdict(row)
                base.parent.mkdir(parents=True, exist_ok=True)
                store.write_text(json.dumps(rows, indent=1) + "\n")
                ordered = sorted(
                    rows.values(), key=lambda r: (list(SPECS).index(r["model"]), r["dtype"])
                )
                lines = gpu_report(ordered, device, commit, args)
                base.with_suffix(".md").write_text("\n".join(lines))
                gc.collect()
                torch.cuda.empty_cache()
    print("\n".join(lines))
    print(f"wrote {base.with_suffix('.md')}")
    failed = [r for r in rows.values() if r["tgc_ms"] is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Hugging Face generate() with a static KV cache: eager, torch.compile and tgc (issue 26, item 3).

On the GPU machine (PyTorch, transformers, and tgc installed: `source .whl/install.sh`), from the
repository root:

    python3 bench/generate.py [--batches 1 | --batches 1,16] [--prompt 512] [--new-tokens 128]
        [--modes eager,tgc,default,reduce-overhead] [--layers 16] [--hidden 2048] [--heads 32]
        [--kv-heads 8] [--intermediate 8192] [--vocab 32000] [--dtype bf16] [--reps 3]
        [--bandwidth 3.35e12] [--measure-budget S] [--db PATH] [--commit HASH]
        [--out bench/results]

The model: transformers' `LlamaForCausalLM` from a `LlamaConfig` with random weights (seed 0,
nothing downloaded), built on the GPU and cast to bf16: by default 16 layers, hidden 2048, 32
query heads and 8 key-value heads (head dim 64), intermediate 8192, vocabulary 32000, RoPE,
untied embeddings, about 1.1 B parameters. The flags above change the sizes.

The workload: random prompts (seed 1) of `--prompt` tokens at each of `--batches`, greedy
decoding (`do_sample=False`) of exactly `--new-tokens` tokens (`eos_token_id=None`: no sequence
stops early, so every mode generates the same count), into a `StaticCache` of prompt + new tokens
positions made fresh for each generate() (the same shape every call: the decode step is
compiled once, and the max_new_tokens=1 calls below reuse the prefill compiled for the others).
Every call passes `disable_compile=True`: on a GPU with a static cache transformers would
otherwise compile the decode step itself, and `eager` would not be eager.

The modes (`--modes`, run in the order given; put `eager` first, it is the token reference):
`eager` (no compile), `tgc` (`torch.compile(model.forward, backend="tgc")`; its options
measure_budget and db only where the flags give them), `default` (`torch.compile(model.forward)`,
Inductor) and `reduce-overhead` (`mode="reduce-overhead"`, CUDA graphs; each call starts a new
CUDA-graph step and copies its output tensors, as tgc's backend does), each compiled as the
Hugging Face docs compile for a static cache: `model.forward` replaced, `generate()` unchanged.
Asked for by name: `tgc-no-whole-graphs` (tgc with the option `whole_graphs` off) and `hf-compile`
(transformers' own compile of the decode step, `disable_compile=False`: its CompileConfig,
reduce-overhead with fullgraph; the prefill runs eagerly).
Dynamo is reset (`torch._dynamo.reset()`, its counters cleared, tgc's tally cleared) before each
mode and batch, so each compiles from scratch. tgc runs right after eager by default, so a run
cut off by its time limit loses torch.compile's rows rather than tgc's.

Per mode and batch: one warm-up generate() of N tokens, its wall time reported as *first call*
(compile included), and WARM_PREFILLS untimed generate() calls of one token, so that the
prefill too is in its steady state before it is timed (tgc replays a graph whole from its
fourth call; the prefill is called once per generate(): before, two of the three TTFT calls
timed tgc's prefill before its replays began); then the time to first token (*TTFT*:
generate() with max_new_tokens=1, the prefill and generate()'s own work, median of `--reps`)
and the whole generate() of N tokens (median of `--reps`), host timers with
`torch.cuda.synchronize()` before and after each call.
From those: *ms per decode step* = (total - TTFT) / (N - 1) and *decode tokens/s* = batch x
(N - 1) / (total - TTFT), and the step's device time alone (*GPU ms / step*: torch.profiler's
kernel and copy durations of one more generate() of N tokens less one of a single token, over
N - 1; on the GPU only). Beside the step: its *bandwidth floor*, the bytes a decode step must
read (every weight once, the input embedding table excepted: a step reads only batch rows of it
unless it is tied to the LM head; and the KV cache up to the current length, averaged over the
decode: prompt + N/2 positions) over the device's memory bandwidth (H100 SXM 3.35e12 B/s, H100
PCIe 2.0e12, H200 4.8e12, by `torch.cuda.get_device_name()`; `--bandwidth` overrides; none
known: no floor). transformers' attention over a static cache reads all its prompt + N
positions, masked, so every mode here reads up to N/2 positions a sequence more than the floor
counts.

Checks: each mode's generated tokens against eager's, the fraction equal (in f32 they should be
identical; in bf16 a near tie can flip, and every token after a flip differs), with the first
step where some sequence differs; for compiled modes Dynamo's graphs and recompiles (its
counters, as test/test_dynamo_generate.py counts them; two graphs, no recompile, expected;
reduce-overhead's graphs Inductor did not capture as CUDA graphs are a note), and for tgc the
backend's tally (how many compiled graphs ran in tgc: one running eagerly is a fallback, and its
time is not tgc's).

On the GPU each mode and batch runs in a process of its own (`--isolate`, the default there;
`--no-isolate` runs them in this one): the child builds the model, measures, and hands its row
and tokens back through files. One process for all had a compiler's crash end the run: after
tgc's modes, reduce-overhead died of a segmentation fault (bench/results/generate-*, run 2), and
with it every row not yet written. A child that dies leaves its row failed, with the signal in
its note. A mode that fails (an exception, out of memory) gets its one-line error in its row's
note and the run goes on with the next mode. Rows are saved after each mode to
bench/results/generate-<device>-<date>.json (a list of runs: a new run is appended) and the
report rewritten from it to the .md of the same name, with device, date, commit, versions, the
config and the method; SIGTERM (a `timeout` around the call) saves the row it cut, and exits 124.

Time. At the default size on an H200 (bench/results/generate-*): eager about 12 s a mode; tgc's
first generate() 125-168 s (each compiled graph planned, measured on first use up to
`--measure-budget` seconds a compile, and built by nvcc), then about 5 s for its timed calls;
torch.compile's default mode about 31 s for its first call. So `--batches` defaults to 1, and
batch 16 is a second call (`--batches 16`, appended to the same day's file); where one call
cannot hold all the modes, split them with `--modes` (each call with `eager` first for the
token check). Each isolated mode also builds the model in its own process (10 s at 1.1 B).

Without a GPU, `--dry-run`: the same code on the CPU, a tiny Llama (2 layers, hidden 64, 4 heads,
2 key-value heads, intermediate 128, vocabulary 256, as test/test_dynamo_generate.py's) in
float32 on one thread, prompt 8, 4 new tokens, batch 1, modes eager and tgc unless the flags say
otherwise.
It exits non-zero unless every mode ran, tgc's greedy tokens equal eager's exactly and every graph
tgc compiled ran in tgc. It writes no file unless `--out` is given (then
generate-dry-run-<date>.md and .json there). test/test_bench_generate.py runs it.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import logging
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from real_models import commit_of  # noqa: E402  (bench/ is on the path only now)

MODES = ("eager", "tgc", "default", "reduce-overhead")
# tgc with whole_graphs off (the route's function replayed within a call, the host work of the
# call not): asked for by name
# transformers' own compile of the decode step (generate()'s auto-compile for a static cache:
# its CompileConfig, mode="reduce-overhead", fullgraph): reduce-overhead as Hugging Face runs it,
# since `reduce-overhead` here (model.forward compiled by us) died of SIGSEGV on an H200
EXTRA_MODES = ("tgc-no-whole-graphs", "hf-compile")
DRY_MODES = ("eager", "tgc")
# untimed generate() calls of one token after the first call: tgc/dynamo/whole.py's WARMUP plain
# calls and its capture, so that the prefill is timed replaying (module doc)
WARM_PREFILLS = 3
# memory bandwidth in bytes/s by a substring of torch.cuda.get_device_name(), the first match
BANDWIDTH = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12))
DTYPES = ("bf16", "f32")
SEED = 0  # the weights'
PROMPT_SEED = 1


@dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


GPU_SIZE = Size(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=32000)
DRY_SIZE = Size(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)
# (batches, prompt, new tokens, dtype) unless the flags say
GPU_WORKLOAD = ([1], 512, 128, "bf16")
DRY_WORKLOAD = ([1], 8, 4, "f32")


@dataclass
class Row:
    """One mode at one batch size; times in seconds (first call) and milliseconds."""

    batch: int
    mode: str
    first_s: float | None = None  # the warm-up generate() of N tokens, compile included
    ttft_ms: float | None = None  # median generate() of one new token
    total_ms: float | None = None  # median generate() of N new tokens
    step_ms: float | None = None  # (total - TTFT) / (N - 1)
    tokens_per_s: float | None = None  # batch x (N - 1) / (total - TTFT)
    floor_ms: float | None = None  # the decode step's bandwidth floor
    # the device's own time a decode step: kernels and copies (torch.profiler), no host time
    gpu_step_ms: float | None = None
    agree: float | None = None  # fraction of generated tokens equal to eager's
    agree_tokens: str = ""  # "equal / all"
    first_difference: int | None = None  # the first new token (0-based) some sequence differs
    dynamo_graphs: int | None = None
    dynamo_recompiles: int | None = None
    tgc_graphs: int | None = None  # compiled by tgc (per graph and shape)
    tgc_graphs_in_tgc: int | None = None
    note: str = ""
    running: str = ""  # the step under way (a row cut off says where)

    @property
    def failed(self) -> bool:
        return self.total_ms is None


class CutOff(BaseException):
    """SIGTERM (the caller's `timeout`) arrived: the run so far is saved, the script ends. Not
    an Exception, so that a mode's `except Exception` does not take it for the mode's failure."""


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:300]


# -- the model and its generate() -------------------------------------------------------------


def llama_config(size: Size, max_positions: int):
    import transformers

    return transformers.LlamaConfig(
        num_hidden_layers=size.layers,
        hidden_size=size.hidden,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        intermediate_size=size.intermediate,
        vocab_size=size.vocab,
        max_position_embeddings=max(2048, max_positions),
    )


def build_model(size: Size, max_positions: int, dtype, device: str):
    """The Llama with random weights (seed SEED), made on `device` in float32, cast to `dtype`."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(llama_config(size, max_positions))
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None  # exactly N new tokens, in every mode
    return model


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "f32": torch.float32}[name]


def prompt_ids(batch: int, length: int, vocab: int, device: str):
    import torch

    generator = torch.Generator().manual_seed(PROMPT_SEED)
    return torch.randint(0, vocab, (batch, length), generator=generator).to(device)


def static_cache(model, length: int) -> dict:
    """A fresh StaticCache of `length` positions as generate()'s keyword `past_key_values`,
    which every transformers version takes (5.24 also names it `cache`; 5.17 refuses that)."""
    import transformers

    cache = transformers.StaticCache(config=model.config, max_cache_len=length)
    return {"past_key_values": cache}


def generate(model, ids, new_tokens: int, cache_len: int, auto_compile: bool = False):
    """Greedy generate() of exactly `new_tokens` tokens into a fresh static cache of `cache_len`
    positions; the sequences (prompt and new tokens). `auto_compile`: transformers compiles the
    decode step itself (mode `hf-compile`)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            disable_compile=not auto_compile,  # transformers' own compile of the decode step
            **static_cache(model, cache_len),
        )
    if out.shape != (ids.shape[0], ids.shape[1] + new_tokens):
        raise RuntimeError(f"generate() returned {tuple(out.shape)}, not {new_tokens} new tokens")
    return out


def compile_forward(model, mode: str, args) -> None:
    """`model.forward` compiled for `mode`, as the Hugging Face docs compile it for a static
    cache (eager: left as it is)."""
    import torch

    if mode in ("eager", "hf-compile"):  # hf-compile: generate() compiles (auto_compile)
        return
    forward = model.forward
    if mode in ("tgc", "tgc-no-whole-graphs"):
        # tgc's defaults but for the one option that mode names
        options = {"whole_graphs": False} if mode == "tgc-no-whole-graphs" else {}
        if args.measure_budget is not None:
            options["measure_budget"] = args.measure_budget
        if args.db:
            options["db"] = args.db
        if args.dry_run:  # the dry run checks tgc's own results: no graph handed back to eager
            options["compare_eager"] = False
        model.forward = torch.compile(forward, backend="tgc", options=options)
    elif mode == "default":
        model.forward = torch.compile(forward)
    elif mode == "reduce-overhead":
        model.forward = _fresh_outputs(torch.compile(forward, mode="reduce-overhead"))
    else:
        raise ValueError(f"unknown mode {mode!r}")


def _fresh_outputs(compiled):
    """A CUDA-graph forward as generate() can use it: each call starts a new step of PyTorch's
    CUDA graphs and hands back copies of its tensors, which the next replay would overwrite
    (generate() read one after the next step: "accessing tensor output of CUDAGraphs that has
    been overwritten": bench/results/generate-*). tgc's backend copies its outputs the same way."""
    import torch

    def forward(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                out[key] = value.clone()
        return out

    return forward


def restore_forward(model) -> None:
    model.__dict__.pop("forward", None)  # the class's forward again


def reset_compilers() -> None:
    """Dynamo's caches and counters and tgc's tally empty: the next mode compiles afresh."""
    import torch

    from tgc.dynamo import reset_coverage

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    reset_coverage()


def dynamo_counts() -> tuple[int, int]:
    """Graphs Dynamo compiled, and its recompiles: counters['recompiles'] where this PyTorch
    keeps it, else frames compiled less unique graphs (test/test_dynamo_generate.py's count)."""
    import torch

    counters = torch._dynamo.utils.counters
    graphs = counters["stats"]["unique_graphs"]
    if counters["recompiles"]:
        return graphs, sum(counters["recompiles"].values())
    return graphs, counters["frames"]["ok"] - graphs


# -- the bandwidth floor ----------------------------------------------------------------------


def device_bandwidth(name: str) -> float | None:
    """Memory bandwidth (bytes/s) of the device named `name`, or None where not known."""
    for key, bandwidth in BANDWIDTH:
        if key in name:
            return bandwidth
    return None


def decode_step_bytes(model, batch: int, prompt: int, new_tokens: int) -> float:
    """Bytes one decode step must read, averaged over the N - 1 decode steps: every weight
    once (the input embedding table but `batch` rows of it, unless the LM head is that same
    table) and the KV cache up to the current length (step i of N - 1 attends over
    prompt + i positions: prompt + N/2 on average)."""
    config = model.config
    weights = 0
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    for p in model.parameters():  # a tied (shared) parameter once
        if p is embedding and not tied:
            weights += batch * p.shape[1] * p.element_size()
        else:
            weights += p.numel() * p.element_size()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    per_position = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * element
    return weights + batch * per_position * (prompt + new_tokens / 2)


# -- one mode ---------------------------------------------------------------------------------


def timed(call, sync) -> tuple[float, object]:
    """Wall seconds of `call()`, the device synchronised before and after; and its result."""
    sync()
    start = time.perf_counter()
    out = call()
    sync()
    return time.perf_counter() - start, out


def run_mode(row: Row, model, ids, args, reference, sync) -> object:
    """`row` measured (module doc); the tokens its mode generated (None if it failed).
    `reference`: eager's generated tokens, or None."""
    prompt, new, reps = args.prompt, args.new_tokens, args.reps
    cache_len, auto = prompt + new, row.mode == "hf-compile"
    reset_compilers()
    tgc_mode = row.mode in ("tgc", "tgc-no-whole-graphs")
    log = keep_tgc_log(args, f"{row.mode}-b{row.batch}") if args.profile and tgc_mode else None
    try:
        row.running = "compile"
        compile_forward(model, row.mode, args)
        row.running = "first call"

        def first():
            return generate(model, ids, new, cache_len, auto)

        if args.profile_first_call:  # its time then includes cProfile's own
            name = f"first-call-{row.mode}-b{row.batch}"
            first = profiled(first, Path(args.profile_first_call), name)
        row.first_s, _ = timed(first, sync)
        row.running = "warm-up"
        for _ in range(WARM_PREFILLS):
            generate(model, ids, 1, cache_len, auto)
        row.running = "time to first token"
        ttft = [
            timed(lambda: generate(model, ids, 1, cache_len, auto), sync)[0] for _ in range(reps)
        ]
        row.running = f"generate() of {new} tokens"
        totals, out = [], None
        for _ in range(reps):
            seconds, out = timed(lambda: generate(model, ids, new, cache_len, auto), sync)
            totals.append(seconds)
        row.ttft_ms = statistics.median(ttft) * 1e3
        row.total_ms = statistics.median(totals) * 1e3
        decode_ms = row.total_ms - row.ttft_ms
        if new > 1 and decode_ms > 0:
            row.step_ms = decode_ms / (new - 1)
            row.tokens_per_s = row.batch * (new - 1) / (decode_ms / 1e3)
        if new > 1 and not args.dry_run:
            row.running = "device time"
            row.gpu_step_ms = gpu_step_ms(model, ids, args, f"{row.mode}-b{row.batch}", auto)
        if args.profile:
            row.running = "profile"
            profile_generate(model, ids, args, f"{row.mode}-b{row.batch}", auto)
        tokens = out[:, prompt:].cpu()
        if reference is not None:
            agree(row, tokens, reference)
        if row.mode != "eager":
            row.dynamo_graphs, row.dynamo_recompiles = dynamo_counts()
        if row.mode in ("reduce-overhead", "hf-compile"):  # Inductor runs what it cannot capture
            import torch

            skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
            if skips:
                row.note = f"CUDA graphs skipped for {skips} graph(s) (TORCH_LOGS=perf_hints: why)"
        if row.mode in ("tgc", "tgc-no-whole-graphs"):
            from tgc.dynamo import coverage

            tally = coverage()
            row.tgc_graphs, row.tgc_graphs_in_tgc = tally.graphs, tally.graphs_in_tgc
            if tally.graphs_in_tgc < tally.graphs:
                row.note = (
                    f"{tally.graphs - tally.graphs_in_tgc} of {tally.graphs} compiled graphs ran "
                    "eagerly (the tgc logger says why)"
                )
        row.running = ""
        return tokens
    except Exception as e:  # noqa: BLE001  (whatever a mode raises, out of memory included)
        row.note = f"{row.running} failed: {one_line(e)}" + (f"; {row.note}" if row.note else "")
        row.running = ""
        return None
    finally:
        restore_forward(model)
        reset_compilers()
        gc.collect()
        if log is not None:
            logging.getLogger("tgc").removeHandler(log)
            log.close()


def keep_tgc_log(args, name: str):
    """With `--profile DIR`, the tgc logger's lines at INFO (each graph's compile: the route's
    planning and measuring times, the whole plans it compared; fallbacks) written to
    DIR/tgc-log-<mode>-b<batch>.txt: where a first call's time went. The handler, to remove."""
    folder = Path(args.profile)
    folder.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(folder / f"tgc-log-{name}.txt")
    handler.setFormatter(logging.Formatter("%(relativeCreated).0f ms %(message)s"))
    logger = logging.getLogger("tgc")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return handler


def device_ms(call):
    """(the device's time in `call()`: its kernels' and copies' durations added up, the
    profiler's averages by kernel) from torch.profiler's CUDA activity, which sees the kernels
    a CUDA graph replay runs too."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
    averages = prof.key_averages()
    return sum(e.self_device_time_total for e in averages) / 1e3, averages


def gpu_step_ms(model, ids, args, name: str, auto_compile: bool) -> float:
    """A decode step's device time: (device time of generate() of `new_tokens` - that of one
    token, the prefill) / (`new_tokens` - 1); beside the bandwidth floor it says how near the
    step's kernels come to it, whatever the host adds (at batch 1 most of a step's time). With
    `--profile DIR`, the kernels of the generate() of N tokens by device time go to
    DIR/kernels-<mode>-b<batch>.txt: which of a step's kernels keep it from its floor."""
    new_tokens, cache_len = args.new_tokens, args.prompt + args.new_tokens
    one, _ = device_ms(lambda: generate(model, ids, 1, cache_len, auto_compile))
    all_, averages = device_ms(lambda: generate(model, ids, new_tokens, cache_len, auto_compile))
    if args.profile:
        title = f"{name}: the kernels of one generate() of {new_tokens} tokens (torch.profiler)"
        write_kernel_table(averages, Path(args.profile) / f"kernels-{name}.txt", title)
    return (all_ - one) / (new_tokens - 1)


def write_kernel_table(averages, path: Path, title: str, rows: int = 40) -> None:
    """torch.profiler's averages (device_ms's) by device time, `rows` kernels, to `path`."""
    table = averages.table(
        sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=100
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {title}\n\n{table}\n")


def profiled(call, folder: Path, name: str):
    """`call` run under cProfile, where the host's time went by own and by cumulative time
    written to folder/profile-<name>.txt."""
    import cProfile
    import io
    import pstats

    def run():
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            return call()
        finally:
            profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            for order in ("tottime", "cumulative"):
                stats.sort_stats(order).print_stats(60)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"profile-{name}.txt").write_text(text.getvalue())

    return run


def profile_generate(model, ids, args, name: str, auto_compile: bool) -> None:
    """Two more generate() calls under cProfile (`--profile DIR`): one of `--new-tokens`, one of
    a single token (the prefill, TTFT), where the host's time goes by own and by cumulative time,
    to DIR/profile-generate-<mode>-b<batch>.txt and DIR/profile-ttft-<mode>-b<batch>.txt. At
    batch 1 every mode's decode step is host-bound (bench/results/generate-*)."""
    for what, tokens in (("generate", args.new_tokens), ("ttft", 1)):

        def call(tokens=tokens):
            return generate(model, ids, tokens, args.prompt + args.new_tokens, auto_compile)

        profiled(call, Path(args.profile), f"{what}-{name}")()


def run_isolated(row: Row, args, reference: Path | None, work: Path) -> Path | None:
    """`row` measured in a process of its own (`--isolate`, module doc): this script on the row's
    batch and mode alone, its row and tokens written under `work`. A process that dies (a
    segmentation fault inside a compiler) leaves the row failed with a note saying so, and the
    run goes on. The file of the tokens it generated, or None. `reference`: eager's."""
    out = work / f"b{row.batch}-{row.mode}"
    command = [sys.executable, str(Path(__file__).resolve()), *child_flags(args)]
    command += ["--batches", str(row.batch), "--modes", row.mode, "--child", str(out)]
    if reference is not None:
        command += ["--reference", str(reference)]
    process = spawn(command)
    try:
        code = process.wait()
    except CutOff:  # our timeout: the child's row is lost with it, its process ended first
        process.terminate()
        process.wait()
        raise
    result = out.with_suffix(".json")
    if result.exists():
        for key, value in json.loads(result.read_text()).items():
            setattr(row, key, value)
    if code != 0 and row.failed:
        died = f"the process died of {signal.Signals(-code).name}" if code < 0 else ""
        ended = died or f"the process exited with {code}"
        row.note = f"{row.note}; {ended}" if row.note else ended
    tokens = out.with_suffix(".pt")
    return tokens if tokens.exists() and not row.failed else None


def spawn(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command)


def child_flags(args) -> list[str]:
    """The flags that make a child process measure what `args` asks (its batch and mode aside)."""
    flags = ["--dry-run"] if args.dry_run else []
    flags += ["--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
    flags += ["--dtype", args.dtype, "--reps", str(args.reps), "--commit", commit_of(args.commit)]
    for name, value in asdict(args.size).items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    options = (("--measure-budget", args.measure_budget), ("--db", args.db))
    profiles = (("--profile", args.profile), ("--profile-first-call", args.profile_first_call))
    for flag, value in (*options, *profiles):
        if value is not None:
            flags += [flag, str(value)]
    return flags


def run_child(args) -> int:
    """`--child PATH`: the one batch and mode of `args` measured here, the row written to
    PATH.json and the generated tokens to PATH.pt (the parent's run_isolated reads them)."""
    import torch

    (batch,), (mode,) = args.batches, args.modes
    device = "cpu" if args.dry_run else "cuda"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = build_model(args.size, args.prompt + args.new_tokens, torch_dtype(args.dtype), device)
    ids = prompt_ids(batch, args.prompt, args.size.vocab, device)
    reference = torch.load(args.reference) if args.reference else None
    row = Row(batch, mode)
    tokens = run_mode(row, model, ids, args, reference, sync)
    out = Path(args.child)
    if tokens is not None:
        torch.save(tokens, out.with_suffix(".pt"))
    fields = ("floor_ms", "batch", "mode")  # the parent's
    values = {k: v for k, v in asdict(row).items() if k not in fields}
    out.with_suffix(".json").write_text(json.dumps(values))
    return 0 if tokens is not None else 1


def agree(row: Row, tokens, reference) -> None:
    same = tokens == reference
    row.agree = same.float().mean().item()
    row.agree_tokens = f"{int(same.sum())}/{same.numel()}"
    differ = (~same).any(dim=0).nonzero()
    row.first_difference = int(differ[0]) if len(differ) else None


# -- the report -------------------------------------------------------------------------------


def versions() -> str:
    parts = [f"python {sys.version.split()[0]}"]
    for module in ("torch", "transformers", "triton"):
        try:
            parts.append(f"{module} {importlib.metadata.version(module)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{module} absent")
    return ", ".join(parts)


def _bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _params(count: int) -> str:
    return f"{count / 1e9:.3f} B" if count >= 1e9 else f"{count / 1e6:.2f} M"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def _cells(r: dict) -> list[str]:
    first = "-" if r["first_s"] is None else f"{r['first_s']:.2f} s"
    floor = r["floor_ms"]
    ratio = "-" if floor is None or r["step_ms"] is None else f"{r['step_ms'] / floor:.1f}x"
    tps = "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.0f}"
    gpu = r.get("gpu_step_ms")  # older runs have none
    on_device = (
        "-" if gpu is None else f"{gpu:.3f} ms" + (f" ({gpu / floor:.1f}x)" if floor else "")
    )
    if r["mode"] == "eager":
        agreement = "(the reference)"
    elif r["agree"] is None:
        agreement = "-"
    else:
        agreement = f"{r['agree']:.1%} ({r['agree_tokens']})"
        if r["first_difference"] is not None:
            agreement += f", first differs at token {r['first_difference']}"
    graphs = "-"
    if r["dynamo_graphs"] is not None:
        graphs = f"{r['dynamo_graphs']} / {r['dynamo_recompiles']}"
    in_tgc = "-"
    if r["tgc_graphs"] is not None:
        in_tgc = f"{r['tgc_graphs_in_tgc']} of {r['tgc_graphs']}"
    note = r["note"].replace("|", "/")
    if r["running"]:
        note = f"cut off during {r['running']}; {note}"
    return [
        str(r["batch"]),
        r["mode"],
        first,
        _ms(r["ttft_ms"]),
        _ms(r["total_ms"]),
        _ms(r["step_ms"]),
        _ms(floor),
        ratio,
        on_device,
        tps,
        agreement,
        graphs,
        in_tgc,
        note,
    ]


def table(rows: list[dict], new_tokens: int) -> list[str]:
    head = [
        "batch",
        "mode",
        "first call (compile included)",
        "TTFT",
        f"generate {new_tokens} tokens",
        "ms / decode step",
        "floor / step",
        "x floor",
        "GPU ms / step (x floor)",
        "decode tokens/s",
        "tokens = eager",
        "Dynamo graphs / recompiles",
        "tgc graphs in tgc",
        "note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return lines


def run_report(run: dict, index: int) -> list[str]:
    c = run["config"]
    floor = (
        f"{run['bandwidth']:.3g} B/s ({run['bandwidth_source']})"
        if run["bandwidth"]
        else "not known for this device (--bandwidth): no floor"
    )
    bytes_text = ", ".join(f"batch {b}: {_bytes(v)}" for b, v in run["step_bytes"].items())
    return [
        f"## Run {index}: {run['time']}, commit {run['commit']}",
        "",
        f"- device: {run['device']}; date: {run['date']}; commit: {run['commit']}",
        f"- versions: {run['versions']}",
        f"- command: `bench/generate.py {' '.join(run['argv'])}`",
        f"- model: transformers LlamaForCausalLM from LlamaConfig, random weights (seed {SEED}): "
        f"{c['layers']} layers, hidden {c['hidden']}, {c['heads']} query / {c['kv_heads']} "
        f"key-value heads, intermediate {c['intermediate']}, vocabulary {c['vocab']}, RoPE, "
        f"untied embeddings; {_params(run['params'])} parameters, {run['dtype']} on "
        f"{run['device_kind']}",
        f"- workload: prompts of {run['prompt']} random tokens (seed {PROMPT_SEED}), greedy, "
        f"exactly {run['new_tokens']} new tokens (eos_token_id=None), a fresh StaticCache of "
        f"{run['prompt'] + run['new_tokens']} positions per generate(), disable_compile=True; "
        "Dynamo reset before each mode",
        f"- method: per mode, one warm-up generate() (*first call*, compile included) and "
        f"{run.get('warm_prefills', 0)} untimed ones of 1 token, then "
        f"medians of {run['reps']}: *TTFT* = generate() of 1 new token, the whole generate() of "
        f"{run['new_tokens']}; host timers with the device synchronised around each call; "
        f"ms / decode step = (total - TTFT) / {run['new_tokens'] - 1}; decode tokens/s = batch x "
        f"{run['new_tokens'] - 1} / (total - TTFT)",
        f"- floor: bytes a decode step reads (weights once, the input embedding table but its "
        f"batch rows; the KV cache up to the current length, prompt + N/2 positions on average; "
        f"{bytes_text}) over the memory bandwidth {floor}",
        "- GPU ms / step: the device's own time a decode step, kernels and copies added up "
        "(torch.profiler's CUDA activity over one more generate() of N tokens and one of 1, "
        "the difference over N - 1); no host time",
        "- tokens = eager: fraction of the generated tokens equal to eager's, and the first new "
        "token (0-based) where a sequence differs; Dynamo graphs / recompiles from its counters; "
        "tgc graphs in tgc: the backend's tally (each graph, per shape)",
        "",
        *table(run["rows"], run["new_tokens"]),
        "",
    ]


def report(runs: list[dict], title: str) -> str:
    lines = [f"# {title}", ""]
    for index, run in enumerate(runs, start=1):
        lines += run_report(run, index)
    return "\n".join(lines)


class Store:
    """The runs of one results file: the .json (a list of runs) and the .md made from it. A new
    run is appended to what the file holds; `save()` rewrites both (a missing base: no files)."""

    def __init__(self, base: Path | None, title: str) -> None:
        self.base, self.title = base, title
        self.runs: list[dict] = []
        json_path = base.with_suffix(".json") if base else None
        if json_path and json_path.exists():
            self.runs = json.loads(json_path.read_text())["runs"]

    def save(self, run: dict) -> None:
        if run not in self.runs:
            self.runs.append(run)
        if self.base is None:
            return
        self.base.parent.mkdir(parents=True, exist_ok=True)
        self.base.with_suffix(".json").write_text(json.dumps({"runs": self.runs}, indent=1) + "\n")
        self.base.with_suffix(".md").write_text(report(self.runs, self.title) + "\n")


# -- main -------------------------------------------------------------------------------------


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="no GPU: a tiny Llama, f32, CPU")
    ap.add_argument("--batches", default=None, help="comma-separated (default 1)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens (512; dry run 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="new tokens (128; dry run 4)")
    ap.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated, run in this order (default {','.join(MODES)}; dry run "
        f"{','.join(DRY_MODES)})",
    )
    for name, gpu in vars(GPU_SIZE).items():  # --layers, --hidden, ..., --kv-heads
        dry = getattr(DRY_SIZE, name)
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, type=int, default=None, help=f"{gpu} (dry run {dry})")
    ap.add_argument("--dtype", default=None, choices=DTYPES, help="bf16 (dry run f32)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per median (3)")
    ap.add_argument(
        "--bandwidth", type=float, default=None, help="memory bandwidth, B/s (default by device)"
    )
    ap.add_argument(
        "--measure-budget", type=float, default=None, help="tgc's option, seconds (its default 30)"
    )
    ap.add_argument("--db", default=None, help="tgc's measurement database (its default)")
    ap.add_argument(
        "--profile",
        default=None,
        help="folder: cProfile of one more generate() and TTFT per mode, the kernels by device "
        "time, and tgc's log",
    )
    ap.add_argument(
        "--profile-first-call",
        default=None,
        help="folder: cProfile of each mode's first call (compile included; its time then "
        "includes cProfile's)",
    )
    ap.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each mode in a process of its own (default on the GPU; off in a dry run)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # run_isolated's
    ap.add_argument("--reference", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--commit", default=None, help="commit to report (default: git's HEAD)")
    ap.add_argument(
        "--out", default=None, help="report folder (default bench/results; dry run: none)"
    )
    args = ap.parse_args(argv)
    batches, prompt, new, dtype = DRY_WORKLOAD if args.dry_run else GPU_WORKLOAD
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b] if args.batches else batches
    except ValueError:
        ap.error(f"--batches takes comma-separated integers, not {args.batches!r}")
    args.prompt = args.prompt or prompt
    args.new_tokens = args.new_tokens or new
    args.dtype = args.dtype or dtype
    if args.isolate is None:
        args.isolate = not args.dry_run and not args.child
    given = args.modes or ",".join(DRY_MODES if args.dry_run else MODES)
    args.modes = [m for m in given.split(",") if m]
    unknown = sorted(set(args.modes) - set(MODES) - set(EXTRA_MODES))
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; known: {list(MODES)}")
    base = DRY_SIZE if args.dry_run else GPU_SIZE
    args.size = Size(**{k: getattr(args, k) or v for k, v in vars(base).items()})
    if min(args.batches + [args.prompt, args.new_tokens, args.reps]) < 1:
        ap.error("--batches, --prompt, --new-tokens and --reps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    def run(args) -> int:
        return run_child(args) if args.child else measure(args, argv)

    if not args.dry_run:
        return run(args)
    # one thread: on a shared CPU PyTorch's pool waits for busy cores (at load 3 on 2 cores a
    # 2 ms generate() took 240 ms with two threads, every call); the caller's count restored
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def measure(args, argv: list[str] | None) -> int:
    import torch

    if args.dry_run:
        device, device_name, sync = "cpu", "cpu (dry run)", lambda: None
    else:
        if not torch.cuda.is_available():
            print("no GPU: bench/generate.py --dry-run runs on the CPU", file=sys.stderr)
            return 2
        device, device_name, sync = "cuda", torch.cuda.get_device_name(), torch.cuda.synchronize
    bandwidth, source = args.bandwidth, "--bandwidth"
    if bandwidth is None and not args.dry_run:
        bandwidth, source = device_bandwidth(device_name), "by device name"
    today = datetime.date.today().isoformat()
    if args.dry_run:
        base = Path(args.out) / f"generate-dry-run-{today}" if args.out else None
        title = f"generate() with a static KV cache, dry run (no GPU): {today}"
    else:
        slug = device_name.replace(" ", "-").replace("/", "-")
        base = Path(args.out or ROOT / "bench" / "results") / f"generate-{slug}-{today}"
        title = f"generate() with a static KV cache: {device_name}, {today}"
    store = Store(base, title)

    t0 = time.time()
    # isolated, the parent only counts: the children build the model where it runs
    where = "meta" if args.isolate else device
    model = build_model(args.size, args.prompt + args.new_tokens, torch_dtype(args.dtype), where)
    params = sum(p.numel() for p in model.parameters())
    print(f"built {params / 1e6:.1f} M parameters in {time.time() - t0:.1f} s", flush=True)
    step_bytes = {
        str(b): decode_step_bytes(model, b, args.prompt, args.new_tokens) for b in args.batches
    }
    run = {
        "device": device_name,
        "device_kind": device,
        "date": today,
        "time": datetime.datetime.now().strftime("%H:%M"),
        "commit": commit_of(args.commit),
        "versions": versions(),
        "argv": list(sys.argv[1:] if argv is None else argv),
        "config": asdict(args.size),
        "params": params,
        "dtype": args.dtype,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "warm_prefills": WARM_PREFILLS,
        "bandwidth": bandwidth,
        "bandwidth_source": source,
        "step_bytes": step_bytes,
        "rows": [],
    }

    import signal

    def cut_off(signum, frame):
        raise CutOff

    if not args.dry_run:
        signal.signal(signal.SIGTERM, cut_off)
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="tgc-generate-")) if args.isolate else None
    for batch in args.batches:
        ids = None if args.isolate else prompt_ids(batch, args.prompt, args.size.vocab, device)
        reference = None
        floor_ms = step_bytes[str(batch)] / bandwidth * 1e3 if bandwidth else None
        for mode in args.modes:
            row = Row(batch, mode, floor_ms=floor_ms)
            rows.append(row)
            t0 = time.time()
            try:
                if args.isolate:
                    tokens = run_isolated(row, args, reference, work)
                else:
                    tokens = run_mode(row, model, ids, args, reference, sync)
            except CutOff:
                row.note = "cut off by SIGTERM (its timeout)" + (
                    f"; {row.note}" if row.note else ""
                )
                run["rows"] = [asdict(r) for r in rows]
                store.save(run)
                print(f"cut off during batch {batch} {mode} ({row.running})", flush=True)
                return 124
            if mode == "eager" and tokens is not None:
                reference = tokens
            if device == "cuda" and not args.isolate:
                torch.cuda.empty_cache()
            print(f"batch {batch} {mode}: {time.time() - t0:.1f} s; {summary(row)}", flush=True)
            run["rows"] = [asdict(r) for r in rows]
            store.save(run)
    print()
    print("\n".join(run_report(run, len(store.runs))))
    if base is not None:
        print(f"wrote {base.with_suffix('.md')}")
    return check(rows, args.dry_run)


def summary(row: Row) -> str:
    if row.failed:
        return row.note
    step = "-" if row.step_ms is None else f"{row.step_ms:.3f} ms"
    return (
        f"first call {row.first_s:.1f} s, TTFT {row.ttft_ms:.2f} ms, total {row.total_ms:.2f} ms, "
        f"decode step {step}, tokens = eager {row.agree_tokens or '-'} {row.note}"
    ).strip()


def check(rows: list[Row], dry: bool) -> int:
    """0 when every mode ran; in a dry run also tgc's tokens exactly eager's and every graph tgc
    compiled run in tgc (else a fallback to eager would pass the token check)."""
    failed = [f"batch {r.batch} {r.mode}: {r.note}" for r in rows if r.failed]
    if dry:
        for r in rows:
            if r.mode != "tgc" or r.failed:
                continue
            if r.agree is None:
                failed.append(f"batch {r.batch} tgc: no eager tokens to check against")
            elif r.agree != 1.0:
                failed.append(f"batch {r.batch} tgc: tokens differ from eager's ({r.agree:.1%})")
            if not r.tgc_graphs or r.tgc_graphs_in_tgc != r.tgc_graphs:
                failed.append(
                    f"batch {r.batch} tgc: {r.tgc_graphs_in_tgc} of {r.tgc_graphs} graphs in tgc"
                )
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

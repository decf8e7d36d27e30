"""One decode step of a Llama with a static KV cache, called back to back: tgc beside eager,
torch.compile's default and (asked for) reduce-overhead, without generate()'s loop around it.
bench/generate.py measures the whole generate(); this isolates the step, in a minute where a
generate() run takes ten, so that a change to the step's kernels can be judged quickly. On the
GPU machine, from the repository root:

    python3 bench/decode_step.py --commit <hash> [--batch 1] [--prompt 512] [--modes ...]
        [--layers 16] [--kernels DIR] [--out DIR]
    python3 bench/decode_step.py --dry-run    # no GPU: a tiny Llama, float32, on the CPU

The model is bench/generate.py's (random weights from LlamaConfig, 1.1 B parameters by default,
bf16). Per mode: a fresh StaticCache filled by an eager prefill of `--prompt` random tokens,
then the decode step (`model.forward` of one token a sequence at the next position, its keys and
values written into the cache in place, the position one further each call) compiled as
bench/generate.py compiles it and called `--warmup` times (tgc's first call plans and measures),
then `--calls` times back to back, `--rounds` times: *step* = the median round's wall time over
its calls, the device synchronised before and after (the host's part included, as in a decode
loop with nothing else), with the fastest and slowest rounds beside it when they differ by more
than 2% (a mode timed first in a process once ran 26% slower than the same plan after another
mode: bench/results/decode_step-merged-*); *device* = torch.profiler's kernel and copy time over
`--calls` more calls, divided by them, and how many kernels and copies that was a step (a
replayed graph's nodes). Beside them the *floor*: the bytes the step must read (every weight
once, the embedding table but a row a sequence, the cache up to the timed calls' middle
position) over the device's bandwidth (bench/generate.py's table). Each mode's logits are
checked against eager's (max |difference| / max |eager|). The modes of `TGC_VARIANTS` are tgc
with one of its choices undone, to measure it in the same run: `tgc-plain-launch`, none of its
kernels launched as a programmatic dependent of the one before (runtime/driver_kernel.py);
`tgc-unmerged`, no small sibling kernels merged into one launch (planner/horizontal.py);
`tgc-unhalved`, no product offered with SiLU(gate) * up of its halves as its epilogue
(planner/backends/cuda_kernels.py `HALVES_MAX_ROWS`).
`--kernels DIR` writes each mode's kernels by device time (DIR/decode-kernels-<mode>.txt).
Writes <out>/decode_step-<device>-<date>.md (a new section a run) unless it is a dry run without
`--out`. The dry run exits non-zero unless tgc's logits match eager's within 1e-4 and every
graph tgc compiled ran in tgc.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as gen  # noqa: E402

from tgc.planner.options import forget_shared_options  # noqa: E402

MODES = ("eager", "tgc", "default")
# tgc with one of its choices undone (module doc): mode -> (module, name, value) set while the
# mode runs
TGC_VARIANTS = {
    "tgc-plain-launch": ("tgc.runtime.driver_kernel", "dependent_launches", False),
    "tgc-unmerged": ("tgc.planner.horizontal", "MAX_ELEMENTS", 0),
    "tgc-unhalved": ("tgc.planner.backends.cuda_kernels", "HALVES_MAX_ROWS", 0),
}
DRY_TOLERANCE = 1e-4  # float32 tgc against float32 eager, relative to max |eager|


def fill_cache(model, args, device: str):
    """(a StaticCache with room for every call, its first `--prompt` positions filled by an
    eager prefill of random tokens; the next token's ids; its position, a tensor the calls
    advance)."""
    import torch

    ids = gen.prompt_ids(args.batch, args.prompt + 1, model.config.vocab_size, device)
    kv = gen.static_cache(model, cache_length(args))["past_key_values"]
    with torch.no_grad():
        model(
            input_ids=ids[:, :-1],
            past_key_values=kv,
            cache_position=torch.arange(args.prompt, device=device),
        )
    return kv, ids[:, -1:], torch.tensor([args.prompt], device=device)  # fmt: skip


def cache_length(args) -> int:
    """The prompt, every call's position (warm-up, timed rounds, profiled) and one to spare."""
    return args.prompt + args.warmup + (args.rounds + 1) * args.calls + 1


def last_position(args) -> int:
    """The last position a mode's calls write: warm-up and timed calls, and on the GPU the
    profiled ones."""
    return args.prompt + args.warmup + args.calls * (args.rounds + (not args.dry_run)) - 1


def step_of(model, kv, token, position):
    """The decode step: logits of one token a sequence at `position`, its keys and values
    written into the cache in place; `position` one further after each call."""
    import torch

    def step():
        with torch.no_grad():
            logits = model(input_ids=token, past_key_values=kv, cache_position=position).logits
            position.add_(1)
        return logits

    return step


def time_mode(model, mode: str, args, device: str) -> dict:
    """The row of `mode` (module doc); its logits under "logits"."""
    import torch

    gen.reset_compilers()
    kv, token, position = fill_cache(model, args, device)
    options = argparse.Namespace(
        measure_budget=args.measure_budget, db=args.db, dry_run=args.dry_run
    )
    variant = TGC_VARIANTS.get(mode)
    if variant:
        module, name, value = importlib.import_module(variant[0]), variant[1], variant[2]
        kept = getattr(module, name)
        setattr(module, name, value)
        # the options a block was found to have are kept for its copies: found before, they
        # would hide the variant (in one process, tgc-unhalved then tgc ran the same plan)
        forget_shared_options()
    gen.compile_forward(model, "tgc" if variant else mode, options)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    try:
        step = step_of(model, kv, token, position)
        start = time.perf_counter()
        for _ in range(args.warmup):
            logits = step()
        sync()
        row = {"mode": mode, "first_s": time.perf_counter() - start, "logits": logits.float().cpu()}
        rounds = []
        for _ in range(args.rounds):
            gc.collect()  # not the previous round's garbage, collected inside this one
            start = time.perf_counter()
            for _ in range(args.calls):
                step()
            sync()
            rounds.append((time.perf_counter() - start) / args.calls * 1e3)
        row["step_ms"], row["rounds_ms"] = statistics.median(rounds), rounds
        if device == "cuda":
            total, averages = gen.device_ms(lambda: [step() for _ in range(args.calls)])
            row["device_ms"] = total / args.calls
            # kernels and copies the device ran (a replayed graph's nodes): each costs a launch
            # gap on the device and a share of the graph's launch on the host
            work = sum(e.count for e in averages if e.self_device_time_total > 0)
            row["device_work"] = work / args.calls
            if args.kernels:
                path = Path(args.kernels) / f"decode-kernels-{mode}.txt"
                title = f"{mode}: the kernels of {args.calls} decode steps (torch.profiler)"
                gen.write_kernel_table(averages, path, title, rows=50)
        if mode == "tgc" or variant:
            from tgc.dynamo import coverage

            tally = coverage()
            row["in_tgc"] = f"{tally.graphs_in_tgc} of {tally.graphs}"
        return row
    finally:
        gen.restore_forward(model)
        gen.reset_compilers()
        if variant:
            setattr(module, name, kept)
            forget_shared_options()


def error(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


def report(rows: list[dict], args, device_name: str, floor_ms: float | None) -> list[str]:
    lines = [
        f"## {datetime.datetime.now():%H:%M}, commit {args.commit}",
        "",
        f"- device: {device_name}; batch {args.batch}; prompt {args.prompt}, the step at positions "
        f"{args.prompt} to {last_position(args)}; "
        f"{args.layers or 'default'} layers; {args.dtype}; "
        f"{args.rounds} rounds of {args.calls} calls timed, {args.warmup} before; command: `bench/decode_step.py {' '.join(sys.argv[1:])}`",
        "",
        "| mode | step (wall, back to back) | device / step | kernels and copies / step | floor | "
        "step / floor | first calls | logits vs eager | graphs in tgc |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "note" in r:
            lines.append(f"| {r['mode']} | failed: {r['note']} | | | | | | | |")
            continue
        device = f"{r['device_ms']:.3f} ms" if "device_ms" in r else "-"
        work = f"{r['device_work']:.0f}" if "device_work" in r else "-"
        floor = f"{floor_ms:.3f} ms" if floor_ms else "-"
        ratio = f"{r['step_ms'] / floor_ms:.1f}x" if floor_ms else "-"
        step = f"{r['step_ms']:.3f} ms{spread(r['rounds_ms'])}"
        lines.append(
            f"| {r['mode']} | {step} | {device} | {work} | {floor} | {ratio} | "
            f"{r['first_s']:.1f} s | {r.get('error', 0.0):.1e} | {r.get('in_tgc', '-')} |"
        )
    return lines


def spread(rounds: list[float]) -> str:
    """The fastest and slowest rounds, where they are more than 2% apart."""
    low, high = min(rounds), max(rounds)
    return f" ({low:.3f}-{high:.3f})" if high > 1.02 * low else ""


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=512, help="positions filled before the step")
    ap.add_argument("--modes", default=None, help=f"comma-separated (default {','.join(MODES)})")
    ap.add_argument("--layers", type=int, default=None, help="the model's layers (default 16)")
    ap.add_argument("--dtype", choices=gen.DTYPES, default=None)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of --calls (the median)")
    ap.add_argument("--measure-budget", type=float, default=None, help="tgc's option, seconds")
    ap.add_argument("--db", default=None, help="tgc's measurement database (its default)")
    ap.add_argument("--kernels", default=None, help="folder: each mode's kernels by device time")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true", help="a tiny Llama, float32, on the CPU")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    if dry:
        torch.set_num_threads(1)
        args.prompt, args.warmup, args.calls = min(args.prompt, 8), min(args.warmup, 6), 3
    args.dtype = args.dtype or ("f32" if dry else "bf16")
    size = gen.DRY_SIZE if dry else gen.GPU_SIZE
    if args.layers:
        size = gen.Size(**{**vars(size), "layers": args.layers})
    model = gen.build_model(size, cache_length(args), gen.torch_dtype(args.dtype), device)
    modes = args.modes.split(",") if args.modes else (["eager", "tgc"] if dry else list(MODES))
    if modes[0] != "eager":
        modes.insert(0, "eager")  # the logits' reference
    rows = []
    for mode in modes:
        try:
            rows.append(time_mode(model, mode, args, device))
        except Exception as e:  # noqa: BLE001  (a mode that fails is a row saying why)
            rows.append({"mode": mode, "note": gen.one_line(e)})
        print(rows[-1].get("note") or f"{mode}: {rows[-1]['step_ms']:.3f} ms a step", flush=True)
    reference = rows[0]["logits"]
    for r in rows:
        if "logits" in r:
            r["error"] = error(r["logits"], reference)
    bandwidth = None if dry else gen.device_bandwidth(torch.cuda.get_device_name())
    floor_ms = None
    if bandwidth:
        middle = args.prompt + args.warmup + args.calls // 2  # the timed calls' middle position
        floor_ms = gen.decode_step_bytes(model, args.batch, middle, 0) / bandwidth * 1e3
    name = "CPU (dry run)" if dry else torch.cuda.get_device_name()
    lines = report(rows, args, name, floor_ms)
    print("\n".join(lines))
    if args.out or not dry:
        out = Path(args.out or Path(__file__).resolve().parent / "results")
        out.mkdir(parents=True, exist_ok=True)
        slug = "dry-run" if dry else name.replace(" ", "-")
        path = out / f"decode_step-{slug}-{datetime.date.today().isoformat()}.md"
        head = "" if path.exists() else f"# One decode step, back to back: {name}\n\n"
        with path.open("a") as f:
            f.write(head + "\n".join(lines) + "\n\n")
        print(f"wrote {path}")
    if dry:
        tgc = next((r for r in rows if r["mode"] == "tgc"), None)
        ok = tgc is not None and "note" not in tgc and tgc["error"] <= DRY_TOLERANCE
        ok = ok and tgc["in_tgc"].split(" of ")[0] == tgc["in_tgc"].split(" of ")[1]
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

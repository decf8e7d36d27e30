"""Planning speed of the GPU route (planner/route.py) on a model's second compile, without a GPU.

    python bench/plan_route_speed.py [--model gpt2] [--tiny] [--batch N] [--seq N]
        [--repeat 3] [--texts FILE] [--profile FILE] [--out bench/results | --no-out] [--commit HASH]

Issue 22 asks that a second run of a 12-layer model plan from the measurement database, nothing
left to measure, in under 2 s. This bench times that run step by step on the CPU:

- the model is built by transformers from its config with random weights (bench/real_models.py's
  builders: GPT-2 small unless `--model` / `--tiny` say otherwise), cast to bf16, exported with
  `torch.export` at batch x seq tokens and imported with tgc's torch importer;
- the device is the stand-in of test/test_route.py: the cuda backend's planner side registered
  with a backend and a memory space that run nothing, `FINGERPRINTS["cuda"]` patched, the torch
  family left out (its torch-cuda kernels need a GPU). Its kernels are matched and costed as on
  the GPU; nothing is run;
- the database holds a record of every kernel instance the route's plans could use (times from
  the GPU roofline scaled by a seeded factor in 0.5-2, as if measured), so a compile measures
  nothing and what is timed is planning.

The steps, as `compile_module` runs them (module doc of planner/route.py): `lower`
(lower-for-planning), `prepare` (the signature moved to the device, canonical form), `instances`
(the instance list first use would measure, `route._instances`), `unknown` (which of them the
database lacks), then per candidate plan (`planned`, `library`, `default`) `plan_function`,
`materialise` and `finish` (mark_once, merge_siblings and the executor's `PlannedFunction`).
`route` is `compile_module` end to end with measuring on (it finds nothing to measure) and the
whole-plan check's timing left out (nothing runs on a stand-in): the sum of the steps plus the
route's own bookkeeping. Each is timed in a fresh process (`cold`: what a user's second
`tgc-run` pays; the caches of decompositions, region kernels and reference graphs start empty)
and again in the same process on fresh copies of the model (`warm`: best of `--repeat`;
bench/real_models.py's second compile runs so).

The report goes to bench/results/plan_route_speed-<model>-<date>.md with the commit, the machine
and the model (a later run of the same day is added to it); `--texts FILE` writes the candidate
plans' text (to compare two trees' plans), `--profile FILE` a cProfile of one cold compile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pickle
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

STEPS = ("lower", "prepare", "instances", "unknown")
PLAN_STEPS = ("plan_function", "materialise", "finish")
CANDIDATES = ("planned", "library", "default")
GOAL_S = 2.0  # issue 22: a 12-layer model's second run plans in under 2 s


# -- the stand-in device ---------------------------------------------------------------------------


class _Boxed:
    """A value in the stand-in's "cuda" space (nothing here runs a kernel on one)."""

    def __init__(self, array) -> None:
        self.array = array


def _no_region(op, inputs):
    raise RuntimeError("the stand-in device runs nothing (planning only)")


def stand_in() -> None:
    """The cuda backend's planner side on a stand-in device, as test/test_route.py registers
    it: kernels matched and costed as on a GPU, timings keyed to the stand-in's fingerprint, the
    torch family left out."""
    from tgc.planner import db, route
    from tgc.planner.backends import Backend, Space
    from tgc.planner.backends import cuda_kernels as ck

    space = Space("cuda", lambda v: v.array.copy(), lambda a, t: _Boxed(ck.host_array(a, t)))
    ck.register(Backend("cuda", run_region=_no_region), space)
    db.FINGERPRINTS["cuda"] = lambda: {"gpu": "stand-in"}
    db.device_info.cache_clear()
    route.FAMILIES = ("cuda",)


# -- the model -------------------------------------------------------------------------------------


def build_model(args) -> tuple[object, dict]:
    """The imported tgc module of the model, and what building it took."""
    import torch
    from real_models import SPECS, build, count_ops, export_and_import, token_ids, wrap

    spec = SPECS[args.model]
    t0 = time.perf_counter()
    model = build(spec, args.tiny, {}, torch.bfloat16)
    module = wrap(model, spec.output)
    ids = token_ids(model.config.vocab_size, args.batch, args.seq, seed=1)
    built = time.perf_counter() - t0
    _, imported, export_s, import_s = export_and_import(module, ids)
    info = {
        "model": spec.title if not args.tiny else f"{args.model} (tiny config)",
        "layers": model.config.num_hidden_layers,
        "tokens": f"{args.batch} x {args.seq}",
        "ops": count_ops(imported),
        "build_s": built,
        "export_s": export_s,
        "import_s": import_s,
    }
    return imported, info


def fresh(blob: bytes):
    """A copy of the imported module (lowering changes the module it lowers)."""
    return pickle.loads(blob)


def lowered(module):
    """`compile_module`'s steps 1-2 on `module`: its function, lowered, on the device, in
    canonical form."""
    from tgc.pass_manager import PassManager
    from tgc.planner import route
    from tgc.planner.select import prepare

    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    route.move_signature_to_device(func)
    prepare(func)
    return func


def fill_database(blob: bytes, path: str) -> int:
    """Record a time for every kernel instance the route's plans of the model could use."""
    from tgc.planner import load_backends, route
    from tgc.planner.cost import RooflineCostSource
    from tgc.planner.db import Database
    from tgc.planner.profile import Timing, _success

    load_backends(("cuda",), required=True)
    func = lowered(fresh(blob))
    insts = route._instances(route._scratch(func), route.plan_tolerance(func), path)
    roofline = RooflineCostSource.gpu_defaults()
    rng = random.Random(0)
    records = []
    for inst in insts:
        try:
            seconds = roofline.cost(inst.kernel, inst.operand_types, inst.result_types, {})
            seconds = seconds.seconds
        except LookupError:
            seconds = 1e-5
        seconds *= rng.uniform(0.5, 2.0)
        timing = Timing(seconds, seconds * 0.95, 0.02, 20)
        records.append(_success(inst, timing, 0.0, "profile"))
    with Database.open(path) as db:
        db.record_all(records)
    return len(records)


# -- the timed compile -----------------------------------------------------------------------------


def timed_steps(blob: bytes, db: str, texts: bool = False) -> tuple[dict[str, float], dict]:
    """Seconds per step of one compile (module doc), and with `texts` each candidate's plan
    text (printing a model's constants takes seconds: not timed, and only when asked)."""
    from tgc.planner import load_backends, route
    from tgc.planner.cost import CachedCosts, RooflineCostSource
    from tgc.planner.db import Database
    from tgc.planner.executor import PlannedFunction
    from tgc.planner.fixed import mark_once
    from tgc.planner.horizontal import merge_siblings
    from tgc.planner.materialise import materialise
    from tgc.planner.profile import unknown
    from tgc.planner.select import plan_function, prepare
    from tgc.diagnostics import TgcError
    from tgc.printer import print_op

    module = fresh(blob)
    times: dict[str, float] = {}

    def step(name, call):
        t0 = time.perf_counter()
        try:
            return call()
        finally:
            times[name] = times.get(name, 0.0) + time.perf_counter() - t0

    from tgc.pass_manager import PassManager

    load_backends(("cuda",), required=True)
    load_backends(route.FAMILIES)
    step("lower", lambda: PassManager.from_text("lower-for-planning").run(module))
    func = module.funcs[0]

    def prep():
        route.move_signature_to_device(func)
        prepare(func)

    step("prepare", prep)
    tolerance = route.plan_tolerance(func)
    insts = step("instances", lambda: route._instances(route._scratch(func), tolerance, db))

    def missing():
        with Database.open(db, readonly=True) as d:
            return unknown(insts, d)

    left = step("unknown", missing)
    if left:
        raise SystemExit(f"{len(left)} instance(s) not in the database: the bench would measure")
    plans: dict[str, str | None] = {}
    shared = CachedCosts(route._costs(db))
    for name in CANDIDATES:
        costs = CachedCosts(RooflineCostSource.gpu_defaults()) if name == "default" else shared
        ctx = route._context(tolerance, generated=name != "library")
        copy = step(f"{name}.clone", lambda: route._scratch(func))
        try:
            selection = step(f"{name}.plan_function", lambda: plan_function(copy, ctx, costs))
        except TgcError:
            if name != "library":
                raise
            plans[name] = None  # some op has no library kernel: no all-library plan (route)
            continue
        step(f"{name}.materialise", lambda: materialise(copy, selection, costs))

        def finish():
            mark_once(copy)
            merge_siblings(copy)
            return PlannedFunction(copy)

        step(f"{name}.finish", finish)
        if texts:
            plans[name] = "\n".join(print_op(op) for op in copy.body.ops)
    return times, plans


def timed_route(blob: bytes, db: str) -> tuple[float, object]:
    """`compile_module` end to end (the whole-plan check's timing left out): seconds, report."""
    from tgc.planner import route

    module = fresh(blob)
    options = route.RouteOptions(db=db, progress=False)
    original = route._choose
    route._choose = lambda candidates, report, *rest: "planned"  # nothing runs on a stand-in
    try:
        t0 = time.perf_counter()
        compiled = route.compile_module(module, None, options)
        seconds = time.perf_counter() - t0
    finally:
        route._choose = original
    if compiled.report.measured or compiled.report.unmeasured:
        raise SystemExit(f"the route measured: {compiled.report.summary()}")
    return seconds, compiled.report


def child(args) -> int:
    """One fresh process: the steps (or the route) cold, then `--repeat` times warm."""
    import torch  # noqa: F401  (imported before timing: the route's graphs import it)

    stand_in()
    blob = Path(args.blob).read_bytes()
    out: dict = {"cold": None, "warm": []}
    if args.child == "route":
        for k in range(args.repeat + 1):
            if k == 0 and args.profile:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
                seconds, report = timed_route(blob, args.db)
                profiler.disable()
                profiler.dump_stats(args.profile)
            else:
                seconds, report = timed_route(blob, args.db)
            row = {"route": seconds, "lower_s": report.lower_s, "plan_s": report.plan_s}
            row["measure_s"] = report.measure_s
            out["cold" if k == 0 else "warm"] = out["warm"] + [row] if k else row
    else:
        for k in range(args.repeat + 1):
            times, texts = timed_steps(blob, args.db, bool(args.texts) and k == args.repeat)
            out["cold" if k == 0 else "warm"] = out["warm"] + [times] if k else times
        out["texts"] = texts
    print(json.dumps(out))
    return 0


def run_child(args, mode: str, blob: Path, db: str) -> dict:
    command = [sys.executable, __file__, "--child", mode, "--blob", str(blob), "--db", db]
    command += ["--repeat", str(args.repeat)]
    if args.texts and mode == "steps":
        command += ["--texts", args.texts]
    if args.profile and mode == "route":
        command += ["--profile", args.profile]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the {mode} process failed ({done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the report ------------------------------------------------------------------------------------


def best(rows: list[dict]) -> dict:
    return {k: min(r[k] for r in rows) for k in rows[0]} if rows else {}


def table(steps: dict, route: dict) -> list[str]:
    cold, warm = steps["cold"], best(steps["warm"])
    lines = ["| step | cold (s) | warm (s) |", "|---|---:|---:|"]
    names = list(STEPS)
    for c in CANDIDATES:
        names += [f"{c}.{s}" for s in ("clone", *PLAN_STEPS)]
    for name in names:
        if name in cold:
            lines.append(f"| {name} | {cold[name]:.3f} | {warm.get(name, math.nan):.3f} |")
    lines.append(f"| sum of the steps | {sum(cold.values()):.3f} | {sum(warm.values()):.3f} |")
    rcold, rwarm = route["cold"], best(route["warm"])
    lines.append(
        f"| **compile_module** (route) | **{rcold['route']:.3f}** | **{rwarm['route']:.3f}** |"
    )
    for key in ("lower_s", "measure_s", "plan_s"):
        lines.append(f"| route report {key} | {rcold[key]:.3f} | {rwarm[key]:.3f} |")
    return lines


def commit_of(given: str | None) -> str:
    if given:
        return given
    try:
        found = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return found + (" (with uncommitted changes in the tree)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt2", help="a model of bench/real_models.py")
    ap.add_argument("--tiny", action="store_true", help="its small config (2 layers)")
    ap.add_argument("--batch", type=int, default=None, help="sequences (default 4; tiny 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens each (default 512; tiny 64)")
    ap.add_argument("--repeat", type=int, default=3, help="warm compiles after the cold one")
    ap.add_argument("--profile", default=None, help="write a cProfile of one cold compile here")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="report folder")
    ap.add_argument("--no-out", action="store_true", help="print the report only")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--texts", default=None, help="write the candidates' plan texts (JSON) here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--blob", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    args.batch = args.batch or (2 if args.tiny else 4)
    args.seq = args.seq or (64 if args.tiny else 512)
    with tempfile.TemporaryDirectory() as tmp:
        imported, info = build_model(args)
        blob = Path(tmp) / "model.pickle"
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))
        blob.write_bytes(pickle.dumps(imported, protocol=pickle.HIGHEST_PROTOCOL))
        db = str(Path(tmp) / "measurements.sqlite")
        stand_in()
        t0 = time.perf_counter()
        info["records"] = fill_database(blob.read_bytes(), db)
        info["fill_s"] = time.perf_counter() - t0
        steps = run_child(args, "steps", blob, db)
        route = run_child(args, "route", blob, db)
    if args.texts:
        Path(args.texts).write_text(json.dumps(steps["texts"], indent=1))
    today = datetime.date.today().isoformat()
    lines = [
        f"# GPU route planning speed on a stand-in device: {today}",
        "",
        f"- commit {commit_of(args.commit)}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU(s), Python {platform.python_version()}",
        f"- {info['model']}, {info['layers']} layers, bf16, {info['tokens']} tokens: "
        f"{info['ops']} ops imported (build {info['build_s']:.1f} s, export "
        f"{info['export_s']:.1f} s, import {info['import_s']:.1f} s)",
        f"- database: {info['records']} kernel instances recorded (every one the plans could "
        f"use); nothing is measured",
        f"- cold: the first compile in a fresh process; warm: best of {args.repeat} more in it",
        "",
        *table(steps, route),
        "",
        f"Goal (issue 22): under {GOAL_S:g} s for a 12-layer model's second run.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"plan_route_speed-{args.model}{'-tiny' if args.tiny else ''}-{today}.md"
        if path.exists():  # the runs of one day (before and after a change) in one report
            text = path.read_text() + "\n" + text.replace("# ", "## ", 1)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

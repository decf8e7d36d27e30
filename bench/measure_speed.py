"""Time to check one kernel instance before timing it (planner/profile.py `measure`), on the
CPU, at the shapes that made first-use measuring slow on the GPU.

    python bench/measure_speed.py [--instances lm_head,attention] [--paths torch,numpy]
        [--before TREE] [--repeat 1] [--profile DIR] [--out bench/results] [--commit HASH]

On an H100, the GPU route's first use measured 8 of GPT-2 small's 210 instances in its 30 s
budget (bf16, 4 x 512 tokens): each instance was checked against float64 on the host with numpy,
the LM head's matmul alone about 8 s and a large attention about 30 s. This bench measures the
same two instances on the CPU, with the torch-cpu kernel (torch-cpu takes f32, not bf16):

- `lm_head`: `torch-cpu.atomic.matmul`, 2048x768 @ 768x50257 (f32);
- `attention`: `torch-cpu.hl.attention`, B4 H12 S512 D64, causal (f32).

Each run is `measure(instance)` in a fresh process (what one instance costs a first use that
meets it first, imports included), split into `check` (everything but the timing: inputs,
reference, the checked call, comparison; the checked call of the kernel itself is reported
apart, as are the CPU seconds) and `timing` (`time_call`, whose run counts and MIN_TIME are the
design's and not changed here). Paths: `torch` is `measure` as it is (the check
on the kernel's device with PyTorch, planner/torch_check.py), `numpy` forces the host check
(`HostCheck`, what runs without PyTorch); `--before TREE` runs the same instances with the tgc of
another checkout (e.g. `git archive <commit> | tar -x -C TREE`), the code before the change.
`--profile DIR` writes a cProfile of each run. The report goes to
bench/results/measure_speed-<date>.md with the commit, the machine and its load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

T_ATT = "tensor<4x12x512x64xf32>"
INSTANCES = {
    "lm_head": (
        "torch-cpu.atomic.matmul",
        """func.func @f(%a: tensor<2048x768xf32>, %b: tensor<768x50257xf32>) -> tensor<2048x50257xf32> {
  %y = atomic.matmul %a, %b : (tensor<2048x768xf32>, tensor<768x50257xf32>) -> tensor<2048x50257xf32>
  func.return %y : tensor<2048x50257xf32>
}""",
    ),
    "attention": (
        "torch-cpu.hl.attention",
        f"""func.func @f(%q: {T_ATT}, %k: {T_ATT}, %v: {T_ATT}) -> {T_ATT} {{
  %y = hl.attention %q, %k, %v {{causal = true}} : ({T_ATT}, {T_ATT}, {T_ATT}) -> {T_ATT}
  func.return %y : {T_ATT}
}}""",
    ),
}


def child(name: str, path: str, profile_to: str | None) -> dict:
    """One `measure` of instance `name` in this process; its times as a dict."""
    import cProfile

    import tgc
    from tgc.planner import load_backends, profile
    from tgc.planner.kernel import KERNELS

    load_backends(["numpy", "torch"])
    kernel_name, text = INSTANCES[name]
    func = tgc.parse(text).funcs[0]
    root = func.body.last.operands[0].defining_op
    inst = profile.Instance(
        KERNELS[kernel_name],
        tuple(a.type for a in func.body.args),
        tuple(func.function_type.results),
        {k: v for k, v in root.attributes.items() if "." not in k},
    )
    if path == "numpy":  # the host check whatever is loaded
        profile.checker = lambda inst, ref, seed: profile.HostCheck(ref, inst.kernel.space, seed)
    used = getattr(profile, "checker", None)
    timed = [0.0, 0.0]  # wall and CPU seconds in time_call
    time_call = profile.time_call

    def counted(*args, **kwargs):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return time_call(*args, **kwargs)
        finally:
            timed[0] += time.perf_counter() - start
            timed[1] += time.process_time() - cpu

    checked_call = []  # the first call of the kernel: the one the check compares
    invocation = profile._invocation

    def first_call_timed(inst, ref):
        invoke = invocation(inst, ref)
        if isinstance(invoke, str):
            return invoke

        def call(values):
            if checked_call:
                return invoke(values)
            start = time.perf_counter()
            out = invoke(values)
            checked_call.append(time.perf_counter() - start)
            return out

        return call

    profile.time_call = counted
    profile._invocation = first_call_timed
    profiler = cProfile.Profile() if profile_to else None
    start, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    m = profile.measure(inst)
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile_to)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    check = None
    if used is not None and path == "torch":
        from tgc.planner import torch_check

        ref = profile.reference_function(inst)
        check = "HostCheck" if torch_check.unsupported(ref, None) else "TorchCheck"
    return {
        "total": total,
        "timing": timed[0],
        "check": total - timed[0],
        "check_cpu": total_cpu - timed[1],
        "checked_call": checked_call[0] if checked_call else 0.0,
        "ok": m.ok,
        "message": m.message,
        "max_error": m.max_error,
        "median": m.median,
        "runs": m.runs,
        "checked_by": check or ("HostCheck" if path == "numpy" else "numpy (before)"),
    }


def run_child(name: str, path: str, tree: Path | None, profile_to: str | None) -> dict:
    env = dict(os.environ)
    if tree is not None:  # the other checkout's tgc first on the path
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    args = [sys.executable, str(Path(__file__).resolve()), "--child", name, path]
    if profile_to:
        args += ["--profile-to", profile_to]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{name} ({path}) failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def commit_of(tree: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", default="lm_head,attention")
    parser.add_argument("--paths", default="torch,numpy")
    parser.add_argument("--before", type=Path, help="a checkout to run as 'before'")
    parser.add_argument("--before-commit", default=None, help="its commit (for the report)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", type=Path, help="write a cProfile of each run here")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.profile_to)))
        return 0

    import numpy
    import torch

    names = [n for n in args.instances.split(",") if n]
    runs: list[tuple[str, str, str | None]] = []  # (label, path, tree)
    if args.before is not None:
        runs.append((f"before ({args.before_commit or 'given tree'})", "before", args.before))
    runs += [(p, p, None) for p in args.paths.split(",") if p]
    commit = args.commit or commit_of(ROOT)
    started, load_before = datetime.datetime.now(), load()
    rows = []
    for name in names:
        for label, path, tree in runs:
            for i in range(args.repeat):
                prof = None
                if args.profile:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    prof = str(args.profile / f"{name}-{path}-{i}.pstats")
                r = run_child(name, "numpy" if path == "numpy" else "torch", tree, prof)
                r.update(instance=name, label=label)
                rows.append(r)
                print(
                    f"{name:10s} {label:24s} check {r['check']:7.2f} s (kernel "
                    f"{r['checked_call']:5.2f} s, cpu {r['check_cpu']:6.2f} s)  timing "
                    f"{r['timing']:7.2f} s  total {r['total']:7.2f} s  "
                    f"{'ok' if r['ok'] else r['message']}  ({r['checked_by']})",
                    flush=True,
                )
    lines = [
        f"# Checking one kernel instance: measure_speed ({started:%Y-%m-%d})",
        "",
        f"`python bench/measure_speed.py {' '.join(sys.argv[1:])}` at commit {commit}, "
        f"{started:%Y-%m-%d %H:%M}; {machine()}; Python {platform.python_version()}, "
        f"numpy {numpy.__version__}, torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads); load average (1/5/15 min) {load_before} before, {load()} after.",
        "",
        "Each row is one `measure(instance)` in a fresh process, wall seconds: `check` is "
        "everything but `time_call` (inputs, reference, the checked call of the kernel, "
        "comparison), of which `kernel` is the checked call itself and `checking` the rest (what "
        "checking adds to the kernel's own time); `check CPU` is the process's CPU seconds for "
        "the check (all threads; less sensitive than wall time to other load on the machine); "
        "`timing` the design's timed calls (at least 5 after a warm-up and a first call).",
        "",
        "| instance | code | checked by | check (s) | kernel (s) | checking (s) | check CPU (s) "
        "| timing (s) | total (s) | max error | result |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        error = "-" if r["max_error"] is None else f"{r['max_error']:.2e}"
        lines.append(
            f"| {r['instance']} | {r['label']} | {r['checked_by']} | {r['check']:.2f} | "
            f"{r['checked_call']:.2f} | {r['check'] - r['checked_call']:.2f} | "
            f"{r['check_cpu']:.2f} | {r['timing']:.2f} | {r['total']:.2f} | {error} | "
            f"{'ok' if r['ok'] else r['message']} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / f"measure_speed-{started:%Y-%m-%d}.md"
    report.write_text("\n".join(lines) + "\n")
    print(f"report: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU route: how every program reaches the GPU (`tgc-run --backend cuda`, the Python API,
the benchmarks). There is one: the planner's.

`compile_module(module, func_name, options)` makes a `CompiledFunction` in six steps:

1. `lower-for-planning` (passes/optimize.py): the program the planner plans, every kernel the
   fusion pass could make among its options;
2. the function's arguments and results move to device memory: its callers' values live there;
3. **measuring on first use**, as cuDNN's benchmark mode and TensorRT's timing cache do: the
   kernel instances its plans could use that the measurement database does not know are
   measured, within `measure_budget` seconds, and recorded (one default database in the user's
   cache, shared by every tool; `RouteOptions.db` another). First the library's own kernel at
   every product (cuBLAS, cuBLASLt, PyTorch's matmul, linear and SDPA), the heaviest first, so
   that no heavy op is planned on a guess where a measurement was possible; then, planning
   again with what is known, the instances that plan would run on a guessed cost, its dearest
   first, until it runs on measurements alone (a guess that looks cheap is what misleads a
   plan: GPT-2's head planned on the generated matmul's roofline cost ran at a third of the
   padded cuBLAS GEMM's speed); then the planner's other likely winners (planner/profile.py
   `instances`). A second run of the same program measures nothing;
4. `select-kernels` with the costs measured, else estimated from other measurements, else the
   default cost source: a roofline with the GPU's matrix units and per-family efficiencies
   (`RooflineCostSource.gpu_defaults`), under which, with no measurement at all, the plan is
   what the fixed CUDA route made. A plan replayed as a CUDA graph (`graphs`) costs each
   kernel timed on the device by the device's time alone: no host queues a replayed kernel, so
   the host work of a library call (PyTorch's dispatch, a ctypes call) costs nothing there;
5. **the whole plan is checked**: a plan's time on a GPU is not the sum of its kernels' (launch
   overlap, host work, caches), so the plan is timed whole beside the plan of library kernels
   alone (what PyTorch eager would run; where some op has no library kernel, generated kernels
   there alone) and the plan of the default costs, on random inputs, and the fastest runs. So
   tgc is never slower than the library kernels it can call. Every
   candidate's time, and which one ran, is recorded in the database under the function's
   canonical hash and the device (planner/plan_memory.py): a later compile of the same function
   whose candidate plans are the same takes that choice without timing them again
   (`RouteReport.remembered`);
6. the chosen plan runs as a `PlannedFunction` (planner/executor.py), its device work captured
   into a CUDA graph and replayed where the arguments' buffers repeat (planner/graphs.py;
   `graphs`), which is also how step 5 times the candidates.

The planning tolerance is by element type (`plan_tolerance`): a kernel's stated error may be as
large as `tgc-run --check`'s tolerance for the function's narrowest float type, and never needs
to be under 1e-5 (the stated errors are for f32).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace

from tgc.builtin import FuncOp, ModuleOp
from tgc.diagnostics import TgcError
from tgc.planner import DEFAULT_MEASURE_BUDGET, kernel_backends, load_backends
from tgc.planner.backends import SPACES
from tgc.planner.cost import CachedCosts, CostSource, RooflineCostSource, is_product
from tgc.planner.executor import PlannedFunction
from tgc.planner.graphs import GraphReplay
from tgc.planner.options import PlanContext
from tgc.planner.profile import MIN_TIME
from tgc.types import CHECK_TOLERANCE, FLOAT_TYPES

DEVICE = "cuda"
# The backend families the route loads: tgc's generated kernels and cuBLAS (cuda) and PyTorch's
# (torch, where it imports); of those it plans with the device's kernels alone, constants made
# on the host and copied where they are read (PlanContext's host_constants).
FAMILIES = ("cuda", "torch")
DEVICE_BACKENDS = frozenset({"cuda", "torch-cuda"})
# Kernels that are a library's own (the all-library plan and the first to be measured): every
# torch-cuda kernel and cuBLAS / cuBLASLt.
LIBRARY_PREFIXES = ("torch-cuda.", "cuda.cublas.", "cuda.cublaslt.")
KERNEL_TOLERANCE = 1e-5  # the stated errors of kernels are for f32: no plan needs less
# Plans made while measuring, each to find the instances it would run on a guess: a bound on
# the planning work first use adds (each round measures at least one instance).
MAX_REPLANS = 8
# Copies between memory spaces measured per direction and element type, at the smallest, the
# middle and the largest size a plan could copy: a copy's time is a line in its bytes, so the
# database's estimate (planner/estimate.py) prices the other sizes from these. Measured one by
# one, GPT-2's 55 copies took a third of a 30 s budget on an H200.
COPY_SAMPLES = 3


@dataclass(frozen=True)
class RouteOptions:
    """How the route plans. `db`: the measurement database (None: the default one, in the
    user's cache directory); `measure`: measure unknown instances on first use, within
    `measure_budget` seconds; `tolerance`: the largest stated kernel error allowed (None: by
    element type, `plan_tolerance`); `whole_plan_check`: time the candidate plans whole and run
    the fastest; `graphs`: replay calls as CUDA graphs (planner/graphs.py); `progress`: a
    progress bar on stderr while measuring; `min_time`: seconds of timed calls per kernel
    instance and per candidate plan."""

    db: str | None = None
    measure: bool = True
    measure_budget: float = DEFAULT_MEASURE_BUDGET
    tolerance: float | None = None
    whole_plan_check: bool = True
    graphs: bool = True
    progress: bool = True
    min_time: float = MIN_TIME


@dataclass
class RouteReport:
    """What compiling did: seconds spent lowering, measuring and planning, how many instances
    were measured (and failed), the whole-plan candidates' times (ms) and the one chosen."""

    lower_s: float = 0.0
    measure_s: float = 0.0
    plan_s: float = 0.0
    check_s: float = 0.0
    measured: int = 0
    failed: int = 0
    noisy: int = 0  # measured, but their timings spread: kept and flagged (planner/profile.py)
    unmeasured: int = 0  # unknown instances the budget (or --no-measure) left
    candidates: dict[str, float] = field(default_factory=dict)
    chosen: str = "planned"
    remembered: bool = False  # the choice (and the times shown) came from the database
    notes: list[str] = field(default_factory=list)

    @property
    def first_use_s(self) -> float:
        return self.lower_s + self.measure_s + self.plan_s + self.check_s

    def summary(self) -> str:
        parts = [f"planned in {self.first_use_s:.2f} s"]
        if self.measured or self.failed:
            parts.append(f"measured {self.measured} kernel instance(s) in {self.measure_s:.1f} s")
            if self.failed:
                parts.append(f"{self.failed} failed their check (not used)")
            if self.noisy:
                parts.append(f"{self.noisy} noisy (kept and flagged: tgc-db prune --noisy)")
        if self.unmeasured:
            parts.append(f"{self.unmeasured} left unmeasured")
        if self.candidates:
            times = ", ".join(f"{k} {v:.4f} ms" for k, v in self.candidates.items())
            how = " (remembered, not timed again)" if self.remembered else ""
            parts.append(f"whole plans{how}: {times}; running '{self.chosen}'")
        return "; ".join(parts + self.notes)


class CompiledFunction:
    """A function planned for the GPU: called with device values (anything exposing
    `__cuda_array_interface__`, a PyTorch CUDA tensor included) in argument order, it queues
    the plan's kernels and returns the results in device memory. With graphs (the default),
    a call whose arguments' buffers repeat replays a CUDA graph and returns the same result
    buffers as the previous such call, overwritten (planner/graphs.py). `run_host` takes and
    returns numpy arrays."""

    def __init__(self, runner: PlannedFunction | GraphReplay, report: RouteReport) -> None:
        self.runner = runner
        self.planned = runner.planned if isinstance(runner, GraphReplay) else runner
        self.report = report

    @property
    def func(self) -> FuncOp:
        return self.planned.func

    def __call__(self, values: list) -> list:
        return self.runner(list(values))

    def run_host(self, inputs: list) -> list:
        from tgc.runtime.interpreter import check_inputs

        func = self.func
        values = [
            _space(arg.type.encoding).from_host(value, arg.type)
            for arg, value in zip(func.body.args, check_inputs(func, inputs, "native"))
        ]
        results = self(values)
        types = func.function_type.results
        return [_space(t.encoding).to_host(x) for t, x in zip(types, results)]


# -- the steps ---------------------------------------------------------------------------------


def compile_module(
    module: ModuleOp, func_name: str | None = None, options: RouteOptions = RouteOptions()
) -> CompiledFunction:
    """Lower, measure, plan and check `module`'s function `func_name` (the only one when None)
    for the GPU (module doc). `module` is lowered in place."""
    from tgc.pass_manager import PassManager
    from tgc.runtime.interpreter import select_function

    start = time.perf_counter()
    PassManager.from_text("lower-for-planning").run(module)
    func = select_function(module, func_name)
    lower_s = time.perf_counter() - start
    compiled = compile_function(func, options)
    compiled.report.lower_s = lower_s
    return compiled


def compile_function(func: FuncOp, options: RouteOptions = RouteOptions()) -> CompiledFunction:
    """Steps 2-6 of the module doc on a function in the form the planner plans (after
    `lower-for-planning`, or as written). `func` itself is put in canonical form with its
    values in device memory; the compiled function runs a planned copy of it."""
    from tgc.planner.db import resolve_path
    from tgc.planner.select import prepare

    load_backends(("cuda",), required=True)
    load_backends(FAMILIES)  # torch where it imports
    report = RouteReport()
    move_signature_to_device(func)
    prepare(func)
    tolerance = plan_tolerance(func) if options.tolerance is None else options.tolerance
    db_path = resolve_path(options.db)
    start = time.perf_counter()
    if options.measure:
        measure_first_use(func, tolerance, db_path, options, report)
    else:
        report.unmeasured = len(_unknown(func, tolerance, db_path, options.graphs))
    report.measure_s = time.perf_counter() - start
    start = time.perf_counter()
    # one database read for both plans that use it
    costs = CachedCosts(_costs(db_path, options.graphs))
    candidates = {"planned": _plan(func, tolerance, costs, options.graphs)}
    if options.whole_plan_check:
        candidates["library"] = _library_plan(func, tolerance, costs, options.graphs)
        defaults = RooflineCostSource.gpu_defaults()
        candidates["default"] = _plan(func, tolerance, defaults, options.graphs)
    report.plan_s = time.perf_counter() - start
    start = time.perf_counter()
    chosen = "planned"
    if len(candidates) > 1:
        memory = _plan_memory(func, db_path, options)
        chosen = _choose(candidates, report, options.min_time, memory)
    report.chosen = chosen
    report.check_s = time.perf_counter() - start
    runner = candidates[chosen]
    if isinstance(runner, GraphReplay) and runner.reason is not None:
        report.notes.append(f"calls are not replayed as CUDA graphs: {runner.reason}")
    return CompiledFunction(runner, report)


def plan_tolerance(func: FuncOp) -> float:
    """The largest stated kernel error a plan of `func` may use (module doc)."""
    ftype = func.function_type
    floats = [
        t.element_type for t in (*ftype.inputs, *ftype.results) if t.element_type in FLOAT_TYPES
    ]
    if not floats:
        return KERNEL_TOLERANCE
    return max(KERNEL_TOLERANCE, min(CHECK_TOLERANCE[e] for e in floats))


def move_signature_to_device(func: FuncOp) -> None:
    """Arguments and results typed in device memory: the plan keeps them there."""
    for arg in func.body.args:
        arg.type = arg.type.with_encoding(DEVICE)
    ftype = func.function_type
    func.attributes["function_type"] = type(ftype)(
        tuple(t.with_encoding(DEVICE) for t in ftype.inputs),
        tuple(t.with_encoding(DEVICE) for t in ftype.results),
    )


def is_library(kernel) -> bool:
    return kernel.name.startswith(LIBRARY_PREFIXES)


def _context(tolerance: float, generated: bool = True) -> PlanContext:
    backends = kernel_backends(FAMILIES) & DEVICE_BACKENDS
    return PlanContext(
        tolerance=tolerance, backends=backends, generated=generated, host_constants=True
    )


def _costs(db_path: str, device_time: bool = False) -> CostSource:
    """The route's costs: the database's, else the GPU's roofline. With `device_time` (plans
    replayed as CUDA graphs) a kernel costs the device's time alone: a library call whose
    host work (PyTorch's dispatch, a ctypes call) outlasts its kernel costs the kernel there,
    as it does inside a replayed graph."""
    from tgc.planner.estimate import DatabaseCostSource

    fallback = RooflineCostSource.gpu_defaults()
    return DatabaseCostSource(db_path, fallback=fallback, device_time=device_time)


def _instances(func: FuncOp, tolerance: float, db_path: str, device_time: bool = False):
    """Every kernel instance the plans of `func` could use, in the order first use measures
    them: the library's products (cuBLAS, cuBLASLt, PyTorch's matmul, linear and attention) by
    their weight, heaviest first, then the rest in the profiler's order (likely winners
    first)."""
    from tgc.planner.profile import instances

    costs = CachedCosts(_costs(db_path, device_time))
    found = instances(func, _context(tolerance), costs)
    defaults = CachedCosts(RooflineCostSource.gpu_defaults())

    def weight(inst) -> float:
        try:
            return defaults.cost(inst.kernel, inst.operand_types, inst.result_types).seconds
        except LookupError:
            return 0.0

    first = [i for i in found if is_library(i.kernel) and is_product(i.kernel)]
    chosen = {id(i) for i in first}
    rest = _sampled_copies([i for i in found if id(i) not in chosen])
    return sorted(first, key=lambda i: -weight(i)) + rest


def _sampled_copies(insts: list) -> list:
    """`insts` with its copies thinned to COPY_SAMPLES sizes per copy kernel and element types
    (spread over the sizes), the other instances as they are, in their order."""
    from tgc.planner.db import dtypes_of
    from tgc.planner.estimate import instance_bytes

    groups: dict[tuple, list] = {}
    for inst in insts:
        if inst.kernel.op == "kernel.copy":
            key = (inst.kernel.name, dtypes_of(inst.operand_types, inst.result_types))
            groups.setdefault(key, []).append(inst)
    kept: set[int] = set()
    for group in groups.values():
        group.sort(key=lambda i: instance_bytes(i.operand_types, i.result_types))
        last = len(group) - 1
        picks = {round(last * k / max(COPY_SAMPLES - 1, 1)) for k in range(COPY_SAMPLES)}
        kept.update(id(group[p]) for p in picks)
    return [i for i in insts if i.kernel.op != "kernel.copy" or id(i) in kept]


def _unknown(func: FuncOp, tolerance: float, db_path: str, device_time: bool = False) -> list:
    from tgc.planner.db import Database, DatabaseUnavailable
    from tgc.planner.profile import unknown

    insts = _instances(_scratch(func), tolerance, db_path, device_time)
    try:
        with Database.open(db_path, readonly=True) as db:
            return unknown(insts, db)
    except DatabaseUnavailable:
        return insts


def measure_first_use(
    func: FuncOp, tolerance: float, db_path: str, options: RouteOptions, report: RouteReport
) -> None:
    """Measure, within the budget, the instances of `func`'s plans the database does not know
    (module doc, step 3), into the database at `db_path`: the library's products, heaviest
    first; then, until the plan measured costs alone choose, the instances that plan would run
    on a guess, its dearest first (`_guessed`); then the rest in the profiler's order."""
    from tgc.planner.db import Database, DatabaseUnavailable
    from tgc.planner.profile import Profiler, unknown

    insts = _instances(_scratch(func), tolerance, db_path, options.graphs)
    try:
        db = Database.open(db_path)
    except DatabaseUnavailable as e:
        report.notes.append(f"not measuring: {e.message}")
        print(f"tgc: warning: not measuring: {e.message}", file=sys.stderr)
        return
    with db:
        # A second run knows every instance: said by one pass over the database, without the
        # plan `_guessed` makes or the profiler's runs, each of which would pass over it again.
        if not unknown(insts, db):
            return
        profiler = Profiler(db, options.measure_budget, options.min_time, options.progress)
        library = [i for i in insts if is_library(i.kernel) and is_product(i.kernel)]
        runs = [profiler.run(library)]
        for _ in range(MAX_REPLANS):
            if profiler.out_of_time():
                break
            guessed = unknown(_guessed(func, tolerance, db_path, options.graphs), db)
            if not guessed:
                break
            runs.append(profiler.run(guessed))
        if not profiler.out_of_time():
            runs.append(profiler.run(insts))
        left = len(unknown(insts, db))
    report.measured = sum(r.measured for r in runs)
    report.failed = sum(r.failed for r in runs)
    report.noisy = sum(r.noisy for r in runs)
    report.unmeasured = left


def _guessed(func: FuncOp, tolerance: float, db_path: str, device_time: bool = False) -> list:
    """The kernel instances the plan of `func` chosen with what the database knows now would
    run on a guessed cost (estimated from other measurements, or the roofline), the dearest
    first: measuring them is what can change that plan most."""
    from tgc.planner.options import DECOMPOSE
    from tgc.planner.profile import instance_of
    from tgc.planner.select import plan_function

    costs = CachedCosts(_costs(db_path, device_time))
    try:
        selection = plan_function(_scratch(func), _context(tolerance), costs)
    except TgcError:
        return []  # no plan within the tolerance: compile_function says so when it plans
    found: dict[tuple, tuple[float, object]] = {}
    steps = list(selection.plan.steps)
    while steps:
        step = steps.pop()
        if step.option.kind == DECOMPOSE:
            steps.extend(step.nested.steps)
            continue
        inst = instance_of(step.option)
        cost = costs.cost(inst.kernel, inst.operand_types, inst.result_types)
        if cost.source != "measured":
            found.setdefault(inst.key(), (cost.seconds, inst))
    return [inst for _, inst in sorted(found.values(), key=lambda item: -item[0])]


def _scratch(func: FuncOp) -> FuncOp:
    """A copy of `func` to walk or plan (planning changes the function it plans)."""
    from tgc.passes.algebraic.graph import clone_func

    return clone_func(func)


def _plan(
    func: FuncOp,
    tolerance: float,
    costs: CostSource | CachedCosts,
    graphs: bool,
    generated: bool = True,
    annotated: CachedCosts | None = None,
) -> PlannedFunction | GraphReplay | None:
    """A copy of `func` planned with `costs` (generated False: no generated kernel), made
    ready to run (through CUDA graphs with `graphs`); None when no plan exists within the
    tolerance. Its calls' `plan.seconds` are those of `annotated` where given (the costs
    without a planning bias), else of `costs`."""
    from tgc.planner.select import plan_function, write_plan

    copy = _scratch(func)
    cached = costs if isinstance(costs, CachedCosts) else CachedCosts(costs)
    try:
        selection = plan_function(copy, _context(tolerance, generated), cached)
    except TgcError:
        if generated:
            raise
        return None  # some op has no library kernel: there is no all-library plan
    write_plan(copy, selection, annotated or cached)
    planned = PlannedFunction(copy)
    return GraphReplay(planned) if graphs else planned


# Seconds added to each generated kernel's cost in the library plan where some op has no
# library kernel: more than any plan takes, so that the plan has as few generated kernels as
# can be, and among those the fastest; twice that for a generated product (a matmul with its
# epilogue fused), which must not stand in for the library's GEMM and the elementwise kernel
# the plan needs anyway. Added, not multiplied: a cheap generated kernel must not win by
# being cheap.
GENERATED_PENALTY = 1.0


class _LibraryFirst:
    """A cost source for the library plan of a program some op of which no library kernel
    runs (an index computation, say): each generated kernel costs GENERATED_PENALTY more, so
    they fill those places alone and the plan is otherwise what eager would run."""

    def __init__(self, source: CostSource) -> None:
        self.source = source

    def cost(self, kernel, operand_types, result_types, params):
        from tgc.planner.backends import TEMPLATES

        found = self.source.cost(kernel, operand_types, result_types, params)
        if kernel.name not in TEMPLATES:
            return found
        penalty = GENERATED_PENALTY * (2 if is_product(kernel) else 1)
        return replace(found, seconds=found.seconds + penalty)

    def tuned_params(self, kernel, operand_types, result_types):
        tuned = getattr(self.source, "tuned_params", None)
        return tuned(kernel, operand_types, result_types) if tuned else None


def _library_plan(func: FuncOp, tolerance: float, costs: CachedCosts, graphs: bool):
    """The whole-plan check's library candidate (module doc, step 5): library kernels alone,
    else, where some op has none, library kernels wherever one runs (`_LibraryFirst`)."""
    found = _plan(func, tolerance, costs, graphs, generated=False)
    if found is None:
        biased = CachedCosts(_LibraryFirst(costs.source))
        found = _plan(func, tolerance, biased, graphs, annotated=costs)
    return found


def _plan_memory(func: FuncOp, db_path: str, options: RouteOptions):
    """Where `_choose` recalls and records the whole-plan times of `func` (in the form the
    planner plans): written only where the route may write the database."""
    from tgc.planner.blocks import function_hash
    from tgc.planner.plan_memory import PlanMemory, plan_device

    return PlanMemory(db_path, function_hash(func), plan_device(), write=options.measure)


def _choose(candidates: dict, report: RouteReport, min_time: float = MIN_TIME, memory=None) -> str:
    """The fastest of the candidate plans, each timed whole on the same random inputs. With
    `memory` (planner/plan_memory.py `PlanMemory`): the choice an earlier compile made among
    the same plans, without timing them; else the times taken are recorded there."""
    from tgc.planner.plan_memory import identify
    from tgc.planner.profile import SYNCHRONIZE, steady_time
    from tgc.runtime.interpreter import random_inputs

    plans = {name: identify(p.func) for name, p in candidates.items() if p is not None}
    if memory is not None:
        recalled = memory.recall(plans)
        if recalled is not None:
            report.remembered = True
            report.candidates = {k: v * 1e3 for k, v in recalled.times.items()}
            for name, message in recalled.failures.items():
                report.notes.append(f"the {name} plan did not run: {message}")
            return recalled.chosen
    first = candidates["planned"]
    func = first.func
    space = _space(DEVICE)
    inputs = [space.from_host(x, a.type) for x, a in zip(random_inputs(func, 0), func.body.args)]
    sync = SYNCHRONIZE.get(DEVICE, lambda: None)
    timings: dict = {}
    failures: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, planned in candidates.items():
        if planned is None:
            continue
        key = plans[name].plan_hash  # the same kernels as an earlier candidate: its outcome
        if key in seen:
            if seen[key] in timings:
                timings[name] = timings[seen[key]]
            else:
                failures[name] = failures[seen[key]]
            continue
        seen[key] = name
        try:
            timings[name] = steady_time(
                lambda p=planned: p(inputs), sync, min_time, space.time_queued
            )
        except TgcError as e:
            report.notes.append(f"the {name} plan did not run: {e.message}")
            failures[name] = e.message
    times = {k: t.median for k, t in timings.items()}
    report.candidates = {k: v * 1e3 for k, v in times.items()}
    chosen = min(times, key=lambda k: (times[k], k != "planned")) if times else "planned"
    if memory is not None:
        note = memory.remember(plans, timings, failures, chosen)
        if note is not None:
            report.notes.append(note)
    return chosen


def _space(name: str | None):
    space = SPACES.get(name)
    if space is None:
        raise TgcError(f"no backend that can hold values in {name or 'host'} memory is loaded")
    return space


__all__ = [
    "DEFAULT_MEASURE_BUDGET",
    "CompiledFunction",
    "RouteOptions",
    "RouteReport",
    "compile_function",
    "compile_module",
    "is_library",
    "plan_tolerance",
]

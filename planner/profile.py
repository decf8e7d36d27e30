"""The profiler: find the kernel instances a module's plans could use, and measure those whose
time is not known yet.

**Instances** (`instances(func, ctx)`): every option the planner would consider at every live op
(`planner.options`), on every backend loaded, and inside every decomposition, each once: a kernel
with its operand and result types (encodings included), its parameters and, for an op kernel,
the op's attributes. The twelve equal blocks of a transformer give the same instances, so they
are measured once. With more than one memory space, the copies of every type between the spaces
are instances too.

**A measurement** (`measure(instance)`): inputs drawn fresh at random (`random_inputs`: normal
floats, weights scaled by fan-in, indices in range; never all zeros), the kernel's result
checked first against its reference evaluated in float64: allowed is the kernel's stated
`max_rel_error` plus the larger of 4x the error of the op-by-op evaluation in the program's own
types and 8 ulp of the result type. A wrong result (or an exception) is recorded as a failure
with its error and never timed. Where planner/torch_check.py can evaluate the reference with
PyTorch on the device of the kernel's space (`checker`: the torch backend of that space loaded,
every op of the reference one torch evaluates), the inputs are drawn there, the reference runs
there in float64 and the errors are computed there, so only scalars reach the host; elsewhere
numpy's interpreter on the host (`HostCheck`). The op-by-op evaluation in the program's types is
run only where the error exceeds the allowance without it (it can only widen it: the same
verdicts). Then warm-up, and the median of repeated timings of the call on
the backend's own values, as many as fit in `min_time` (at least MIN_RUNS): in a space that
times queued work (the GPU: `Space.time_queued`), the longer of the device's time and the host's
per call, as the call costs a plan whose host runs ahead; elsewhere `perf_counter` with the
space's synchronisation around each call. A timing whose spread ((p90 - p10) / median) is above
`NOISY_SPREAD` is taken again, up to `MAX_ATTEMPTS` times in all (`steady_time`): another
process, a clock change or a cold cache passes; the first steady attempt is kept, else the
steadiest one, recorded as *noisy* (the database keeps the flag, `tgc-db list` counts it, and
`tgc-db prune --noisy` deletes such records so that a later run on a quieter machine measures
them again). A noisy time is never kept as if it were steady.

**The order** (`instances(func, ctx, costs)`): with the costs select-kernels plans with, the
likely winners first, round-robin by rank over every op: each op's kernel options ranked by
their cost per op covered (a fusion against one op kernel), an instance shared by several ops
at its best rank, a copy at the best rank of the instances whose types it moves; ties in walk
order. A budget then measures every op's estimated best before anyone's long tail.

**A run** (`Profiler`): the instances with no record on this device are measured one by one,
in that order, each stored in its own transaction; `budget` seconds stops it starting new ones.
A killed run loses the measurement in flight at most, and the next run starts where it stopped
(the records say what is known). With `tune`, kernels with parameters are then searched (planner/tune.py).
"""

from __future__ import annotations

import hashlib
import math
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property

import ml_dtypes
import numpy as np

from tgc.attributes import DenseAttr
from tgc.builtin import FuncOp, ReturnOp
from tgc.diagnostics import TgcError
from tgc.ir import Block
from tgc.opdef import FREE, OPS, create
from tgc.planner.backends import BACKENDS, SPACES
from tgc.planner.blocks import attribute_text
from tgc.planner.cost import CachedCosts, CostSource
from tgc.planner.db import (
    FAILED,
    OK,
    Database,
    Measurement,
    device_of,
    dtypes_of,
    kernel_info,
    params_text,
    signature_of,
)
from tgc.planner.estimate import instance_bytes, instance_flops
from tgc.planner.kernel import (
    Kernel,
    canonical_references,
    instantiate_reference,
    rel_error,
)
from tgc.planner.options import COPY_KERNELS, DECOMPOSE, Option, PlanContext, copy_kernel
from tgc.printer import format_attr_dict
from tgc.types import TensorType

MIN_RUNS = 5
# At most this many timed calls, however short the call. At the median spread run 7's database
# records (p90 - p10 = 0.19 of the median, bench/results/generate-*), the median of 200 calls
# has a standard error under 1%; and on the GPU each call also costs the spin that lets the host
# queue the calls ahead (runtime/cuda_timing.py). With 1000, a 15-50 µs kernel took about 0.1 s
# to time, ~900 calls each: 270 of the 387 instances a first generate() at batch 16 measured.
MAX_RUNS = 200
MIN_TIME = 0.05  # seconds of timed calls per instance (after warm-up)
MIN_SECONDS = 1e-9  # the shortest time recorded (a call faster than the clock)
ULPS = 8  # the result type's rounding the check allows besides the stated error
NATIVE_FACTOR = 4  # ... and this many times the op-by-op evaluation's own error
# A timing whose (p90 - p10) / median is above this is noisy: its median may be off by as much.
# On a GPU a kernel's timings spread by a few percent; on a busy 2-core CPU a short kernel's
# spread is 0.17 at the median and 0.8 at the 90th percentile (the GPT-2 block's 58 numpy
# instances at --min-time 0.01, 2026-11-28), so this flags what a repeat may cure, not every
# CPU timing.
NOISY_SPREAD = 0.5
MAX_ATTEMPTS = 3  # timings of one call in all, the first included, before it is flagged noisy
# Instances whose generated kernels are compiled together before they are measured: nvcc takes
# about a second a kernel, so one at a time it, not the GPU, set the pace of first-use
# measuring (1.3 kernels/s on an H200); runtime/cuda_compile.py runs up to 16 compiles at once.
COMPILE_AHEAD = 16


@dataclass(frozen=True, eq=False)
class Instance:
    """A kernel on given types, with its parameters and (op kernels) the op's attributes."""

    kernel: Kernel
    operand_types: tuple[TensorType, ...]
    result_types: tuple[TensorType, ...]
    attrs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    @property
    def signature(self) -> str:
        return signature_of(self.operand_types, self.result_types)

    @cached_property
    def attrs_text(self) -> str:
        """The op's attributes as text, a constant of more than LARGE_CONSTANT elements by a
        digest of its bytes: GPT-2's 4x1x512x512 causal mask printed is 5.8 MB, and an
        instance's key was printed six times a compile (most of a second compile's time)."""
        large = {k for k, v in self.attrs.items() if _is_large_constant(v)}
        text = format_attr_dict({k: v for k, v in self.attrs.items() if k not in large})
        digests = [f"{k} = {attribute_text(self.attrs[k])}" for k in sorted(large)]
        return " ".join([text, *digests]) if digests else text

    @cached_property
    def attrs_key(self) -> str:
        text = self.attrs_text
        return hashlib.sha256(text.encode()).hexdigest()[:16] if text else ""

    def key(self) -> tuple[str, str, str, str]:
        return (self.kernel.name, self.signature, params_text(self.params), self.attrs_key)

    def with_params(self, params: dict) -> Instance:
        return replace(self, params=dict(params))

    def describe(self) -> str:
        ins = ", ".join(map(str, self.operand_types))
        outs = ", ".join(map(str, self.result_types))
        text = f"{self.kernel.name} ({ins}) -> {outs}"
        if self.attrs:
            text += f" {_short(self.attrs_text)}"
        if self.params:
            text += f" params {params_text(self.params)}"
        return text


LARGE_CONSTANT = 64  # elements: a dense value larger than this is keyed by its digest


def _is_large_constant(value) -> bool:
    return isinstance(value, DenseAttr) and value.type.num_elements > LARGE_CONSTANT


def _short(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# -- the instances of a module ------------------------------------------------------------------------


def instances(
    func: FuncOp, ctx: PlanContext, costs: CostSource | CachedCosts | None = None
) -> list[Instance]:
    """Every kernel instance the plans of `func` can use (module doc), each once.
    `func` should be in the form select-kernels plans (`planner.select.prepare`).

    Without `costs`: in walk order (each op's options in turn, copies last). With `costs`
    (what select-kernels costs from): the likely winners first, round-robin by rank over
    every op: each op's options ranked by their cost per op they cover (`_ranks`), an
    instance at its best rank over the ops that have it, a copy at the best rank of the
    instances whose types it moves; ties in walk order."""
    found: dict[tuple, Instance] = {}
    ranks: dict[tuple, float] = {}
    cached = costs if costs is None or isinstance(costs, CachedCosts) else CachedCosts(costs)
    _walk(func.body, ctx, found, set(), ranks, cached)
    spaces = ctx.spaces()
    if len(spaces) > 1:
        for inst in list(found.values()):
            served = ranks.get(inst.key(), math.inf)
            for t in (*inst.operand_types, *inst.result_types):
                for src, dst in COPY_KERNELS:
                    kernel = copy_kernel(src, dst)
                    if kernel is None or src not in spaces or dst not in spaces:
                        continue
                    copy = Instance(kernel, (t.with_encoding(src),), (t.with_encoding(dst),))
                    found.setdefault(copy.key(), copy)
                    ranks[copy.key()] = min(ranks.get(copy.key(), math.inf), served)
    insts = list(found.values())
    if cached is None:
        return insts
    # sorted is stable: ties keep walk order
    return sorted(insts, key=lambda inst: ranks.get(inst.key(), math.inf))


def _walk(
    block: Block,
    ctx: PlanContext,
    found: dict,
    visited: set,
    ranks: dict,
    costs: CachedCosts | None,
) -> None:
    bo = ctx.block_options(block)
    for op in bo.ops:
        kernels: list[tuple[Option, Instance]] = []
        for option in bo.options[op]:
            if option.kind == DECOMPOSE:
                key = option.decomposition.key
                if key not in visited:
                    visited.add(key)
                    _walk(ctx.nested(option).block, ctx, found, visited, ranks, costs)
                continue
            inst = instance_of(option)
            if not is_constant(inst.kernel):
                found.setdefault(inst.key(), inst)
            kernels.append((option, inst))
        if costs is not None:
            for rank, inst in _ranks(kernels, costs):
                ranks[inst.key()] = min(ranks.get(inst.key(), math.inf), rank)


def is_constant(kernel: Kernel) -> bool:
    """A kernel of an op that reads nothing and costs nothing when it runs (a constant): its
    data is known before the run (planner/fixed.py runs it once), so it is never measured."""
    cls = OPS.get(kernel.op) if kernel.op is not None else None
    return cls is not None and FREE in cls.traits and not cls.operand_defs


def _ranks(kernels: list[tuple[Option, Instance]], costs: CachedCosts):
    """(rank, instance) for one op's kernel options, 0 the cheapest. An option is costed as
    select-kernels costs it (its tuned parameters where measured), divided by the ops it
    covers: a fused kernel replaces that many, so its whole time against one op kernel's
    would rank every fusion last. A cost the source cannot give ranks last."""

    def per_op(item: tuple[Option, Instance]) -> float:
        option, inst = item
        try:
            seconds = costs.cost(inst.kernel, inst.operand_types, inst.result_types).seconds
        except LookupError:  # e.g. the roofline knows no device for this backend
            return math.inf
        return seconds / max(len(option.ops), 1)

    ordered = sorted(kernels, key=per_op)
    return [(rank, inst) for rank, (_, inst) in enumerate(ordered)]


def instance_of(option: Option) -> Instance:
    kernel, p = option.kernel, option.space
    attrs = {}
    if kernel.op is not None:
        attrs = {k: v for k, v in option.root.attributes.items() if "." not in k}
    return Instance(
        kernel,
        tuple(v.type.with_encoding(p) for v in option.inputs),
        tuple(v.type.with_encoding(p) for v in option.outputs),
        attrs,
        kernel.default_params,
    )


# -- one measurement -------------------------------------------------------------------------------


def reference_function(inst: Instance) -> FuncOp:
    """The instance's meaning as a function on host types: the op with its attributes (an op
    kernel), or the kernel's first reference graph that fits the types (a graph kernel).
    Raises TypeError when none fits."""
    ins = [t.with_encoding(None) for t in inst.operand_types]
    outs = [t.with_encoding(None) for t in inst.result_types]
    kernel = inst.kernel
    if kernel.op is None:
        problems = []
        for ref in canonical_references(kernel):
            try:
                return instantiate_reference(ref, ins, kernel.shape_constants)
            except TypeError as e:
                problems.append(str(e))
        raise TypeError("; ".join(problems) or f"kernel {kernel.name} has no reference graph")
    cls = OPS.get(kernel.op)
    if cls is None:
        raise TypeError(f"op '{kernel.op}' is not registered")
    func = FuncOp.build("reference", ins, outs)
    op = func.body.append(create(cls, list(func.body.args), dict(inst.attrs), outs))
    func.body.append(ReturnOp(list(op.results), []))
    return func


def _allowed_error(kernel: Kernel, native: float, types) -> float:
    floor = 0.0
    for t in types:
        if t.is_float:
            floor = max(floor, ULPS * float(ml_dtypes.finfo(t.dtype).eps))  # bf16 too
    return kernel.max_rel_error + max(NATIVE_FACTOR * native, floor)


def _max_error(got: list, want: list, error: Callable = rel_error) -> float:
    """The largest `rel_error` over the results (`error`: the same on a device's tensors)."""
    if len(got) != len(want):
        return math.inf
    return max((error(g, w) for g, w in zip(got, want)), default=0.0)


class HostCheck:
    """An instance checked on the host with numpy: inputs from `random_inputs`, the reference
    run by the interpreter, the kernel's operands made with its space's `from_host` and its
    results brought back with `to_host`. The interface `measure` checks through (as
    planner/torch_check.py's `TorchCheck`): `operands(types, backend)`, `results(outs,
    backend)`, `reference(precision)` and `error(got, want)`."""

    def __init__(self, ref: FuncOp, space: str | None, seed: int) -> None:
        from tgc.runtime.interpreter import random_inputs

        self.ref, self.space = ref, SPACES[space]
        self.inputs = random_inputs(ref, seed)

    def operands(self, types: tuple[TensorType, ...], backend) -> list:
        return [
            backend.adopt(self.space.from_host(np.asarray(x), t))
            for x, t in zip(self.inputs, types)
        ]

    def results(self, outs: list, backend) -> list[np.ndarray]:
        return [np.asarray(self.space.to_host(backend.release(v))) for v in outs]

    def reference(self, precision: str) -> list[np.ndarray]:
        from tgc.runtime.interpreter import run_function

        return run_function(self.ref, self.inputs, precision)

    error = staticmethod(rel_error)


# Kernel backends whose presence means PyTorch is loaded (and torch_check may be imported).
TORCH_BACKENDS = ("torch-cpu", "torch-cuda")


def checker(inst: Instance, ref: FuncOp, seed: int):
    """How `measure` checks `inst` (its reference function `ref`) on inputs drawn from `seed`:
    with PyTorch on the device of the kernel's space where planner/torch_check.py can evaluate
    the reference there (the torch backend of that space registered, every op one it
    evaluates), so nothing of the instance's size crosses to the host; else on the host with
    numpy."""
    space = inst.kernel.space
    if any(name in BACKENDS for name in TORCH_BACKENDS):
        from tgc.planner import torch_check

        if torch_check.unsupported(ref, space) is None:
            return torch_check.TorchCheck(ref, space, seed)
    return HostCheck(ref, space, seed)


# space -> how to wait for the work queued there (the host needs nothing)
SYNCHRONIZE: dict[str | None, Callable[[], None]] = {None: lambda: None}


def _cuda_synchronize() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
    try:
        import pycuda.driver as drv

        if drv.Context.get_current() is not None:
            drv.Context.synchronize()
    except ImportError:
        pass


SYNCHRONIZE["cuda"] = _cuda_synchronize


@dataclass
class Timing:
    median: float
    min: float
    spread: float  # (90th - 10th percentile) / median
    runs: int
    noisy: bool = False  # the spread stayed above NOISY_SPREAD in every attempt
    attempts: int = 1  # how many times the call was timed (steady_time)
    device_median: float | None = None  # the queued work alone (timed with `queued`)


def time_call(
    call: Callable[[], object], sync: Callable[[], None], min_time: float, queued=None
) -> Timing:
    """Warm up, then time `call` as often as fits in `min_time` (MIN_RUNS..MAX_RUNS).

    With `queued` (a space's `time_queued`), each call costs the longer of the work it queued,
    timed on the device, and the host's time to queue it: what it adds to a plan whose host runs
    ahead of the device; `device_median` is the work's alone, what the call adds to a plan
    replayed as a CUDA graph (no host queues it there). Otherwise the host's clock around each
    synchronised call."""
    sync()
    call()  # warm-up: first-call costs (allocation, caches, compilation) are not the kernel's
    sync()
    start = time.perf_counter()
    call()
    sync()
    first = time.perf_counter() - start
    runs = int(min(MAX_RUNS, max(MIN_RUNS, min_time / max(first, 1e-9))))
    device_median = None
    if queued is not None:
        device, host = queued(call, runs, first)
        times = np.maximum(device, host)
        device_median = float(np.median(device))
    else:
        times = np.empty(runs)
        for i in range(runs):
            sync()
            start = time.perf_counter()
            call()
            sync()
            times[i] = time.perf_counter() - start
    median = float(np.median(times))
    p10, p90 = np.percentile(times, [10, 90])
    spread = float((p90 - p10) / median) if median else 0.0
    return Timing(median, float(times.min()), spread, runs, device_median=device_median)


def steady_time(
    call: Callable[[], object], sync: Callable[[], None], min_time: float, queued=None
) -> Timing:
    """`time_call`, taken again while its spread is above NOISY_SPREAD, up to MAX_ATTEMPTS
    times in all: the first steady timing, else the steadiest one, marked noisy."""
    steadiest = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        timing = time_call(call, sync, min_time, queued)
        if timing.spread <= NOISY_SPREAD:
            return replace(timing, attempts=attempt)
        if steadiest is None or timing.spread < steadiest.spread:
            steadiest = timing
    return replace(steadiest, noisy=True, attempts=MAX_ATTEMPTS)


def measure(inst: Instance, min_time: float = MIN_TIME, origin: str = "profile") -> Measurement:
    """Check the instance against float64, then time it (module doc); a failure is a
    Measurement with status 'failed' and the reason. The call checked is the call timed: the
    backend's, on values in its own representation."""
    if inst.kernel.op == "kernel.copy":
        return _measure_copy(inst, min_time, origin)
    kernel = inst.kernel
    try:
        ref = reference_function(inst)
    except TypeError as e:
        return _failure(inst, f"no float64 reference to check it against: {e}", None, origin)
    invoke = _invocation(inst, ref)
    if isinstance(invoke, str):
        return _failure(inst, invoke, None, origin)
    backend, space = BACKENDS[kernel.backend], SPACES[kernel.space]
    host_outs = [t.with_encoding(None) for t in inst.result_types]
    with np.errstate(all="ignore"):
        try:
            check = checker(inst, ref, secrets.randbits(32))
            want = check.reference("f64")
        except TgcError as e:  # e.g. indices computed in the graph, out of range when random
            message = f"its reference cannot be evaluated on random inputs: {e.message}"
            return _failure(inst, message, None, origin)
        try:
            values = check.operands(inst.operand_types, backend)
            got = check.results(invoke(values), backend)
        except Exception as e:  # noqa: BLE001  (a kernel that raises is a failed kernel)
            return _failure(inst, f"raised {type(e).__name__}: {e}", None, origin)
        error = _max_error(got, want, check.error)
        # The op-by-op evaluation in the program's types only widens the allowance: it is run
        # only where the error exceeds the allowance without it (the same verdict, one
        # evaluation of the reference fewer for every kernel that passes on that alone).
        allowed = _allowed_error(kernel, 0.0, host_outs)
        if not error <= allowed:
            native = _max_error(check.reference("native"), want, check.error)
            allowed = _allowed_error(kernel, native, host_outs)
    del want, got  # the check's arrays, possibly of GPU size, are not kept while timing
    if not error <= allowed:
        message = f"wrong result: error {error:.3g} against float64 exceeds {allowed:.3g}"
        return _failure(inst, message, error, origin)
    sync = SYNCHRONIZE.get(kernel.space, SYNCHRONIZE[None])
    with np.errstate(all="ignore"):
        timing = steady_time(lambda: invoke(values), sync, min_time, space.time_queued)
    return _success(inst, timing, error, origin)


def _invocation(inst: Instance, ref: FuncOp) -> Callable[[list], list] | str:
    """How the executor would call the instance, on the backend's values; a string says why
    it cannot be called here. A kernel with a `run` goes through `Backend.call`; a generated
    kernel (no `run`: a fused CUDA region) through `run_region` of the call select-kernels
    would write for it."""
    kernel = inst.kernel
    backend = BACKENDS.get(kernel.backend)
    if backend is None:
        return f"the {kernel.backend} backend is not loaded here"
    if kernel.run is not None:
        attrs, outs = {**inst.attrs, **inst.params}, list(inst.result_types)
        return lambda values: backend.call(kernel, values, dict(attrs), outs)
    if backend.run_region is None:
        return f"kernel {kernel.name} has no run and the {kernel.backend} backend no run_region"
    call = region_call(inst, ref)
    return lambda values: backend.run_region(call, values)


def region_call(inst: Instance, ref: FuncOp):
    """`kernel.call @kernel(args) { reference ops in the kernel's space; kernel.yield }`, as
    select-kernels writes a graph kernel's call (planner/select.py), in a scratch function."""
    from tgc.dialects.kernel import CallOp, YieldOp
    from tgc.ir import Region

    space = inst.kernel.space
    scratch = FuncOp.build("measure", list(inst.operand_types), list(inst.result_types))
    body = Block(list(inst.operand_types))
    env = dict(zip(ref.body.args, body.args))
    for op in ref.body.ops:
        if op is ref.body.last:
            body.append(YieldOp([env[v] for v in op.operands], [], loc=op.loc))
            break
        types = [r.type.with_encoding(space) for r in op.results]
        clone = type(op)([env[v] for v in op.operands], types, dict(op.attributes), loc=op.loc)
        body.append(clone)
        env.update(zip(op.results, clone.results))
    attrs = {"callee": inst.kernel.name}
    attrs.update(inst.kernel.param_attributes(inst.params))  # as select-kernels writes them
    call = create(CallOp, list(scratch.body.args), attrs, list(inst.result_types), [Region([body])])
    return scratch.body.append(call)


def compile_ahead(insts: list[Instance]) -> None:
    """The generated kernels of `insts` compiled at once by each backend that can
    (Backend.compile_regions), so that measuring them one by one waits for no compile. A kernel
    that fails to compile here fails again, with its message, when it is measured."""
    batches: dict[str, list] = {}
    for inst in insts:
        backend = BACKENDS.get(inst.kernel.backend)
        generated = inst.kernel.run is None and inst.kernel.op != "kernel.copy"
        if not generated or backend is None or backend.compile_regions is None:
            continue
        try:
            call = region_call(inst, reference_function(inst))
        except TypeError:  # no reference: `measure` says so
            continue
        batches.setdefault(backend.name, []).append(call)
    for name, calls in batches.items():
        try:
            BACKENDS[name].compile_regions(calls)
        except TgcError:
            pass  # said by the failing kernel's own measurement


def _measure_copy(inst: Instance, min_time: float, origin: str) -> Measurement:
    src, dst = inst.operand_types[0], inst.result_types[0]
    host = src.with_encoding(None)
    rng = np.random.default_rng(secrets.randbits(32))
    # never zero; an array even at rank 0 (arithmetic on a 0-d array gives a numpy scalar)
    value = np.asarray(rng.standard_normal(host.shape) + 2.0, dtype=host.dtype)
    source, target = SPACES[src.encoding], SPACES[dst.encoding]
    start = source.from_host(value, src)
    back = np.asarray(SPACES[dst.encoding].to_host(target.from_host(source.to_host(start), dst)))
    error = rel_error(back, value)
    if error != 0.0:
        return _failure(
            inst, f"wrong result: the copy changed the value ({error:.3g})", error, origin
        )

    def sync() -> None:
        SYNCHRONIZE.get(src.encoding, SYNCHRONIZE[None])()
        SYNCHRONIZE.get(dst.encoding, SYNCHRONIZE[None])()

    timing = steady_time(lambda: target.from_host(source.to_host(start), dst), sync, min_time)
    return _success(inst, timing, 0.0, origin)


def _base(inst: Instance, origin: str) -> dict:
    return {
        "kernel": kernel_info(inst.kernel),
        "device": device_of(inst.kernel),
        "signature": inst.signature,
        "dtypes": dtypes_of(inst.operand_types, inst.result_types),
        "params": dict(inst.params),
        "attrs_key": inst.attrs_key,
        "attrs": inst.attrs_text,
        "bytes": instance_bytes(inst.operand_types, inst.result_types),
        "flops": instance_flops(inst.kernel, inst.operand_types, inst.result_types),
        "origin": origin,
    }


def _failure(inst: Instance, message: str, error: float | None, origin: str) -> Measurement:
    return Measurement(**_base(inst, origin), status=FAILED, max_error=error, message=message)


def _success(inst: Instance, timing: Timing, error: float, origin: str) -> Measurement:
    # A time is a positive number (the database refuses others): a call faster than the
    # clock's resolution is recorded at a nanosecond.
    return Measurement(
        **_base(inst, origin),
        status=OK,
        median=max(timing.median, MIN_SECONDS),
        min=max(timing.min, MIN_SECONDS),
        spread=timing.spread,
        runs=timing.runs,
        max_error=error,
        noisy=timing.noisy,
        device_median=None
        if timing.device_median is None
        else max(timing.device_median, MIN_SECONDS),
    )


# -- known and unknown --------------------------------------------------------------------------------


def unknown(insts: list[Instance], db: Database | None, since: float = 0.0) -> list[Instance]:
    """The instances with no record (success or failure) on this device made at `since`
    (seconds since the epoch) or later."""
    if db is None:
        return list(insts)
    known: dict[tuple[str, str, str], set] = {}
    out = []
    for inst in insts:
        kernel, device = kernel_info(inst.kernel), device_of(inst.kernel)
        # Kernels of one name are told apart by their source hash: every generated region of a
        # template is a "cuda.elementwise" (keyed by name alone, all but the first region
        # looked unknown, and each run measured them again).
        # Looked up by these keys, not by row ids (a concurrent prune may reuse an id).
        ids = (kernel.name, kernel.source_hash, device.fingerprint)
        if ids not in known:
            known[ids] = db.known_instances(kernel, device, since)
        if (inst.signature, params_text(inst.params), inst.attrs_key) not in known[ids]:
            out.append(inst)
    return out


# -- progress -----------------------------------------------------------------------------------------


class Progress:
    """Counts and an ETA on stderr: tqdm's bar where tqdm is installed; else one line, redrawn
    on a terminal and printed per item elsewhere (a log)."""

    def __init__(self, total: int, what: str, enabled: bool = True, stream=None) -> None:
        self.total, self.what, self.enabled = total, what, enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.start = time.monotonic()
        self.bar = None
        if enabled and total:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=what, unit="kernel", file=self.stream)
            except ImportError:
                pass

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(_short(label, 40), refresh=False)
            self.bar.update(1)
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        line = f"{self.what}: {self.done}/{self.total}, ETA {eta:.0f} s: {_short(label)}"
        if self.stream.isatty():
            self.stream.write("\r\x1b[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.done and self.stream.isatty():
            self.stream.write("\n")


# -- a run --------------------------------------------------------------------------------------------


@dataclass
class Report:
    instances: int = 0  # distinct instances of the module
    known: int = 0  # already recorded before this run
    measured: int = 0  # recorded by this run (successes)
    noisy: int = 0  # of those, flagged noisy (their spread stayed large)
    failed: int = 0  # recorded as failures by this run
    left: int = 0  # not measured: the budget ran out
    tuned: int = 0  # parameter points measured by tuning
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{self.instances} kernel instance(s)",
            f"{self.known} already known",
            f"{self.measured} measured",
            f"{self.failed} failed",
        ]
        if self.noisy:
            parts.append(
                f"{self.noisy} noisy (kept and flagged; `tgc-db prune --noisy` lets a quieter "
                "run measure them again)"
            )
        if self.tuned:
            parts.append(f"{self.tuned} parameter point(s) tuned")
        if self.left:
            parts.append(f"{self.left} left by the budget (run again to go on)")
        return ", ".join(parts)


class Profiler:
    """Measures instances into a database (module doc)."""

    def __init__(
        self,
        db: Database,
        budget: float | None = None,
        min_time: float = MIN_TIME,
        progress: bool = True,
        measure_fn: Callable[..., Measurement] = measure,
    ) -> None:
        self.db = db
        self.deadline = math.inf if budget is None else time.monotonic() + budget
        self.min_time = min_time
        self.progress = progress
        self.measure = measure_fn

    def out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline

    def run(
        self, insts: list[Instance], tune: bool = False, force: bool = False, since: float = 0.0
    ) -> Report:
        """Measure the instances the database does not know (every one with `force`; a record
        made before `since`, seconds since the epoch, counts as unknown), then tune."""
        todo = list(insts) if force else unknown(insts, self.db, since)
        report = Report(instances=len(insts), known=len(insts) - len(todo))
        bar = Progress(len(todo), "measuring", self.progress)
        try:
            for i, inst in enumerate(self._until_deadline(todo, report)):
                if i % COMPILE_AHEAD == 0:
                    compile_ahead(todo[i : i + COMPILE_AHEAD])
                m = self.measure(inst, self.min_time)
                self.db.record(m)
                self._count(report, inst, m)
                bar.step(inst.kernel.name)
        finally:
            bar.close()
        if tune and not self.out_of_time():
            from tgc.planner.tune import tune_all

            report.tuned = tune_all(insts, self, report)
        return report

    def _until_deadline(self, todo: list[Instance], report: Report) -> Iterator[Instance]:
        for i, inst in enumerate(todo):
            if self.out_of_time():
                report.left = len(todo) - i
                return
            yield inst

    def _count(self, report: Report, inst: Instance, m: Measurement) -> None:
        if m.ok:
            report.measured += 1
            report.noisy += m.noisy
        else:
            report.failed += 1
            report.failures.append(f"{inst.describe()}: {m.message}")

"""What the backend returns to Dynamo for one captured graph: a callable that compiles the
graph with tgc once per set of argument shapes, and runs it eagerly where tgc cannot.

Dynamo may hand over a graph with symbolic sizes (after a second shape it marks the sizes that
changed dynamic, and passes their values as int arguments); tgc compiles static shapes, so the
graph is lowered again at each new set of shapes a call brings (no buckets, no padding), and
the compiled form is kept for the next call with those shapes. Only the graph's first set of
shapes is measured with the full `measure_budget`; a later one (a new prompt length) is planned
from the database's estimates for unseen shapes, measuring at most `new_shapes_measure_budget`
seconds, which makes a new length a plan and its kernels' builds rather than minutes of
measuring. A graph tgc cannot compile (an op with no
lowering, an export that fails, a device with no route) runs as Dynamo captured it, the
GraphModule's own forward, and the reason is logged once (tally.py); so is a compiled graph
that fails when it runs, which is then run eagerly from then on. Never a crash: the eager graph
is what torch.compile would run without this backend.

With the option `compare_eager` (the default), a graph compiled for a new set of shapes is
timed on its first call beside the graph run eagerly (RACE_CALLS calls each, after
RACE_WARMUP to warm up), and the faster runs at those shapes from then on: tgc never makes a graph slower than
torch.compile without it would run it. A graph that writes its inputs in place is timed too
where those inputs are small (RACE_RESTORE_BYTES: a decode step's position counters), saved
and put back around each timed call; one that writes more runs in tgc untimed.

tgc compiles for inference: its results have no autograd history. A call that autograd would
record (grad mode on, an input requiring grad: a model's parameters, outside torch.no_grad())
runs eagerly, said once per graph, so that a backward through it still works.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from tgc.diagnostics import UNKNOWN_LOC, TgcError
from tgc.dynamo import tally
from tgc.dynamo.lowering import lower_graph, static_inputs
from tgc.dynamo.options import BackendOptions

# Node kinds that are work (placeholders, get_attr and the output are not).
OP_NODES = ("call_function", "call_method", "call_module")


# Compiled forms kept per graph, the least recently used dropped first: a loop over many
# shapes (a prompt growing token by token) must not keep a plan for every one of them.
MAX_SHAPES = 32
RACE_CALLS = 3  # timed calls of each of tgc and eager, to choose between them
# calls of each before those: on the GPU the route's first call with given buffers runs kernel
# by kernel and the second captures a CUDA graph (planner/graphs.py), so only from the third on
# is tgc timed as it will run
RACE_WARMUP = 3
# The most bytes of updated inputs a graph may have and still be timed beside eager (saved
# and put back around each timed call): a decode step's counters, a scaled input; never a KV
# cache, whose graph runs in tgc untimed.
RACE_RESTORE_BYTES = 1 << 20


class CompiledGraph:
    """The backend's answer for one Dynamo graph (module doc)."""

    def __init__(self, gm: torch.fx.GraphModule, options: BackendOptions, name: str) -> None:
        self.gm = gm
        self.options = options
        self.name = name
        self.ops = sum(1 for n in gm.graph.nodes if n.op in OP_NODES)
        # shape key -> the compiled form, or `self.eager` where tgc could not compile
        self.runners: OrderedDict[tuple, Callable[[list], object]] = OrderedDict()
        self.eager = self._run_eagerly  # one object, so that `runner is self.eager` holds
        self.said_autograd = False
        self.unraced: set[tuple] = set()  # shapes compiled and not yet timed beside eager
        self.compiles = 0  # sets of shapes lowered so far (the first gets the full budget)

    def __call__(self, *args):
        args = list(args)
        if records_autograd(args):
            # tgc's results carry no autograd history: a backward through them would fail
            if not self.said_autograd:
                tally.needs_autograd(self.name)
                self.said_autograd = True
            return self.eager(args)
        key = shape_key(args)
        runner = self._runner(args)
        if runner is self.eager:
            return self.eager(args)  # the model's own errors are raised as eager raises them
        try:
            if key in self.unraced:
                self.unraced.discard(key)
                runner = self.runners[key] = self._faster(runner, args)
            return runner(args)
        # tgc's failure: the updates are copied back last, so none was made, but for rows
        # written into a donated cache, which eager then writes again (the same rows)
        except Exception as e:
            tally.failed_when_run(self.name, self.ops, reason(e))
            self.runners[shape_key(args)] = self.eager
            return self.eager(args)

    def _runner(self, args: list) -> Callable[[list], object]:
        key = shape_key(args)
        runner = self.runners.get(key)
        if runner is None:
            runner = self.runners[key] = self._compile(args)
            if runner is not self.eager and self.options.compare_eager and _raceable(runner, args):
                self.unraced.add(key)
            if len(self.runners) > MAX_SHAPES:
                self.runners.popitem(last=False)
        else:
            self.runners.move_to_end(key)
        return runner

    def _run_eagerly(self, args: list):
        return self.gm(*args)

    def _faster(self, runner: Callable[[list], object], args: list):
        """`runner` or `self.eager`, whichever runs `args` faster (module doc). tgc's failure
        here is raised (the caller runs eagerly from then on); eager's keeps tgc. The inputs
        the graph updates are saved first, put back before every timed call and once more
        after them, so the call that follows makes its updates once."""
        written = runner.lowered.updated
        with torch.no_grad():
            saved = [args[i].clone() for i in written]

        def restore() -> None:
            with torch.no_grad():
                for i, value in zip(written, saved):
                    args[i].copy_(value)

        def restored(run):
            if not written:
                return run

            def call(a):
                restore()
                return run(a)

            # its name too, where it has one (the tests' stand-in timer tells eager by it)
            return functools.update_wrapper(call, run, assigned=("__name__",), updated=())

        try:
            tgc_s = _seconds_per_call(restored(runner), args)
            try:
                eager_s = _seconds_per_call(restored(self.eager), args)
            except Exception:  # noqa: BLE001  (the model's own error: tgc ran it, keep tgc)
                return runner
        finally:
            restore()
        if eager_s < tgc_s:
            tally.slower_than_eager(self.name, self.ops, tgc_s, eager_s)
            return self.eager
        return runner

    def _compile(self, args: list) -> Callable[[list], object]:
        options = self.options
        if self.compiles:  # the graph met again at new shapes (module doc)
            options = replace(options, measure_budget=options.new_shapes_measure_budget)
        self.compiles += 1
        start = time.perf_counter()
        try:
            runner = self._lowered_runner(args, options)
        except Exception as e:  # whatever stops tgc here, the graph still runs
            tally.fell_back(self.name, self.ops, reason(e))
            return self.eager
        shapes = describe_arguments(args, static_inputs(self.gm, args))
        seconds = time.perf_counter() - start
        tally.compiled(self.name, self.ops, shapes, seconds, runner.lowered.seconds)
        return runner

    def _lowered_runner(self, args: list, options: BackendOptions) -> Callable[[list], object]:
        scalars = _host_scalars(args)
        devices = {
            a.device.type
            for i, a in enumerate(args)
            if isinstance(a, torch.Tensor) and i not in scalars
        }
        if len(devices) > 1:
            raise TgcError(f"its inputs are on several devices ({', '.join(sorted(devices))})")
        device = devices.pop() if devices else "cpu"
        if device not in ("cpu", "cuda"):
            raise TgcError(f"its inputs are on a '{device}' device; tgc runs on cpu and cuda")
        if device == "cuda":
            from tgc.dynamo.cuda import CudaGraph

            moved = scalars_on_device(args, scalars)
            lowered = lower_graph(self.gm, moved, static_inputs(self.gm, moved))
            runner = CudaGraph(lowered, options)
            return _ScalarsMoved(runner, scalars) if scalars else runner
        lowered = lower_graph(self.gm, args, static_inputs(self.gm, args))
        from tgc.dynamo.host import HostGraph

        return HostGraph(lowered, options)


def host_scalar(value) -> bool:
    """Whether `value` is a 0-d CPU tensor: PyTorch lets one join a GPU computation as a
    scalar (a Hugging Face StaticCache layer's `cumulative_length` is one, read by its layer's
    part of the decode step)."""
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0


def _host_scalars(args: list) -> list[int]:
    """The positions of `host_scalar`s among `args`."""
    return [i for i, a in enumerate(args) if host_scalar(a)]


def scalars_on_device(args: Sequence, positions: list[int]) -> list:
    """`args` with the 0-d CPU tensors at `positions` copied to the device."""
    moved = list(args)
    for i in positions:
        moved[i] = args[i].to("cuda")
    return moved


class _ScalarsMoved:
    """A GPU graph that also reads 0-d CPU tensors: each call copies them to the device (one
    scalar copy each) and copies back those the graph updates in place."""

    def __init__(self, runner, positions: list[int]) -> None:
        self.runner = runner
        self.lowered = runner.lowered
        self.positions = positions
        updated = set(runner.lowered.updated)
        self.written = [i for i in positions if i in updated]

    def __call__(self, args: list):
        moved = scalars_on_device(args, self.positions)
        out = self.runner(moved)
        for i in self.written:
            args[i].copy_(moved[i])
        return out


def _raceable(runner, args: list) -> bool:
    """Whether the compiled graph may be timed beside eager: the inputs it updates in place are
    at most RACE_RESTORE_BYTES (saved and put back around each timed call)."""
    lowered = getattr(runner, "lowered", None)
    if lowered is None:
        return False
    written = lowered.updated
    return sum(args[i].numel() * args[i].element_size() for i in written) <= RACE_RESTORE_BYTES


def _seconds_per_call(run: Callable[[list], object], args: list) -> float:
    """The median of RACE_CALLS timed calls of `run(args)` after RACE_WARMUP to warm up, the
    device synchronised after each where an argument is on a GPU."""
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    for _ in range(RACE_WARMUP):
        run(args)
    sync()
    times = []
    for _ in range(RACE_CALLS):
        start = time.perf_counter()
        run(args)
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def records_autograd(args: Sequence) -> bool:
    """Whether autograd would record this call: grad mode on and some input requiring grad (a
    model's parameters do, unless it runs under torch.no_grad() or torch.inference_mode())."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def shape_key(args: Sequence) -> tuple:
    """What a compiled form depends on: each tensor's shape, dtype and device, and the value
    of every other argument (the sizes Dynamo passes for symbolic dims)."""
    return tuple(
        (a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a) for a in args
    )


def describe_arguments(args: list, statics: set[int]) -> str:
    """`(2x8 int64, 12) and 28 parameters`: the inputs' shapes, the parameters counted."""
    parts = []
    for i, a in enumerate(args):
        if i in statics:
            continue
        if isinstance(a, torch.Tensor):
            dims = "x".join(str(d) for d in a.shape) or "scalar"
            parts.append(f"{dims} {str(a.dtype).removeprefix('torch.')}")
        else:
            parts.append(repr(a))
    text = "(" + ", ".join(parts) + ")"
    return text + (f" and {len(statics)} parameter(s) or buffer(s)" if statics else "")


def reason(e: BaseException) -> str:
    """One line saying why: a TgcError's message at its model source line, or another
    exception's type and first line."""
    if isinstance(e, TgcError):
        where = f" (at {e.loc})" if e.loc is not None and e.loc != UNKNOWN_LOC else ""
        return e.message + where
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__

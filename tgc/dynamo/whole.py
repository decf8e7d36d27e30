"""Each call of a Dynamo graph on the GPU replayed as one CUDA graph (the option `whole_graphs`),
as `torch.compile(mode="reduce-overhead")` replays its calls.

The route replays each planned function as its own CUDA graph (planner/graphs.py), but a call
still costs the host its Python work on every token: the arguments' views, the copies of inputs
that moved, the results handed back (until 2026-11-29 a decode step was also cut into L + 1
functions at its cache writes, with PyTorch's row writes between). `WholeGraphCalls` wraps the
backend's callable for one Dynamo graph: per set of argument shapes, the first `WARMUP` calls
run as they are (tgc compiles, measures, runs its once steps, captures nothing of its own that
a replay would miss), the next is captured whole into one CUDA graph on the route's capture
stream (tgc's kernels and cuBLAS sent there with `launching_on`, PyTorch's work following its
current stream, the planner's own replays run kernel by kernel inside: graphs.py), and every
later call replays it.

A capture bakes in addresses. An argument passed as the same memory on every warm-up call (a
parameter, a KV cache) is read and written where it is; the others ("moving": token ids,
positions) are copied into buffers of the graph's own before each replay and copied back after
it, so an in-place update of one reaches the caller's tensor. A 0-d CPU tensor among GPU
arguments (a StaticCache's `cumulative_length`) is copied to the device for every call, warm-up
included, and copied back after it, all of a call's in one buffer per element type (one copy
each way), at the same address every call. A call whose fixed arguments come at other addresses
is captured for them: Hugging Face's generate() makes a new StaticCache for every call unless it
is given one, so each generate() after the first brings its cache at new addresses for all of
its decode steps (before, those calls all ran uncaptured, piece by piece: 10.3 ms a decode step
of a 1.1 B Llama on an H200, bench/results/generate-*). It is captured at once where the graph
captured last was replayed `REUSED` times; else the call runs as it is and the next one bringing
the same addresses is captured, so that arguments whose memory is new on every call cost no
capture per call. The last `CAPTURES` captures of a set of shapes are kept, the least recently
used dropped first. The outputs are the graph's buffers, cloned before they are handed out.

A replay runs no Python, so it does not see a weight changed in place after its capture (a
`load_state_dict`, an update between calls): the plan's once steps (weights packed, planner/
fixed.py) ran before the capture and are not in it, and the replay would read the old packing.
So a capture notes the version (PyTorch's count of in-place writes) of each fixed argument the
captured call did not write itself, 0-d CPU scalars' buffers aside; a call that finds one
changed drops the set of shapes' graphs and runs as it is (the once steps run again, on the new
weights), and the next call is captured anew. A weight made under `torch.inference_mode()` has
no version: the plan runs its once steps on every call (tensors.py), in the capture too. A
capture that fails is said once (the logger "tgc") and that set of shapes runs as it is from
then on.

The CPU tests drive it with a stand-in capture (the bookkeeping: which arguments move, the
copies in and out, the clones, the fallback). On a GPU, test_dynamo_backend.py's test of an
MLP replayed whole and matched float64 eager, and a 1.1 B Llama's generate() replayed its
decode steps whole (bench/results/generate-*), which is why the option is on by default.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from tgc.dynamo.graph import host_scalar, records_autograd, reason, shape_key
from tgc.dynamo.tally import logger

WARMUP = 3  # plain calls per set of shapes before the capture (graphs.py captures at the 2nd)
CAPTURES = 4  # graphs kept per set of shapes, one per set of fixed arguments' addresses
# replays of the graph captured last after which new fixed addresses are captured at once
REUSED = 2


class _Shapes:
    """One set of argument shapes: warm-up state, then its graphs and the moving arguments'
    buffers they share (a call copies in, replays one graph, copies out)."""

    def __init__(self) -> None:
        self.calls = 0
        self.addresses: list[tuple[int, ...]] = []  # each warm-up call's argument addresses
        self.warm = False  # which arguments move is known (after the warm-up)
        self.failed = False
        self.moving: list[int] = []  # argument positions copied in and out
        self.fixed: tuple[int, ...] = ()  # argument positions read where they are
        self.static: dict[int, torch.Tensor] = {}  # the moving arguments' buffers
        self.pending: tuple[int, ...] | None = None  # fixed addresses met once, not captured
        self.last: tuple[int, ...] | None = None  # the fixed addresses captured last
        self.replays_of_last = 0  # the calls after its capture that replayed it
        # the fixed arguments' addresses -> the graph captured for them, least recently used first
        self.graphs: OrderedDict[tuple[int, ...], _Captured] = OrderedDict()


class _Captured:
    """One graph of a set of shapes: its replay, its outputs, and the fixed arguments it reads
    but does not write with their versions at the capture (module doc)."""

    def __init__(self, replay: Callable[[], None], outputs, watched: list[int], args) -> None:
        self.replay, self.outputs, self.watched = replay, outputs, watched
        self.versions = [args[i]._version for i in watched]

    def stale(self, args) -> bool:
        """Whether some argument it reads was written in place since the capture."""
        return any(args[i]._version != v for i, v in zip(self.watched, self.versions))


class WholeGraphCalls:
    """The backend's callable for one Dynamo graph, its calls replayed whole (module doc).
    `capture(run, static_args) -> (replay, outputs)` records `run(static_args)` into a graph
    and `on_device(tensor)` says whether a tensor is where graphs are captured (the real ones
    by default; the CPU tests hand stand-ins)."""

    def __init__(self, inner, name: str, capture=None, on_device=None, to_device=None) -> None:
        self.inner = inner
        self.name = name
        self.capture = capture or capture_cuda_graph
        self.on_device = on_device or (lambda t: t.is_cuda)
        self.to_device = to_device or (lambda t: t.to("cuda"))
        self.shapes: dict[tuple, _Shapes] = {}
        # the 0-d CPU arguments' device buffers, by their positions and element types
        self.staged: dict[tuple, list[tuple[list[int], torch.Tensor]]] = {}

    def __call__(self, *args):
        # one pass over the arguments (a decode step's are hundreds, and this is host time on
        # every token): the 0-d CPU tensors, and whether every other tensor is on the device
        scalars, on_device = [], False
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            if self.on_device(a):
                on_device = True
            elif host_scalar(a):
                scalars.append(i)
            else:
                return self.inner(*args)  # a tensor elsewhere: nothing to capture
        if not on_device or records_autograd(args):
            return self.inner(*args)
        if not scalars:
            return self._call(args, ())
        # 0-d CPU tensors go to the device for every call, warm-up included, so that the calls
        # captured and the calls compiled are the same (a capture reads them from the device
        # copy); an update the graph made comes back, a copy the host waits for
        staged = self._staged(args, scalars)
        moved = list(args)
        for positions, buffer in staged:  # one copy to the device per element type
            buffer.copy_(torch.stack([args[i] for i in positions]))
            for k, i in enumerate(positions):
                moved[i] = buffer[k]  # at the same address every call: read where it is
        out = self._call(tuple(moved), scalars)
        for positions, buffer in staged:  # and one back
            values = buffer.cpu()
            for k, i in enumerate(positions):
                args[i].copy_(values[k])
        return out

    def _staged(self, args, scalars: list[int]) -> list[tuple[list[int], torch.Tensor]]:
        """The device buffers of the 0-d CPU arguments at `scalars`, one per element type, made
        on the first call that has them. A Llama's decode step has one per layer (a
        StaticCache's `cumulative_length`): before, each went to the device and back on its own,
        32 small copies a token, each of which the host waited for."""
        key = tuple((i, args[i].dtype) for i in scalars)
        staged = self.staged.get(key)
        if staged is None:
            groups: dict[torch.dtype, list[int]] = {}
            for i in scalars:
                groups.setdefault(args[i].dtype, []).append(i)
            staged = self.staged[key] = [
                (positions, self.to_device(torch.empty(len(positions), dtype=dtype)))
                for dtype, positions in groups.items()
            ]
        return staged

    def _call(self, args, staged: tuple | list):
        """One call: plain during the warm-up, else a replay (captured first where needed);
        `staged`: the positions of the 0-d CPU arguments' device buffers."""
        state = self.shapes.setdefault(shape_key(args), _Shapes())
        if state.failed:
            return self.inner(*args)
        if not state.warm:
            if state.calls < WARMUP:
                state.calls += 1
                state.addresses.append(_addresses(args))
                return self.inner(*args)
            _classify(state, args)
        fixed_at = tuple(args[i].data_ptr() for i in state.fixed)
        found = state.graphs.get(fixed_at)
        if found is not None and found.stale(args):
            # a weight changed in place: run as it is (the once steps see it), capture anew next
            state.graphs.clear()
            state.last = state.pending = None
            return self.inner(*args)
        if found is None:
            # New addresses: captured at once where the graph captured last has been replayed
            # (a generate()'s cache, kept for all of its steps), else only when the next call
            # brings them again, so that memory new on every call costs no capture per call
            reused = state.last is None or state.replays_of_last >= REUSED
            if not reused and state.pending != fixed_at:
                state.pending = fixed_at
                return self.inner(*args)
            found = self._capture(state, args, fixed_at, staged)
            if found is None:
                return self.inner(*args)
            state.last, state.replays_of_last = fixed_at, 0
        elif fixed_at == state.last:
            state.replays_of_last += 1
        state.graphs.move_to_end(fixed_at)
        for i in state.moving:
            state.static[i].copy_(args[i])
        found.replay()
        for i in state.moving:
            args[i].copy_(state.static[i])  # an update the graph made reaches the caller
        return pytree.tree_map(_clone, found.outputs)

    def _capture(self, state: _Shapes, args, fixed_at: tuple[int, ...], staged) -> _Captured | None:
        """A graph of this call for the fixed arguments' present addresses, kept in `state`;
        None where capturing failed (said once; the set of shapes runs as it is from then on)."""
        static_args = [state.static.get(i, a) for i, a in enumerate(args)]
        readable = [i for i in state.fixed if i not in staged and not args[i].is_inference()]
        before = [args[i]._version for i in readable]
        try:
            replay, outputs = self.capture(self.inner, static_args)
        except Exception as e:  # noqa: BLE001  (any capture failure: run the calls as they are)
            state.failed = True
            state.graphs.clear()
            logger.warning(
                "tgc: %s is not replayed as one CUDA graph: %s; its calls run as they are",
                self.name,
                reason(e),
            )
            return None
        # the arguments the call wrote (a cache) change on every call; the others are watched
        watched = [i for i, v in zip(readable, before) if args[i]._version == v]
        found = _Captured(replay, outputs, watched, args)
        if len(state.graphs) >= CAPTURES:
            state.graphs.popitem(last=False)
        state.graphs[fixed_at] = found
        return found


def _classify(state: _Shapes, args) -> None:
    """Which arguments move (another address on some warm-up call or this one) and which are
    read where they are; buffers for the moving ones."""
    seen = [*state.addresses, _addresses(args)]
    tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    state.moving = [i for i in tensor_at if len({s[i] for s in seen}) > 1]
    state.fixed = tuple(i for i in tensor_at if i not in state.moving)
    state.static = {i: args[i].detach().clone() for i in state.moving}
    state.warm = True


def _addresses(args) -> tuple[int, ...]:
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else -1 for a in args)


def _clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def capture_cuda_graph(run, static_args: list):
    """`run(*static_args)` captured into one CUDA graph on the route's capture stream (module
    doc): (replay, outputs). Capturing runs nothing on the device: the first replay does."""
    from tgc.planner.backends.cuda import capture_stream, launching_on

    torch.cuda.synchronize()
    stream = capture_stream()
    graph = torch.cuda.CUDAGraph()
    kept: list = []  # the cuda backend's allocations while capturing: the graph writes them
    with launching_on(stream, kept):
        with torch.cuda.graph(
            graph, stream=torch.cuda.ExternalStream(stream.handle), capture_error_mode="relaxed"
        ):
            outputs = run(*static_args)

    def replay() -> None:
        graph.replay()

    replay.kept = kept  # alive as long as the replay function
    return replay, outputs

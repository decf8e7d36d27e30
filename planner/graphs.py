"""CUDA-graph replay of a planned function: its device work captured once, replayed per call.

A plan of a model launches hundreds of kernels per call, and each costs the host several µs to
queue (more for a PyTorch kernel): on a small batch the host, not the GPU, sets the pace. A CUDA
graph records the launches of one call and replays them all with one host call, as
`torch.compile(mode="reduce-overhead")` does.

`GraphReplay(planned)` is called like the `PlannedFunction` it wraps, with device values:

- a graph is keyed by the arguments' buffers (device address, shape, element type): a capture
  bakes those addresses in. The first call with a key runs the plan as usual (compiling its
  kernels, running its once steps, letting the libraries make their handles and workspaces:
  none of which a capture may do); the second captures it; every later call replays it. A
  caller that passes new buffers on every call never captures and runs as before;
- the capture runs the plan's per-call steps on a stream of its own (PyTorch's graph API,
  `torch.cuda.graph`, which gives PyTorch's kernels a private memory pool for the graph; the
  cuda backend's launches and cuBLAS calls are sent to the same stream with
  `launching_on`). Every value of the captured run, and every buffer the cuda backend
  allocated while capturing (scratch a kernel gave back included), is kept with the graph, so
  no buffer it writes is given to anyone else while it lives; the arguments are kept too, so
  their addresses are not reused by other arrays;
- a replay is queued on PyTorch's current stream, so it is ordered after the caller's work
  there (the legacy default stream unless the caller chose another), and returns the captured
  run's result objects, which the next replay with the same key overwrites (as
  reduce-overhead's outputs are): copy a result to keep it past the next call;
- a call made while PyTorch's stream is capturing (a whole call of a Dynamo graph captured at
  once, tgc/dynamo/whole.py) runs kernel by kernel, its launches recorded in that capture;
- a plan some of whose per-call steps run on the host, or whose capture fails (a kernel that
  synchronises, a library that allocates in a way a capture refuses), runs as before;
  `reason` says why it is not replayed. Without PyTorch there is no graph API here (PyCUDA's
  build has none) and plans run as before.

At most `MAX_GRAPHS` graphs are kept per function, the least recently used dropped first: each
holds the memory of one run's values.
"""

from __future__ import annotations

from collections import OrderedDict

from tgc.planner.executor import PlannedFunction

MAX_GRAPHS = 4


class GraphReplay:
    """A `PlannedFunction` called through CUDA graphs where it can be (module doc)."""

    def __init__(self, planned: PlannedFunction) -> None:
        self.planned = planned
        self.func = planned.func
        self.reason = _why_not(planned)  # None: graphs are used
        self._capturing = _capture_probe() if self.reason is None else None
        self._seen: set[tuple] = set()
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.captures = 0
        self.replays = 0

    def __call__(self, values: list) -> list:
        if self.reason is not None or self._capturing():
            # inside a capture of the whole call (tgc/dynamo/whole.py) the plan's launches
            # are recorded there, kernel by kernel: a graph is not captured inside another
            return self.planned(values)
        key = _key(values)
        if key is None:  # a value that is not a device buffer
            return self.planned(values)
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            graph.replay()
            self.replays += 1
            return graph.results
        if key not in self._seen:  # the first call with these buffers: a plain run (doc)
            self._seen.add(key)
            return self.planned(values)
        try:
            graph = _capture(self.planned, values)
        except Exception as e:  # noqa: BLE001 - any capture failure means: do not replay
            self.reason = f"the capture failed: {type(e).__name__}: {e}".splitlines()[0]
            return self.planned(values)
        self.captures += 1
        self._graphs[key] = graph
        if len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        graph.replay()
        self.replays += 1
        return graph.results

    def forget(self) -> None:
        """Drop every graph and run the once steps again (a parameter changed in place)."""
        self._graphs.clear()
        self._seen.clear()
        self.planned.forget_params()


class _Graph:
    """One captured call: the graph, every value of the run (kept alive), its results."""

    def __init__(self, graph, env: list, results: list, arguments: list) -> None:
        self.graph = graph
        self.env = env
        self.results = results
        self.arguments = arguments

    def replay(self) -> None:
        self.graph.replay()


def _why_not(planned: PlannedFunction) -> str | None:
    host = planned.host_step()
    if host is not None:
        return f"a step of each call runs on the host: {host}"
    return _graph_api_problem()


def _capture_probe():
    """`() -> whether PyTorch's current stream is capturing a CUDA graph` (never, without
    PyTorch or a GPU), looked up once so that a replay pays only the call."""
    try:
        import torch
    except ImportError:
        return lambda: False
    if not torch.cuda.is_available():
        return lambda: False
    return torch.cuda.is_current_stream_capturing


def _graph_api_problem() -> str | None:
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (its graph API is the one used)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to PyTorch"
    return None


def _key(values: list) -> tuple | None:
    """The buffers a capture would bake in: (address, shape, element type) of each value."""
    key = []
    for value in values:
        interface = getattr(value, "__cuda_array_interface__", None)
        if interface is None and hasattr(value, "data_ptr"):
            key.append((value.data_ptr(), tuple(value.shape), str(value.dtype)))
        elif interface is not None:
            key.append((interface["data"][0], tuple(interface["shape"]), interface["typestr"]))
        else:
            return None
    return tuple(key)


def _capture(planned: PlannedFunction, values: list) -> _Graph:
    """Capture one call's per-call steps (module doc); the plan's once steps have run."""
    import torch

    from tgc.planner.backends.cuda import capture_stream, launching_on

    torch.cuda.synchronize()
    stream = capture_stream()
    graph = torch.cuda.CUDAGraph()
    torch_stream = torch.cuda.ExternalStream(stream.handle)
    allocated: list = []
    with launching_on(stream, allocated):
        # relaxed: the cuda backend's memory pool may allocate (cuMemAlloc) while capturing
        with torch.cuda.graph(graph, stream=torch_stream, capture_error_mode="relaxed"):
            env = planned.run_keeping(values)
    results = [env[i] for i in planned.returned]
    # kept with the graph: every value and scratch buffer of the run
    return _Graph(graph, [*env, *allocated], results, list(values))


__all__ = ["MAX_GRAPHS", "GraphReplay"]

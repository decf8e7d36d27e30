"""A graph's module on the GPU route (planner/route.py), torch CUDA tensors in and out.

Its tests are test_dynamo_backend.py's marked `cuda` (passed on a GPU: bench/results/gpu-tests-*)
and test_dynamo_generate.py's; the CPU route (host.py) has many more. It is kept thin so that
what it adds to the route is little: the route lowers, measures on first use (`measure_budget`, `db`), plans,
checks the whole plan and replays calls as CUDA graphs; this module hands it the tensors'
memory (`__cuda_array_interface__`, read without a copy by the cuda backend) and takes the
results back as tensors through the same interface.

A replay needs the arguments at the addresses its capture baked in (planner/graphs.py keys a
graph by them), and a model passes new tensors on every call (token ids, the previous graph's
outputs): an input that is not a parameter is copied into a buffer of this graph's own from the
second call whose tensor is another than the first's (`StableInputs`), so from the third call on
the calls are replays. An input passed as the same tensor every call (a KV cache) is read where
it is, never copied; one that comes at new memory and then keeps it (the next generate()'s
cache) is copied once and read where it is again from the second such call. A replayed call's
results are buffers the next replay overwrites, so each output is cloned on the device before it
is handed to the user; updates are copied into their tensors. Kernel-by-kernel calls are queued
on the legacy default stream (the route's; the plan's PyTorch kernels too, PyTorch's current
stream being set to it for the call), replays on PyTorch's current stream. Called on
another stream (inside `torch.cuda.stream(s)`), the call waits for s before it starts and s
waits for the call's work after it: PyTorch makes its streams non-blocking, so the legacy stream
would not wait for them by itself, and a call would read its inputs before the caller's writes
landed. Not while a whole call is being captured (whole.py): then every launch goes to the
capture's stream, and the legacy stream, which no capture may touch, is not asked to wait.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from tgc.dynamo.lowering import Lowered, kept_results
from tgc.dynamo.options import BackendOptions
from tgc.dynamo.tensors import ParamViews, as_tensor
from tgc.runtime.tensor_map import ALIGNMENT
from tgc.types import NUMPY_DTYPES

logger = logging.getLogger("tgc")


def _aligned(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself where its memory starts `ALIGNMENT`-byte aligned, else an aligned copy:
    the kernels that read through TMA tensor maps (sm_90's wgmma matmul and attention) need it,
    and refuse the launch otherwise, while a view into a tensor may start anywhere."""
    if tensor.data_ptr() % ALIGNMENT == 0:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _device_view(tensor: torch.Tensor) -> torch.Tensor:
    return _aligned(tensor.detach().contiguous())


class StableInputs:
    """Graph inputs at the same addresses on every call (module doc): `view(slot, tensor)` is
    the tensor itself while calls pass the same memory, else a buffer of this graph's own
    holding a copy of it (always for a tensor not contiguous or not 16-byte aligned:
    `_aligned`). A slot read where it is that comes with new memory on two calls in a
    row (the next generate()'s KV cache, kept for all of its steps) is read where it is again
    from the second, never copied after; memory new on every call (token ids) is copied into
    the buffer on each. Before, a slot was copied from the first new memory on: every layer's
    whole cache, every token, once a second generate() brought a new cache."""

    def __init__(self) -> None:
        self._read: dict[int, torch.Tensor] = {}  # slot -> the tensor read where it is
        self._buffer: dict[int, torch.Tensor] = {}  # slot -> this graph's own copy
        self._last: dict[int, int] = {}  # slot -> the address the previous call brought

    def view(self, slot: int, tensor: torch.Tensor) -> torch.Tensor:
        given = tensor.detach()
        address, last = given.data_ptr(), self._last.get(slot)
        self._last[slot] = address
        if given.is_contiguous() and given.data_ptr() % ALIGNMENT == 0:
            read = self._read.get(slot)
            if read is None or address == last and read.data_ptr() != address:
                self._read[slot] = read = given  # the first call, or new memory met twice
            if read.data_ptr() == address:
                return given
        buffer = self._buffer.get(slot)
        if buffer is None:
            buffer = self._buffer[slot] = torch.empty_like(
                given, memory_format=torch.contiguous_format
            )
        buffer.copy_(given)
        return buffer


class AsGiven:
    """Graph inputs read where they are (a copy only where one is not contiguous), for a call
    captured whole (whole.py): the capture bakes in every address it reads, and the previous
    piece's outputs, made inside the capture, keep theirs on every replay. `StableInputs` there
    copied each such input into a buffer of its own: a copy node in the graph for each, 95 of a
    1.1 B Llama's decode step (bench/results/decode-kernels-*)."""

    @staticmethod
    def view(slot: int, tensor: torch.Tensor) -> torch.Tensor:
        return _device_view(tensor)


AS_GIVEN = AsGiven()


class CudaGraph:
    """One graph at one set of shapes on the GPU route, called as host.HostGraph is."""

    def __init__(self, lowered: Lowered, options: BackendOptions) -> None:
        from tgc.planner.route import RouteOptions, compile_module

        route = RouteOptions(
            db=options.db,
            measure_budget=options.measure_budget,
            tolerance=options.tolerance,
            progress=False,
        )
        self.compiled = compile_module(lowered.module, None, route)
        self.kept = kept_results(lowered.func)  # results that are arguments or constants
        logger.info("tgc: GPU route: %s", self.compiled.report.summary())
        self.lowered = lowered
        device = torch.device("cuda", torch.cuda.current_device())
        # made once: the same objects on every call, so the plan's once steps run once
        self.own = [as_tensor(a).to(device) for a in lowered.own]
        self.params = ParamViews(_device_view)
        self.inputs = StableInputs()
        func = self.compiled.func
        first = len(lowered.own)
        self.param_slots = {i for i in range(first, len(func.body.args)) if func.is_param(i)}

    def __call__(self, args: list):
        lowered = self.lowered
        # While a whole call is captured (whole.py) the route runs kernel by kernel on the
        # capture's stream (whole.py sends its launches there), into buffers the capture keeps;
        # its inputs are read where they are (`AsGiven`): the capture fixes their addresses.
        capturing = torch.cuda.is_current_stream_capturing()
        inputs = AS_GIVEN if capturing else self.inputs
        values = lowered.arguments(self.own, args, self.params, self.param_slots, inputs)
        caller, legacy = torch.cuda.current_stream(), torch.cuda.default_stream()
        if capturing or caller == legacy:
            results = self.compiled(values)
        else:  # the caller's stream and the route's wait for each other (module doc)
            legacy.wait_stream(caller)
            # the plan's PyTorch kernels (torch-cuda) follow PyTorch's current stream: on the
            # route's too, or they would race its generated kernels (a wrong result on an H200)
            with torch.cuda.stream(legacy):
                results = self.compiled(values)
            caller.wait_stream(legacy)

        # Captured, the whole call's outputs are cloned after each replay: a clone here would
        # be one more copy in the graph for every output of every piece. An argument handed
        # back as a result, or a value the plan keeps between calls (a zero cache made from
        # constants), is cloned all the same: a write into the output must not reach either.
        def tensor_of(i: int, value) -> torch.Tensor:
            # an output is cloned (the next replay overwrites a replay's buffers); an update
            # is copied into its tensor from the buffer itself
            tensor = _as_cuda_tensor(value)
            if lowered.writes[i] is not None or capturing and i not in self.kept:
                return tensor
            return tensor.clone()

        return lowered.hand_back(results, args, tensor_of)


class _Interface:
    """A device buffer's `__cuda_array_interface__`, holding the buffer (torch keeps this object
    alive as long as the tensor made from it), with bfloat16 stated as int16: the interface
    has no bfloat16, and the tensor is viewed back as bfloat16."""

    def __init__(self, interface: dict, owner) -> None:
        self.__cuda_array_interface__ = interface
        self.owner = owner


# ml_dtypes' bfloat16 states itself as '<V2' (2 bytes of void) in an interface's typestr
_BF16_TYPESTR = np.dtype(NUMPY_DTYPES["bf16"]).str


def _as_cuda_tensor(value) -> torch.Tensor:
    """A result of the route (a torch tensor, or a buffer with `__cuda_array_interface__`) as
    a torch tensor on the same memory."""
    if isinstance(value, torch.Tensor):
        return value
    interface = dict(value.__cuda_array_interface__)
    bf16 = interface["typestr"] == _BF16_TYPESTR
    if bf16:
        interface["typestr"] = np.dtype(np.int16).str
    tensor = torch.as_tensor(_Interface(interface, value), device="cuda")
    return tensor.view(torch.bfloat16) if bf16 else tensor

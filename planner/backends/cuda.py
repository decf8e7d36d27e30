"""The CUDA backend: generated kernels (the code generator's templates) and cuBLAS, on the GPU.

Importing this module fails (ImportError, which `tgc.planner.load_backends` records) where
PyCUDA is missing or no GPU is visible. `register()` adds the planner side of
planner/backends/cuda_kernels.py (templates, the cuBLAS kernel, the fused-kernel hook) with the
device pieces here:

- the "cuda" memory space: values are `DeviceArray`s (PyCUDA memory, or any object exposing
  `__cuda_array_interface__`, such as a torch CUDA tensor, wrapped without a copy and kept
  alive); `kernel.copy` uploads and downloads through the host;
- the "cuda" backend: `run_region(op, inputs)` turns a generated-kernel call (or a
  `kernel.fused`) into a `kernel.fused`, generates its code (with the template parameters the
  call names as `param.<name>`, the generator's own choice for the rest), compiles it through the CUDA
  runtime's caches (runtime/cuda_compile.py: nvcc to a cubin, in memory and on disk) and
  launches it; `call` runs cuda.cublas.gemm through runtime/cublas.py, and the linear layers
  with their epilogues (cuda.cublaslt.*) through runtime/cublaslt.py, with a workspace of
  32 MiB made on first use; cuda.split_view returns each piece as a DeviceArray at its offset
  of the operand's buffer (which it keeps alive), and cuda.reshape_view the buffer in its new
  shape, launching nothing; cuda.write_rows writes rows into its operand's buffer where
  tgc/donation.py says it is free to take, else into a copy (codegen/write_rows.py).

Everything runs in order on the legacy default stream, as PyTorch's kernels (torch-cuda) do:
a kernel's inputs are finished before it starts with no synchronisation between kernels, so
the host queues a plan's kernels ahead of the GPU. `launching_on(stream)` sends the launches
and cuBLAS calls to another stream for a while: a CUDA graph is captured on one
(planner/graphs.py). Device memory comes from a pool: memory a
value gave back is reused by a later allocation, which the stream orders after every kernel
that read it. A kernel that cannot be launched is reported at its op; a fault while it runs
surfaces at the next synchronisation (the copy of a result to the host). The space times queued
work with CUDA events (runtime/cuda_timing.py), which is how the profiler measures its kernels.
"""

from __future__ import annotations

import atexit
import math
from contextlib import contextmanager
from functools import cache
from types import SimpleNamespace

import ml_dtypes
import numpy as np

try:
    import pycuda.driver as cuda

    cuda.init()
    if cuda.Device.count() == 0:
        raise ImportError("no CUDA device is visible")
except ImportError as e:
    raise ImportError(f"the cuda backend needs PyCUDA and a GPU ({e})") from None
except cuda.Error as e:  # a driver that does not initialise: no GPU to use
    raise ImportError(f"the CUDA driver is not usable ({e})") from None

from tgc.builtin import ReturnOp
from tgc.codegen.compact import compact_rows_kernel
from tgc.codegen.kernels import generate_kernel
from tgc.codegen.write_rows import write_rows_kernel
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import CallOp, FusedOp
from tgc.donation import may_overwrite
from tgc.ir import Operation
from tgc.planner.backends import Backend, Space, Template
from tgc.planner.backends import cuda_kernels as planner_side
from tgc.runtime.cuda_compile import context, device_arch, load_kernels
from tgc.runtime.tensor_map import kernel_arguments
from tgc.runtime.cuda_timing import time_queued
from tgc.types import ELEMENT_TYPE_OF_DTYPE, TensorType

_pool = None
# The stream generated kernels and cuBLAS are queued on: None, the legacy default stream, except
# inside `launching_on`. Read at each launch (a prepared call outlives a capture).
# `kept`: None, or a list every allocation is added to (a capture's).
_launch = SimpleNamespace(stream=None, handle=0, kept=None)


@contextmanager
def launching_on(stream, kept: list | None = None):
    """Queue this backend's work on `stream` (a PyCUDA Stream) inside the block (module doc).
    With `kept`, every device allocation made inside is appended to it: a CUDA graph captured
    there writes to those buffers on each replay, so its owner keeps them, scratch buffers a
    kernel gave back included, away from the pool."""
    previous = (_launch.stream, _launch.handle, _launch.kept)
    _launch.stream, _launch.handle, _launch.kept = stream, stream.handle, kept
    try:
        yield
    finally:
        _launch.stream, _launch.handle, _launch.kept = previous


def capture_stream():
    """The stream CUDA graphs are captured on (planner/graphs.py): made once, and destroyed at
    exit before the context is released (a PyCUDA stream outliving its context aborts the
    process), so no graph keeps it."""
    stream = _launch.__dict__.get("capture_stream")
    if stream is None:
        context()
        stream = _launch.capture_stream = cuda.Stream()
        atexit.register(_launch.__dict__.pop, "capture_stream", None)  # runs before _release
    return stream


def _allocate(size: int):
    """`size` bytes of device memory from the pool (module doc)."""
    global _pool
    if _pool is None:
        from pycuda.tools import DeviceMemoryPool

        _pool = DeviceMemoryPool()
    return _pool.allocate(size)


class DeviceArray:
    """An array in device memory: its pointer, shape and dtype, and the object that owns the
    memory (a PyCUDA allocation, or a foreign array kept alive while this lives).

    Contiguous, except that a function's result may have padded rows: `ld`, the elements from
    one row's start to the next, where it is not the last dim (cuda.cublas.gemm_padded's result
    when the function only returns it, as torch.compile returns a padded GEMM's result as a
    strided view). Such an array says its strides to every reader (`__cuda_array_interface__`,
    `get`); a kernel takes it only through `of`, which copies it compact."""

    def __init__(
        self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owner, ld: int | None = None
    ) -> None:
        self.ptr = int(ptr)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.owner = owner
        self.ld = None if ld is None or (self.shape and ld == self.shape[-1]) else int(ld)

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n

    @classmethod
    def empty(cls, shape: tuple[int, ...], dtype) -> DeviceArray:
        context()
        size = math.prod(shape) * np.dtype(dtype).itemsize
        allocation = _allocate(max(size, 1))
        if _launch.kept is not None:
            _launch.kept.append(allocation)
        return cls(int(allocation), shape, dtype, allocation)

    @classmethod
    def from_host(cls, array: np.ndarray, t: TensorType | None = None) -> DeviceArray:
        host = planner_side.host_array(array, t)
        out = cls.empty(host.shape, host.dtype)
        if host.nbytes:
            cuda.memcpy_htod(out.ptr, host)
        return out

    @classmethod
    def of(cls, value) -> DeviceArray:
        """`value` itself, or a zero-copy view of an object with `__cuda_array_interface__`."""
        if isinstance(value, DeviceArray):
            return value if value.ld is None else value.compact()
        if hasattr(value, "data_ptr") and hasattr(value, "is_contiguous"):
            return cls._of_tensor(value)
        interface = getattr(value, "__cuda_array_interface__", None)
        if interface is None:
            raise TypeError(f"not a device value: {type(value).__name__}")
        shape = tuple(interface["shape"])
        dtype = np.dtype(interface["typestr"])
        strides = interface.get("strides")
        if strides is not None and tuple(strides) != _contiguous(shape, dtype.itemsize):
            raise TypeError("a device value must be contiguous")
        return cls(interface["data"][0], shape, dtype, value)

    @classmethod
    def _of_tensor(cls, tensor) -> DeviceArray:
        """A PyTorch CUDA tensor, read directly: its interface refuses bf16."""
        if not tensor.is_contiguous():
            raise TypeError("a device value must be contiguous")
        name = str(tensor.dtype).removeprefix("torch.")
        dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        return cls(tensor.data_ptr(), tuple(tensor.shape), dtype, tensor)

    @property
    def strides(self) -> tuple[int, ...] | None:
        """Byte strides; None where the array is contiguous."""
        if self.ld is None:
            return None
        return planner_side.padded_row_strides(self.shape, self.dtype.itemsize, self.ld)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": self.strides,
            "version": 3,
        }

    def get(self) -> np.ndarray:
        if self.ld is not None:
            rows = math.prod(self.shape[:-1])
            padded = DeviceArray(self.ptr, (rows, self.ld), self.dtype, self).get()
            return np.ascontiguousarray(padded[:, : self.shape[-1]]).reshape(self.shape)
        host = np.empty(self.shape, self.dtype)
        if host.nbytes:
            cuda.Context.synchronize()
            cuda.memcpy_dtoh(host, self.ptr)
        return host

    def compact(self) -> DeviceArray:
        """A contiguous copy of an array with padded rows (queued on the backend's stream)."""
        rows = math.prod(self.shape[:-1])
        padded = DeviceArray(self.ptr, (rows, self.ld), self.dtype, self)
        element_type = ELEMENT_TYPE_OF_DTYPE[self.dtype]
        (out,) = _compactor(rows, self.shape[-1], self.ld, element_type)([padded])
        return out.reshape(self.shape)

    def reshape(self, shape: tuple[int, ...]) -> DeviceArray:
        assert self.ld is None, "a view of an array with padded rows"
        return DeviceArray(self.ptr, shape, self.dtype, self)


def _contiguous(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def to_host(value) -> np.ndarray:
    return value.get() if isinstance(value, DeviceArray) else DeviceArray.of(value).get()


def from_host(array: np.ndarray, t: TensorType) -> DeviceArray:
    return DeviceArray.from_host(array, t)


# -- generated kernels ---------------------------------------------------------------------------

# op -> (op, kernel source, CUDA function): the op is held so its id is never reused.
_COMPILED: dict[int, tuple[Operation, object, object]] = {}


def _compiled(op: CallOp | FusedOp):
    found = _COMPILED.get(id(op))
    if found is None or found[0] is not op:
        compile_regions([op])
        found = _COMPILED[id(op)]
    return found[1], found[2]


def compile_regions(ops: list) -> None:
    """Generate the kernels of the region ops `ops` and compile those not compiled yet, in
    parallel (Backend.compile_regions)."""
    todo = [op for op in ops if _COMPILED.get(id(op), (None,))[0] is not op]
    sources = [_source(op) for op in todo]
    for op, source, function in zip(todo, sources, load_kernels(sources)):
        _COMPILED[id(op)] = (op, source, function)


def _source(op: CallOp | FusedOp):
    fused = op if isinstance(op, FusedOp) else planner_side.fused_from_call(op)
    symbol = planner_side.kernel_symbol(fused)
    source = generate_kernel(fused, planner_side.call_params(op), symbol)
    source.loc = op.loc
    return source


def run_region(op: CallOp | FusedOp, inputs: list) -> list[DeviceArray]:
    """Generate, compile (cached) and launch the kernel of `op`'s region on device inputs."""
    return _region_runner(op)(inputs)


def _pointer(value) -> int:
    """The device address of an operand: a DeviceArray's, or a foreign array's (checked to be
    contiguous, as DeviceArray.of does)."""
    if type(value) is DeviceArray:
        if value.ld is not None:  # `of` would copy it to a buffer that nothing keeps alive
            raise TgcError(
                "an argument has padded rows (a result returned as a strided view): pass "
                "its .compact() copy"
            )
        return value.ptr
    return DeviceArray.of(value).ptr


def _region_runner(op: CallOp | FusedOp):
    """`run(device inputs) -> outputs` for `op`'s region: its code generated and compiled
    (cached), its launch shape and result shapes known."""
    source, function = _compiled(op)
    return launcher(source, function, [r.type for r in op.results], op.loc)


def launcher(source, function, result_types: list[TensorType], loc=None):
    """`run(device inputs) -> outputs`: `function` (compiled from `source`, `load_kernels`)
    launched on the current stream into fresh results of `result_types`. A generated kernel's
    and a user's CUDA-source kernel's (planner/cuda_source.py) runs alike."""
    results = [(t.shape, t.dtype) for t in result_types]
    launch, grid, block = function.prepared_async_call, source.grid, source.block
    shared = source.shared_bytes

    def run(values: list) -> list:
        outs = [DeviceArray.empty(shape, dtype) for shape, dtype in results]
        pointers = [_pointer(v) for v in values] + [o.ptr for o in outs]
        arguments = kernel_arguments(source, pointers)
        try:
            launch(grid, block, _launch.stream, *arguments, shared_size=shared)
        except cuda.Error as e:
            raise TgcError(f"{source.label} failed to run: {e}", loc) from None
        return outs

    return run


# -- cuBLAS ------------------------------------------------------------------------------------


def _gemm_runner(g, t: TensorType, loc=None):
    """`run([a, b]) -> [c]` for the cuBLAS call `g` writing a fresh result of type `t`."""
    from tgc.runtime.cublas import cublas

    blas = cublas()
    shape, dtype = t.shape, t.dtype

    def run(values: list) -> list:
        a, b = values
        out = DeviceArray.empty(shape, dtype)
        blas.set_stream(_launch.handle)
        status = blas.gemm(g, _pointer(a), _pointer(b), out.ptr)
        if status != 0:
            raise TgcError(f"cuBLAS gemm ({g.m}x{g.n}x{g.k}) failed with status {status}", loc)
        return [out]

    return run


def _split_gemm_runner(name: str, g, t: TensorType, loc=None, keep_padded: bool = False):
    """`run([a, b]) -> [c]` for a SPLIT_GEMMS kernel: the cuBLAS calls of `padded_gemm_parts(g)`,
    into rows padded to 16 bytes (cuda.cublas.gemm_padded: a scratch buffer per call, then the
    rows copied compact into a fresh result, codegen/compact.py; with `keep_padded`, the padded
    rows are the result, for a call whose result the function only returns) or straight into
    a fresh compact result (cuda.cublas.gemm_split)."""
    from tgc.runtime.cublas import cublas

    blas = cublas()
    item = t.dtype.itemsize
    ld = planner_side.split_ld(name, g, item)
    parts = planner_side.padded_gemm_parts(g, item)
    rows = g.batch * g.m
    padded = name == planner_side.CUBLAS_GEMM_PADDED
    if padded and not keep_padded:
        _compactor(rows, g.n, ld, t.element_type)  # compiled now, not at the first call

    def run(values: list) -> list:
        a, b = (_pointer(v) for v in values)
        c = DeviceArray.empty((rows, ld) if padded else t.shape, t.dtype)
        blas.set_stream(_launch.handle)
        for part, into_b, into_c in parts:
            status = blas.gemm(part, a, b + into_b * item, c.ptr + into_c * item, ldc=ld)
            if status != 0:
                raise TgcError(f"cuBLAS gemm ({g.m}x{g.n}x{g.k}) failed with status {status}", loc)
        if not padded:
            return [c]
        result = DeviceArray(c.ptr, t.shape, t.dtype, c, ld=ld)
        # compact, the padded `c` goes back to the pool when this returns: a later allocation's
        # kernels are queued after the copy on the same stream (the module doc's rule)
        return [result if keep_padded else result.compact()]

    return run


@cache
def _compactor(rows: int, n: int, ld: int, element_type: str):
    """`run([padded rows]) -> [compact rows]`: codegen/compact.py's kernel for this shape,
    compiled once."""
    source = compact_rows_kernel(rows, n, ld, element_type)
    (function,) = load_kernels([source])
    return launcher(source, function, [TensorType.get((rows, n), element_type)])


def _gemm(inputs: list, attrs: dict, result_types: list[TensorType], split: str = ""):
    """A cuBLAS GEMM's call on device values; `split`: the SPLIT_GEMMS kernel's name."""
    a, b = (DeviceArray.of(v) for v in inputs)
    t = result_types[0]
    types = [TensorType.get(a.shape, t.element_type), TensorType.get(b.shape, t.element_type)]
    g = planner_side.gemm_of(types, t, attrs)
    run = _split_gemm_runner(split, g, t) if split else _gemm_runner(g, t)
    return run([a, b])


# -- cuBLASLt: linear layers with their epilogues ---------------------------------------------

_lt_state: dict = {}


def _cublaslt():
    """The cuBLASLt library with its workspace (made once, kept for the process)."""
    lt = _lt_state.get("lt")
    if lt is None:
        from tgc.runtime.cublaslt import WORKSPACE_BYTES, CublasLt

        workspace = DeviceArray.empty((WORKSPACE_BYTES,), np.uint8)
        lt = CublasLt(workspace.ptr, WORKSPACE_BYTES)
        _lt_state.update(lt=lt, workspace=workspace)
    return lt


def _lt_runner(name: str, operand_types: list[TensorType], t: TensorType, loc=None):
    """`run(operands) -> [y]` for the cuBLASLt kernel `name` (operands as `lt_operands` reads
    them) writing a fresh result of type `t`."""
    g = planner_side.lt_gemm(name, operand_types, t)
    lt = _cublaslt()
    shape, dtype = t.shape, t.dtype

    def run(values: list) -> list:
        pointers = [_pointer(v) for v in values]
        if any(ptr % 16 for ptr in pointers):
            # cuBLASLt's algorithm was chosen for 16-byte aligned operands (every allocation
            # is); a foreign array may be a view that starts elsewhere
            raise TgcError(f"{name}: an operand is not 16-byte aligned", loc)
        out = DeviceArray.empty(shape, dtype)
        x, w, b, r = planner_side.lt_operands(name, pointers)
        status = lt.matmul(g, x, w, out.ptr, bias_ptr=b, c_ptr=r, stream=_launch.handle)
        if status != 0:
            raise TgcError(f"{name} ({g.m}x{g.n}x{g.k}) failed with cuBLASLt status {status}", loc)
        return [out]

    return run


def _lt(name: str, inputs: list, result_types: list[TensorType]) -> list[DeviceArray]:
    values = [DeviceArray.of(v) for v in inputs]
    t = result_types[0]
    types = [TensorType.get(v.shape, t.element_type) for v in values]
    return _lt_runner(name, types, t)(values)


def _lt_host_run(name: str):
    """The cuBLASLt kernel `name` on host arrays (the kernel's `run`, for checking it)."""
    return _on_host(lambda inputs, attrs, result_types: _lt(name, inputs, result_types))


# -- splits into contiguous pieces: views, nothing launched ------------------------------------


def _split_view_runner(operand: TensorType, attrs: dict, loc=None):
    """`run([x]) -> pieces` for cuda.split_view on an operand of type `operand`: each piece a
    DeviceArray at its byte offset of x's buffer, keeping x (and so its memory) alive. A split
    whose pieces are not views is a TgcError at `loc`."""
    try:
        pieces = planner_side.split_view_pieces(
            operand.shape, operand.dtype.itemsize, attrs["axis"], tuple(attrs["sizes"])
        )
    except TgcError as e:
        raise TgcError(e.message, loc) from None
    dtype = operand.dtype

    def run(values: list) -> list:
        x = DeviceArray.of(values[0])
        return [DeviceArray(x.ptr + offset, shape, dtype, x) for offset, shape in pieces]

    return run


def _split_view(inputs: list, attrs: dict, result_types: list[TensorType]) -> list[DeviceArray]:
    x = DeviceArray.of(inputs[0])
    t = TensorType.get(x.shape, result_types[0].element_type)
    return _split_view_runner(t, attrs)([x])


# -- rows written into a tensor: in its own memory where it is free ----------------------------


@cache
def _write_rows_function(x: TensorType, indices: TensorType, axis: int):
    source = write_rows_kernel(x, indices, axis)
    (function,) = load_kernels([source])
    return source, function


def _write_rows_runner(x: TensorType, indices: TensorType, axis: int, in_place: bool, loc=None):
    """`run([x, indices, values]) -> [result]` for cuda.write_rows: the rows written into x's
    buffer itself (`in_place`: tgc/donation.py said it is free to take), the result a view of
    it; else into a copy of x."""
    source, function = _write_rows_function(
        x.with_encoding(None), indices.with_encoding(None), axis
    )
    launch, grid, block = function.prepared_async_call, source.grid, source.block
    nbytes = x.nbytes

    def run(values: list) -> list:
        base, rows, new = (DeviceArray.of(v) for v in values)
        if in_place:
            out = DeviceArray(base.ptr, base.shape, base.dtype, base)
        else:
            out = DeviceArray.empty(base.shape, base.dtype)
            cuda.memcpy_dtod_async(out.ptr, base.ptr, nbytes, _launch.stream)
        pointers = [new.ptr, rows.ptr, out.ptr]
        try:
            launch(grid, block, _launch.stream, *kernel_arguments(source, pointers))
        except cuda.Error as e:
            raise TgcError(f"{source.label} failed to run: {e}", loc) from None
        return [out]

    return run


def _write_rows(inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
    """cuda.write_rows with no program around the call (the profiler's): into a copy of x."""
    x, indices = (DeviceArray.of(v) for v in inputs[:2])
    types = [TensorType.get(a.shape, ELEMENT_TYPE_OF_DTYPE[a.dtype]) for a in (x, indices)]
    return _write_rows_runner(*types, attrs.get("axis", 0), False)(inputs)


# -- a call made ready once (Backend.prepare) ---------------------------------------------------


def prepare(kernel, op: CallOp):
    """`run(values) -> outputs` for one call, with what does not change between its runs done
    now: a region's code generated and compiled, its launch shape and result buffers' shapes
    known; a GEMM's cuBLAS arguments worked out. None for a kernel it has nothing to prepare
    for."""
    if kernel.name == planner_side.CUBLAS_GEMM or kernel.name in planner_side.SPLIT_GEMMS:
        t = op.results[0].type
        types = [v.type.with_encoding(None) for v in op.operands]
        g = planner_side.gemm_of(types, t, op.op_attributes())
        if kernel.name in planner_side.SPLIT_GEMMS:
            returned_only = all(isinstance(user, ReturnOp) for user in op.results[0].users())
            return _split_gemm_runner(kernel.name, g, t, op.loc, keep_padded=returned_only)
        return _gemm_runner(g, t, op.loc)
    if kernel.name in planner_side.LT_KERNELS:
        types = [v.type.with_encoding(None) for v in op.operands]
        return _lt_runner(kernel.name, types, op.results[0].type, op.loc)
    if kernel.name == planner_side.SPLIT_VIEW:
        return _split_view_runner(op.operands[0].type, op.op_attributes(), op.loc)
    if kernel.name == planner_side.RESHAPE_VIEW:
        shape = op.results[0].type.shape
        return lambda values: [DeviceArray.of(values[0]).reshape(shape)]
    if kernel.name == planner_side.WRITE_ROWS:
        x, indices = (v.type for v in op.operands[:2])
        axis = op.op_attributes().get("axis", 0)
        return _write_rows_runner(x, indices, axis, may_overwrite(op, 0), op.loc)
    if not isinstance(kernel, Template):
        return None  # the executor's general path
    return _region_runner(op)


def _call(kernel, inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
    if kernel.name == planner_side.CUBLAS_GEMM:
        return _gemm(inputs, attrs, result_types)
    if kernel.name in planner_side.SPLIT_GEMMS:
        return _gemm(inputs, attrs, result_types, kernel.name)
    if kernel.name in planner_side.LT_KERNELS:
        return _lt(kernel.name, inputs, result_types)
    if kernel.name == planner_side.SPLIT_VIEW:
        return _split_view(inputs, attrs, result_types)
    if kernel.name == planner_side.RESHAPE_VIEW:
        return [DeviceArray.of(inputs[0]).reshape(result_types[0].shape)]
    if kernel.name == planner_side.WRITE_ROWS:
        return _write_rows(inputs, attrs, result_types)
    if kernel.run is not None:
        # A user's kernel (planner/plugins.py): its `run` takes and returns device buffers
        # (objects with __cuda_array_interface__). tgc's own kernels are the names above; their
        # `run`s work on host arrays, for tests, and are never called here.
        return kernel.run(inputs, attrs, result_types)
    raise TgcError(f"the cuda backend has no kernel '{kernel.name}'")


def _on_host(device_run):
    """A kernel's `run` on host arrays (for checking it) from `device_run(device values, attrs,
    result types) -> device results`: inputs uploaded, results downloaded."""

    def run(inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
        device = [from_host(np.asarray(a), None) for a in inputs]
        return [o.get() for o in device_run(device, attrs, result_types)]

    return run


_cublas_host_run = _on_host(_gemm)  # cuda.cublas.gemm on host arrays


def _split_host_run(name: str):
    """A SPLIT_GEMMS kernel's run on host arrays."""
    return _on_host(lambda inputs, attrs, types: _gemm(inputs, attrs, types, name))


BACKEND = Backend(
    "cuda",
    call=_call,
    adopt=DeviceArray.of,
    run_region=run_region,
    prepare=prepare,
    compile_regions=compile_regions,
)
SPACE = Space("cuda", to_host, from_host, time_queued)


def register() -> None:
    """Register the CUDA backend (idempotent), its region kernels made for this GPU."""
    context()
    planner_side.register(
        BACKEND, SPACE, _cublas_host_run, _lt_host_run, device_arch(), _split_host_run
    )


def unregister() -> None:
    planner_side.unregister()


__all__ = ["BACKEND", "SPACE", "DeviceArray", "register", "run_region", "unregister"]

"""Kernels loaded and launched through the CUDA driver itself (ctypes on libcuda), not PyCUDA,
where PyCUDA's launch cannot do what the kernel needs:

- **Tensor maps** (runtime/tensor_map.py). PyCUDA packs a launch's arguments into one buffer
  that the driver copies to the start of the kernel's parameters, while the compiler places a
  64-byte-aligned parameter where its address in the parameter bank is aligned (48 bytes in on
  an H200), so the maps landed off their places and the copies faulted (an illegal
  instruction). cuLaunchKernel's kernelParams copies each argument to its own offset.
- **Programmatic dependent launch** (sm_90 and later; `KernelSource.dependent_launch`). Such a
  kernel is launched by cuLaunchKernelEx with programmatic stream serialisation: it may start
  while the kernel before it in the stream still runs, once that kernel's blocks have all
  called `tgc_launch_dependents()` (the prelude), and it waits for that kernel's end and writes
  at its `tgc_wait_for_predecessors()`. Before it, it may only ask for its weight in L2
  (codegen/matmul_gemv.py): a decoding step's few-rows products start streaming their weights
  under the small kernel before them instead of after it. PyCUDA has no launch attributes.
  In a CUDA graph captured from the stream the dependency becomes a programmatic edge. On the
  legacy default stream (where tgc times kernels one by one) it is launched plainly.
"""

from __future__ import annotations

import ctypes
from functools import cache

from tgc.codegen.render import KernelSource
from tgc.diagnostics import TgcError

_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute (cuda.h)
# False: every kernel launched plainly (bench/decode_step.py's tgc-plain-launch mode sets it, to
# measure what dependent launches save in the same run)
dependent_launches = True
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h)


@cache
def driver():
    """libcuda, or a TgcError where there is none (CI)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise TgcError(f"no CUDA driver to load kernels with ({e})") from None


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte union of values."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attributes", ctypes.POINTER(_LaunchAttribute)),
        ("num_attributes", ctypes.c_uint),
    ]


def _programmatic_attribute() -> _LaunchAttribute:
    """programmaticStreamSerializationAllowed = 1 (an int at the union's start)."""
    attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value = (1).to_bytes(4, "little") + bytes(60)
    return attribute


class DriverKernel:
    """A kernel loaded from its cubin into the current context and launched by the driver with
    kernelParams (the module doc says when and why), with PyCUDA's prepared-call signature so
    that launchers call it as they call PyCUDA's functions. `programmatic`: launched as a
    programmatic dependent of the kernel before it (the kernel must wait for it: module doc)."""

    def __init__(self, cubin: bytes, kernel: KernelSource, programmatic: bool = False) -> None:
        lib = driver()
        self._module, self._function = ctypes.c_void_p(), ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(cubin, len(cubin))
        self._name, self._loc = kernel.label, kernel.loc
        self._attribute = _programmatic_attribute() if programmatic else None
        self._check(lib.cuModuleLoadData(ctypes.byref(self._module), self._image), "load")
        self._check(
            lib.cuModuleGetFunction(
                ctypes.byref(self._function), self._module, kernel.name.encode()
            ),
            "load",
        )
        if kernel.shared_bytes > 48 * 1024:
            self._check(
                lib.cuFuncSetAttribute(
                    self._function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel.shared_bytes
                ),
                f"take {kernel.shared_bytes} bytes of shared memory",
            )

    @property
    def programmatic(self) -> bool:
        return self._attribute is not None

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise TgcError(f"{self._name} failed to {what}: CUDA error {status}", self._loc)

    def prepared_async_call(self, grid, block, stream, *args, shared_size: int = 0) -> None:
        """Launch on `stream` (a PyCUDA stream, or None: the legacy default stream) with
        `args` as kernel_arguments gives them (tensor maps as bytes, then pointers)."""
        storage = [
            ctypes.create_string_buffer(a, len(a))
            if isinstance(a, bytes)
            else ctypes.c_uint64(int(a))
            for a in args
        ]
        params = (ctypes.c_void_p * len(storage))(*(ctypes.addressof(x) for x in storage))
        handle = ctypes.c_void_p(0 if stream is None else stream.handle)
        if self._attribute is None or stream is None or not dependent_launches:
            status = driver().cuLaunchKernel(
                self._function,
                *(ctypes.c_uint(int(v)) for v in (*grid, *block, shared_size)),
                handle,
                params,
                None,
            )
        else:
            config = _LaunchConfig(
                (ctypes.c_uint * 3)(*map(int, grid)),
                (ctypes.c_uint * 3)(*map(int, block)),
                int(shared_size),
                handle,
                ctypes.pointer(self._attribute),
                1,
            )
            status = driver().cuLaunchKernelEx(ctypes.byref(config), self._function, params, None)
        self._check(status, "run")

    def prepared_call(self, grid, block, *args, shared_size: int = 0) -> None:
        self.prepared_async_call(grid, block, None, *args, shared_size=shared_size)

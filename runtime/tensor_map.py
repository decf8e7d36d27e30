"""TMA tensor maps: the 128-byte descriptors Hopper's bulk tensor copies read, made on the host
by the driver's cuTensorMapEncodeTiled for one operand's address and passed to the kernel by
value (codegen/render.py's `TensorMap` says what each kernel takes).

`kernel_arguments(kernel, pointers)` is what a launch passes: the kernel's tensor maps, made
for the operands' addresses, then the pointers. A map that cannot be made (an address not 16
bytes aligned, a stride the hardware does not take) is a TgcError naming the kernel.

Such a kernel is loaded and launched through the driver (runtime/driver_kernel.py says why),
not PyCUDA.
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from tgc.codegen.render import KernelSource, TensorMap
from tgc.diagnostics import TgcError
from tgc.runtime.driver_kernel import driver

ALIGNMENT = 16  # of the address and of every stride


@cache
def _encode_tiled():
    """The driver's cuTensorMapEncodeTiled (CUDA 12 and later)."""
    try:
        fn = driver().cuTensorMapEncodeTiled
    except AttributeError as e:
        raise TgcError(f"no CUDA 12 driver to make TMA tensor maps with ({e})") from None
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [
        ctypes.c_void_p,  # CUtensorMap*
        ctypes.c_int,  # data type
        ctypes.c_uint32,  # rank
        ctypes.c_void_p,  # global address
        u64p,  # dims
        u64p,  # strides of dims 1.. in bytes
        u32p,  # box
        u32p,  # element strides
        ctypes.c_int,  # interleave
        ctypes.c_int,  # swizzle
        ctypes.c_int,  # L2 promotion
        ctypes.c_int,  # out-of-bounds fill
    ]
    fn.restype = ctypes.c_int
    return fn


def encode(spec: TensorMap, address: int) -> bytes:
    """The tensor map of `spec` over the operand at device `address`; a TgcError (without the
    kernel's name: `kernel_arguments` adds it) where the driver refuses it."""
    address += spec.offset
    if address % ALIGNMENT:
        raise TgcError(
            f"its operand {spec.operand} is not {ALIGNMENT}-byte aligned (a TMA copy's need)"
        )
    rank = len(spec.dims)
    out = (ctypes.c_uint8 * TensorMap.BYTES)()
    status = _encode_tiled()(
        ctypes.addressof(out),
        spec.data_type,
        rank,
        ctypes.c_void_p(address),
        (ctypes.c_uint64 * rank)(*spec.dims),
        (ctypes.c_uint64 * max(1, rank - 1))(*spec.strides),
        (ctypes.c_uint32 * rank)(*spec.box),
        (ctypes.c_uint32 * rank)(*([1] * rank)),
        0,  # no interleaving
        TensorMap.SWIZZLE_128B,
        TensorMap.L2_PROMOTION_256B,
        TensorMap.OOB_FILL_ZEROS,
    )
    if status != 0:
        raise TgcError(
            f"the driver refused its tensor map of operand {spec.operand} (CUDA error "
            f"{status}; dims {spec.dims}, strides {spec.strides}, box {spec.box})"
        )
    return bytes(out)


def kernel_arguments(kernel: KernelSource, pointers: list[int]) -> list:
    """What a launch of `kernel` passes: its tensor maps over the inputs at `pointers` (inputs,
    then outputs), then the pointers (as np.uintp, PyCUDA's "P")."""
    maps = []
    for spec in kernel.tensor_maps:
        try:
            maps.append(encode(spec, int(pointers[spec.operand])))
        except TgcError as e:
            raise TgcError(f"{kernel.label}: {e.message}", kernel.loc) from None
    return maps + [np.uintp(p) for p in pointers]

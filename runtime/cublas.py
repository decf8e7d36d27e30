"""cuBLAS through ctypes: one strided-batched GEMM entry point on raw device pointers.

The library is found beside PyTorch's CUDA wheels (nvidia/cublas/lib), in the CUDA toolkit, or
on the loader path. Row-major C = op(A) @ op(B) is computed as the column-major product
C^T = op(B)^T op(A)^T, so no data is transposed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from dataclasses import dataclass

from tgc.diagnostics import TgcError

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUDA_TYPE = {"f32": 0, "f64": 1, "f16": 2, "bf16": 14}
COMPUTE_32F, COMPUTE_64F = 68, 70
GEMM_DEFAULT = -1


@dataclass(frozen=True)
class Gemm:
    """One GEMM: row-major C = op(A) @ op(B), `batch` times, each operand `stride` elements
    from one batch to the next (0: one operand shared by every batch)."""

    dtype: str  # a key of CUDA_TYPE
    m: int
    n: int
    k: int
    batch: int
    transpose_a: bool
    transpose_b: bool
    stride_a: int
    stride_b: int


def _candidates() -> list[str]:
    found = []
    for root in sys.path + [os.path.dirname(os.path.dirname(os.__file__))]:
        found += sorted(glob.glob(os.path.join(root, "nvidia", "cublas", "lib", "libcublas.so*")))
    for root in (
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/lib/x86_64-linux-gnu",
    ):
        found += sorted(glob.glob(os.path.join(root, "libcublas.so*")))
    name = ctypes.util.find_library("cublas")
    if name:
        found.append(name)
    return [f for f in found if "Lt" not in os.path.basename(f)]


class Cublas:
    def __init__(self) -> None:
        errors = []
        self.lib = None
        for path in _candidates():
            try:
                lt = os.path.join(
                    os.path.dirname(path),
                    os.path.basename(path).replace("libcublas", "libcublasLt"),
                )
                if os.path.exists(lt):
                    ctypes.CDLL(lt, mode=ctypes.RTLD_GLOBAL)
                self.lib = ctypes.CDLL(path)
                self.path = path
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        if self.lib is None:
            raise TgcError(
                "cuBLAS was not found (" + ("; ".join(errors) or "no libcublas.so") + ")"
            )
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        gemm = self.lib.cublasGemmStridedBatchedEx
        gemm.restype = ctypes.c_int
        i, p, ll = ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong
        gemm.argtypes = [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i]
        self._gemm = gemm
        self._stream = None

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise TgcError(f"{what} failed with cuBLAS status {status}")

    def set_stream(self, stream_handle: int) -> None:
        if stream_handle != self._stream:
            self._check(
                self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream_handle)),
                "cublasSetStream",
            )
            self._stream = stream_handle

    def gemm(self, g: Gemm, a_ptr: int, b_ptr: int, c_ptr: int, ldc: int | None = None) -> int:
        """Run one `Gemm` on device pointers; returns the cuBLAS status.
        `ldc`: elements from one row of C to the next (n: C compact)."""
        ldc = g.n if ldc is None else ldc
        dtype = CUDA_TYPE[g.dtype]
        if g.dtype == "f64":
            alpha, beta, compute = ctypes.c_double(1.0), ctypes.c_double(0.0), COMPUTE_64F
        else:
            alpha, beta, compute = ctypes.c_float(1.0), ctypes.c_float(0.0), COMPUTE_32F
        op_b = CUBLAS_OP_T if g.transpose_b else CUBLAS_OP_N
        op_a = CUBLAS_OP_T if g.transpose_a else CUBLAS_OP_N
        ldb = g.k if g.transpose_b else g.n
        lda = g.m if g.transpose_a else g.k
        return self._gemm(
            self.handle,
            op_b,
            op_a,
            g.n,
            g.m,
            g.k,
            ctypes.byref(alpha),
            ctypes.c_void_p(b_ptr),
            dtype,
            ldb,
            g.stride_b,
            ctypes.c_void_p(a_ptr),
            dtype,
            lda,
            g.stride_a,
            ctypes.byref(beta),
            ctypes.c_void_p(c_ptr),
            dtype,
            ldc,
            g.m * ldc,
            g.batch,
            compute,
            GEMM_DEFAULT,
        )


_INSTANCE: Cublas | None = None


def cublas() -> Cublas:
    global _INSTANCE
    if _INSTANCE is None:
        _INSTANCE = Cublas()
    return _INSTANCE

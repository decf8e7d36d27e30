"""cuBLASLt through ctypes: a row-major GEMM with a fused epilogue on raw device pointers.

`D = epilogue(A @ B [+ C])` for A (M x K), B (K x N), D and C (M x N), all row-major and of one
element type (f32, f16 or bf16; f32 accumulation), where the epilogue is
- "bias":      D = A @ B [+ C] + bias, bias a vector of N elements added to every row;
- "gelu_bias": D = gelu_tanh(A @ B + bias) (the tanh approximation of GELU).

This is how PyTorch's addmm runs a linear layer with its bias (and its GELU) in one kernel: the
epilogue reads the GEMM's accumulators before they are rounded and stored, so the bias add and
the activation cost no pass over memory. C (with beta = 1) is a residual added in the same
kernel.

As in runtime/cublas.py, the row-major product is computed as the column-major one
D^T = B^T A^T: cuBLASLt's "A" is our B (N x K column-major, leading dimension N; where B is
stored transposed, N x K row-major as PyTorch's nn.Linear keeps its weight, it is K x N
column-major with leading dimension K, read with op T), its "B" is our A, and a bias of length N is a vector over the rows of the column-major D^T, as cuBLASLt
wants it. The library's descriptors and its choice of algorithm (its heuristic, asked for once
per distinct GEMM, with the workspace the caller gives) are kept per `LtGemm`, so a call does no
more on the host than `cublasLtMatmul` itself.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from tgc.diagnostics import TgcError
from tgc.runtime.cublas import COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_T, CUDA_TYPE, cublas

# cublasLt.h's enumerators (cublasLtMatmulDescAttributes_t, cublasLtEpilogue_t,
# cublasLtMatmulPreferenceAttributes_t).
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
PREF_MAX_WORKSPACE_BYTES = 1
EPILOGUES = {"none": 1, "bias": 4, "gelu_bias": 36}
# The workspace cuBLASLt is given (what PyTorch gives cuBLAS on Hopper): its heuristic's choice
# of algorithm depends on it, so the runtime and the standalone file give the same.
WORKSPACE_BYTES = 32 << 20

# cublasLtMatmulHeuristicResult_t: the algorithm (8 x uint64), workspaceSize (size_t), state
# (cublasStatus_t), wavesCount (float), 4 reserved ints: 96 bytes.
_HEURISTIC_BYTES = 96
_ALGO_BYTES = 64


@dataclass(frozen=True)
class LtGemm:
    """One GEMM shape with its epilogue: D (m x n) = epilogue(A (m x k) @ B (k x n) [+ C])."""

    dtype: str
    m: int
    n: int
    k: int
    epilogue: str  # a key of EPILOGUES
    accumulate: bool = False  # D = ... + C (beta = 1), C a matrix like D
    transpose_b: bool = False  # B stored N x K (its transpose), as nn.Linear's weight


class _Prepared:
    """The descriptors and the algorithm of one LtGemm (kept for the process's lifetime)."""

    def __init__(self, lt: CublasLt, g: LtGemm) -> None:
        lib, p = lt.lib, ctypes.c_void_p
        dtype = CUDA_TYPE[g.dtype]
        self.desc = p()
        lt.check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, 0), "desc")
        op_a = ctypes.c_int32(CUBLAS_OP_T if g.transpose_b else CUBLAS_OP_N)
        lt.set_desc(self.desc, DESC_TRANSA, op_a)
        lt.set_desc(self.desc, DESC_TRANSB, ctypes.c_int32(CUBLAS_OP_N))
        lt.set_desc(self.desc, DESC_EPILOGUE, ctypes.c_uint32(EPILOGUES[g.epilogue]))
        # Column-major: "A" is our B (n x k, ld n; transposed: k x n, ld k, read with op T),
        # "B" our A (k x m, ld k), D^T is n x m.
        if g.transpose_b:
            self.a_layout = lt.layout(dtype, g.k, g.n, g.k)
        else:
            self.a_layout = lt.layout(dtype, g.n, g.k, g.n)
        self.b_layout = lt.layout(dtype, g.k, g.m, g.k)
        self.d_layout = lt.layout(dtype, g.n, g.m, g.n)
        if g.epilogue != "none":
            # A placeholder bias pointer, 256-byte aligned like every allocation: the heuristic
            # reads the pointer's alignment, not the memory.
            lt.set_desc(self.desc, DESC_BIAS_POINTER, ctypes.c_void_p(256))
        self.algo = lt.heuristic(self.desc, self.a_layout, self.b_layout, self.d_layout, g)
        self.alpha = ctypes.c_float(1.0)
        self.beta = ctypes.c_float(1.0 if g.accumulate else 0.0)


class CublasLt:
    """The cuBLASLt library, one handle, a workspace the caller owns (its device pointer and
    size, kept alive by the caller for as long as this is used)."""

    def __init__(self, workspace_ptr: int, workspace_bytes: int) -> None:
        blas = cublas()  # loads libcublasLt beside libcublas (RTLD_GLOBAL)
        lt_path = os.path.join(
            os.path.dirname(blas.path), os.path.basename(blas.path).replace("cublas", "cublasLt")
        )
        try:
            self.lib = ctypes.CDLL(lt_path)
        except OSError as e:
            raise TgcError(f"cuBLASLt was not found beside {blas.path} ({e})") from None
        self.path = lt_path
        self.handle = ctypes.c_void_p()
        self.check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = ctypes.c_void_p(workspace_ptr)
        self.workspace_bytes = workspace_bytes
        p, sz, i64, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_uint64
        lib = self.lib
        lib.cublasLtMatmulDescSetAttribute.argtypes = [p, ctypes.c_int, p, sz]
        lib.cublasLtMatrixLayoutCreate.argtypes = [p, ctypes.c_int, u64, u64, i64]
        lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [p, ctypes.c_int, p, sz]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [p, p, p, p, p, p, p, ctypes.c_int, p, p]
        lib.cublasLtMatmul.argtypes = [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p]
        self._prepared: dict[LtGemm, _Prepared] = {}

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise TgcError(f"cuBLASLt: {what} failed with status {status}")

    def set_desc(self, desc, attr: int, value) -> None:
        status = self.lib.cublasLtMatmulDescSetAttribute(
            desc, attr, ctypes.byref(value), ctypes.sizeof(value)
        )
        self.check(status, f"setting matmul attribute {attr}")

    def layout(self, dtype: int, rows: int, cols: int, ld: int):
        out = ctypes.c_void_p()
        self.check(
            self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), dtype, rows, cols, ld),
            "cublasLtMatrixLayoutCreate",
        )
        return out

    def heuristic(self, desc, a_layout, b_layout, d_layout, g: LtGemm):
        """The library's first choice of algorithm for this GEMM (its own raw bytes)."""
        pref = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        size = ctypes.c_uint64(self.workspace_bytes)
        self.check(
            self.lib.cublasLtMatmulPreferenceSetAttribute(
                pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), ctypes.sizeof(size)
            ),
            "setting the workspace size",
        )
        result = ctypes.create_string_buffer(_HEURISTIC_BYTES)
        found = ctypes.c_int(0)
        status = self.lib.cublasLtMatmulAlgoGetHeuristic(
            self.handle, desc, a_layout, b_layout, d_layout, d_layout, pref, 1, result,
            ctypes.byref(found),
        )  # fmt: skip
        self.lib.cublasLtMatmulPreferenceDestroy(pref)
        if status != 0 or found.value == 0:
            raise TgcError(
                f"cuBLASLt has no algorithm for a {g.dtype} {g.m}x{g.n}x{g.k} GEMM with the "
                f"'{g.epilogue}' epilogue (status {status})"
            )
        return ctypes.create_string_buffer(result.raw[:_ALGO_BYTES], _ALGO_BYTES)

    def prepared(self, g: LtGemm) -> _Prepared:
        found = self._prepared.get(g)
        if found is None:
            found = self._prepared[g] = _Prepared(self, g)
        return found

    def matmul(
        self,
        g: LtGemm,
        a_ptr: int,
        b_ptr: int,
        d_ptr: int,
        bias_ptr: int | None = None,
        c_ptr: int | None = None,
        stream: int = 0,
    ) -> int:
        """Queue D = epilogue(A @ B [+ C]) on `stream`; returns the cuBLASLt status."""
        prep = self.prepared(g)
        if g.epilogue != "none":
            self.set_desc(prep.desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias_ptr))
        c = ctypes.c_void_p(c_ptr if g.accumulate else d_ptr)
        return self.lib.cublasLtMatmul(
            self.handle, prep.desc, ctypes.byref(prep.alpha),
            ctypes.c_void_p(b_ptr), prep.a_layout, ctypes.c_void_p(a_ptr), prep.b_layout,
            ctypes.byref(prep.beta), c, prep.d_layout, ctypes.c_void_p(d_ptr), prep.d_layout,
            prep.algo, self.workspace, self.workspace_bytes, ctypes.c_void_p(stream),
        )  # fmt: skip


__all__ = ["EPILOGUES", "WORKSPACE_BYTES", "CublasLt", "LtGemm"]

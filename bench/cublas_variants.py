"""How tgc calls cuBLAS against other ways of calling it, on the GPT-2 block's GEMM shapes:
tgc's `cublasGemmStridedBatchedEx` (runtime/cublas.py), `cublasGemmEx`, each with and without a
32 MiB workspace (`cublasSetWorkspace`), beside PyTorch's `torch.mm`. Medians of CUDA-event
timings of 50 calls each, on one stream; every variant's result compared with torch.mm's.

    python3 bench/cublas_variants.py [--dtype bf16]

Needs a GPU and PyTorch; prints its table and writes nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys

SHAPES = [(8192, 768, 768), (8192, 2304, 768), (8192, 3072, 768), (8192, 768, 3072)]
WORKSPACE_BYTES = 32 << 20


def timed(fn, reps: int = 50) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    args = ap.parse_args(argv)

    import torch

    from tgc.planner.backends.cuda_kernels import gemm_of
    from tgc.runtime.cublas import COMPUTE_32F, CUBLAS_OP_N, CUDA_TYPE, GEMM_DEFAULT, cublas
    from tgc.types import TensorType

    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    blas = cublas()
    blas.set_stream(torch.cuda.current_stream().cuda_stream)
    lib, handle = blas.lib, blas.handle
    gemm_ex = lib.cublasGemmEx
    i, p = ctypes.c_int, ctypes.c_void_p
    gemm_ex.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]
    gemm_ex.restype = ctypes.c_int
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    dtype = CUDA_TYPE[args.dtype]

    def set_workspace(on: bool) -> None:
        pointer, size = (workspace.data_ptr(), WORKSPACE_BYTES) if on else (None, 0)
        status = lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(pointer), ctypes.c_size_t(size))
        assert status == 0, f"cublasSetWorkspace: status {status}"

    print(f"cuBLAS at {blas.path}; {args.dtype}; ms per call (median of 50)")
    print("| M x N x K | strided-batched | + workspace | GemmEx | + workspace | torch.mm |")
    print("|---|---|---|---|---|---|")
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda").to(torch_dtype)
        b = (torch.randn(k, n, device="cuda") / k**0.5).to(torch_dtype)
        c = torch.empty(m, n, device="cuda", dtype=torch_dtype)
        want = torch.mm(a, b).double()
        types = [TensorType.get((m, k), args.dtype), TensorType.get((k, n), args.dtype)]
        g = gemm_of(types, TensorType.get((m, n), args.dtype), {})

        def strided():
            assert blas.gemm(g, a.data_ptr(), b.data_ptr(), c.data_ptr()) == 0

        def ex():
            status = gemm_ex(
                handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, ctypes.byref(alpha),
                p(b.data_ptr()), dtype, n, p(a.data_ptr()), dtype, k, ctypes.byref(beta),
                p(c.data_ptr()), dtype, n, COMPUTE_32F, GEMM_DEFAULT,
            )  # fmt: skip
            assert status == 0, f"cublasGemmEx: status {status}"

        row = []
        for fn, on in ((strided, False), (strided, True), (ex, False), (ex, True)):
            set_workspace(on)
            c.zero_()
            fn()
            err = float((c.double() - want).abs().max() / want.abs().max())
            assert err < 2e-2, f"{fn.__name__}: error {err:.2e} against torch.mm"
            row.append(timed(fn))
        set_workspace(False)
        row.append(timed(lambda: torch.mm(a, b, out=c)))
        print(f"| {m}x{n}x{k} | " + " | ".join(f"{t:.4f}" for t in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

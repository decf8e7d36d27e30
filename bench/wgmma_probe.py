"""Which shared-memory layouts and descriptors Hopper's `wgmma` reads as we mean them: the
first step of a wgmma attention kernel (issue 8), asked of the GPU instead of guessed.

One warpgroup computes D (64 x 64, f32) = A (64 x 16) @ B (16 x 64), bf16, with A and B in
shared memory without swizzling, as 8 x 8 "core matrices" of 16-byte rows, each core matrix's
128 bytes contiguous. For each operand the probe stores the matrix with core matrices `step_k`
bytes apart along k and `step_mn` bytes apart along m (or n), and gives wgmma a descriptor
whose leading byte offset (LBO) and stride byte offset (SBO) are one of the two ways to assign
them; B is stored k-major (each core matrix's rows along n, read with trans-b 0) or mn-major
(rows along k, trans-b 1). Every combination runs on fresh random inputs and is compared with
numpy's float64 product; the table says which ones compute A @ B.

    python3 bench/wgmma_probe.py            # on an H100/H200: PyCUDA and nvcc
    python3 bench/wgmma_probe.py --dry-run  # compiles only (no GPU): a CPU test runs this

Writes nothing.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# One kernel per trans-b (an immediate of the instruction). Arguments: A and B in global
# memory (row-major, bf16 bits), D (row-major f32), then per operand the byte steps between
# core matrices along k and along m/n in the stored layout, and the descriptor's LBO and SBO.
SOURCE = r"""
#include <cstdint>
#include <cuda_bf16.h>

__device__ __forceinline__ uint64_t desc_of(const void* smem, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t d = 0;
  d |= (uint64_t) ((addr & 0x3FFFF) >> 4);
  d |= (uint64_t) ((lbo & 0x3FFFF) >> 4) << 16;
  d |= (uint64_t) ((sbo & 0x3FFFF) >> 4) << 32;
  return d;  // base offset 0, no swizzle
}

// Element (r, c) of a matrix whose core matrices hold 8 rows r of 8 contiguous elements c.
__device__ __forceinline__ int core_offset(int r, int c, int step_r, int step_c) {
  return (r / 8) * step_r + (c / 8) * step_c + (r % 8) * 16 + (c % 8) * 2;
}

template <int TRANS_B>
__device__ void probe(const uint16_t* a, const uint16_t* b, float* d, int a_step_k,
                      int a_step_m, int a_lbo, int a_sbo, int b_step_k, int b_step_n, int b_lbo,
                      int b_sbo) {
  __shared__ __align__(128) unsigned char smem[2 * 8192];
  unsigned char* as = smem;
  unsigned char* bs = smem + 8192;
  const int tid = threadIdx.x;
  for (int e = tid; e < 64 * 16; e += 128) {  // A: 64 x 16, core matrices of rows m
    const int m = e / 16, k = e % 16;
    *reinterpret_cast<uint16_t*>(as + core_offset(m, k, a_step_m, a_step_k)) = a[e];
  }
  for (int e = tid; e < 16 * 64; e += 128) {  // B: 16 x 64
    const int k = e / 64, n = e % 64;
    const int off = TRANS_B ? core_offset(k, n, b_step_k, b_step_n)   // rows along k
                            : core_offset(n, k, b_step_n, b_step_k);  // rows along n
    *reinterpret_cast<uint16_t*>(bs + off) = b[e];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint64_t da = desc_of(as, a_lbo, a_sbo), db = desc_of(bs, b_lbo, b_sbo);
  float c[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) c[i] = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]), "+f"(c[4]), "+f"(c[5]), "+f"(c[6]),
        "+f"(c[7]), "+f"(c[8]), "+f"(c[9]), "+f"(c[10]), "+f"(c[11]), "+f"(c[12]),
        "+f"(c[13]), "+f"(c[14]), "+f"(c[15]), "+f"(c[16]), "+f"(c[17]), "+f"(c[18]),
        "+f"(c[19]), "+f"(c[20]), "+f"(c[21]), "+f"(c[22]), "+f"(c[23]), "+f"(c[24]),
        "+f"(c[25]), "+f"(c[26]), "+f"(c[27]), "+f"(c[28]), "+f"(c[29]), "+f"(c[30]),
        "+f"(c[31])
      : "l"(da), "l"(db), "r"(0), "n"(TRANS_B));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  // Accumulator element i of n8 block j: row 16 warp + lane / 4 (+ 8 for i >= 2), column
  // 8 j + 2 (lane % 4) + i % 2, as mma.sync's per warp.
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = 16 * warp + lane / 4 + 8 * (i / 2), col = 8 * j + 2 * (lane % 4) + i % 2;
      d[row * 64 + col] = c[4 * j + i];
    }
}

extern "C" __global__ void __launch_bounds__(128) probe_kmajor(
    const uint16_t* a, const uint16_t* b, float* d, int a_step_k, int a_step_m, int a_lbo,
    int a_sbo, int b_step_k, int b_step_n, int b_lbo, int b_sbo) {
  probe<0>(a, b, d, a_step_k, a_step_m, a_lbo, a_sbo, b_step_k, b_step_n, b_lbo, b_sbo);
}

extern "C" __global__ void __launch_bounds__(128) probe_mnmajor(
    const uint16_t* a, const uint16_t* b, float* d, int a_step_k, int a_step_m, int a_lbo,
    int a_sbo, int b_step_k, int b_step_n, int b_lbo, int b_sbo) {
  probe<1>(a, b, d, a_step_k, a_step_m, a_lbo, a_sbo, b_step_k, b_step_n, b_lbo, b_sbo);
}
"""

NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
# wgmma needs the architecture-specific target; the -gencode spelling (HOPPER.md).
GENCODE = "-gencode=arch=compute_90a,code=sm_90a"


def compile_cubin(tmp: Path) -> Path:
    src, out = tmp / "probe.cu", tmp / "probe.cubin"
    src.write_text(SOURCE)
    proc = subprocess.run(
        [NVCC or "nvcc", "-cubin", GENCODE, "-O3", "-std=c++17", "-o", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"nvcc failed:\n{proc.stderr[-3000:]}")
    return out


# The stored layouts: (step along k, step along m or n) in bytes, for A (64 x 16: 8 core
# matrices along m, 2 along k) and B (16 x 64: 2 along k, 8 along n).
A_LAYOUTS = {"k-adjacent": (128, 256), "m-adjacent": (1024, 128)}
B_LAYOUTS = {"k-adjacent": (128, 256), "n-adjacent": (1024, 128)}


def cases():
    """(kernel, A layout, A (lbo, sbo), B layout, B (lbo, sbo)) for every combination."""
    for kernel in ("probe_kmajor", "probe_mnmajor"):
        for (an, (ak, am)), (bn, (bk, bnn)) in itertools.product(
            A_LAYOUTS.items(), B_LAYOUTS.items()
        ):
            for a_desc in ((ak, am), (am, ak)):
                for b_desc in ((bk, bnn), (bnn, bk)):
                    yield kernel, an, (ak, am), a_desc, bn, (bk, bnn), b_desc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="compile only (no GPU)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tgc-wgmma-") as tmp:
        cubin = compile_cubin(Path(tmp))
        if args.dry_run:
            print(f"compiled {cubin.stat().st_size} bytes of sm_90a code")
            return 0
        return run(cubin.read_bytes())


def run(cubin: bytes) -> int:
    import ml_dtypes
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as cuda

    module = cuda.module_from_buffer(cubin)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((16, 64)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    a_dev, b_dev = cuda.to_device(a.view(np.uint16)), cuda.to_device(b.view(np.uint16))
    d = np.empty((64, 64), np.float32)
    print("| B read as | A stored | A lbo, sbo | B stored | B lbo, sbo | max error |")
    print("|---|---|---|---|---|---|")
    for kernel, an, (ak, am), a_desc, bn, (bk, bs), b_desc in cases():
        fn = module.get_function(kernel)
        d.fill(np.nan)
        d_dev = cuda.to_device(d)
        i = np.int32
        fn(a_dev, b_dev, d_dev, i(ak), i(am), i(a_desc[0]), i(a_desc[1]), i(bk), i(bs),
           i(b_desc[0]), i(b_desc[1]), block=(128, 1, 1), grid=(1, 1, 1))  # fmt: skip
        cuda.Context.synchronize()
        got = cuda.from_device_like(d_dev, d)
        err = float(np.nanmax(np.abs(got - want))) if not np.isnan(got).all() else float("nan")
        if np.isnan(got).any():
            err = float("nan")
        mark = " <- right" if err < 1e-2 else ""
        print(f"| {kernel[6:]} | {an} | {a_desc} | {bn} | {b_desc} | {err:.3g}{mark} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Timing the work a call queues on the GPU, as it costs inside a running plan.

A call of a CUDA kernel returns as soon as the kernel is queued; what the kernel costs a plan is
the time the GPU spends on it, or, when the host cannot queue work as fast as the GPU finishes
it, the time the host spends queueing it. `time_queued(call, runs)` measures both for each of
`runs` calls:

- a spin kernel is queued first, long enough (from the time of one synchronised call) that the host
  queues every timed call before the GPU reaches them: the CUDA events recorded around each call
  then bracket the GPU's work alone, with no gap where the GPU waited for the host;
- the host's time per call is read from `perf_counter` around the same calls.

Everything runs on the legacy default stream, where the cuda backend's kernels, cuBLAS as it
calls it, and PyTorch's kernels (its default stream) all go, in order. This is the method of
bench/gpu_suite.py (a sleep kernel ahead, events around each repetition), so the profiler's
costs and the benchmark's times are comparable.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pycuda.driver as cuda

from tgc.runtime.cuda_compile import compile_cubin, context, device_arch

_SPIN_SOURCE = """extern "C" __global__ void tgc_spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
"""
MAX_SPIN_SECONDS = 0.5  # a spin longer than this would only slow the profiler down
_spin = None


def _spin_kernel():
    global _spin
    if _spin is None:
        context()
        module = cuda.module_from_buffer(compile_cubin(_SPIN_SOURCE, device_arch()))
        _spin = (module, module.get_function("tgc_spin"))
    return _spin[1]


def spin(seconds: float) -> None:
    """Queue a kernel that keeps the GPU busy for about `seconds` (at most MAX_SPIN_SECONDS)."""
    khz = cuda.Context.get_device().get_attribute(cuda.device_attribute.CLOCK_RATE)
    cycles = int(min(seconds, MAX_SPIN_SECONDS) * khz * 1e3)
    _spin_kernel()(np.int64(cycles), block=(1, 1, 1), grid=(1, 1, 1))


def time_queued(
    call: Callable[[], object], runs: int, first: float
) -> tuple[np.ndarray, np.ndarray]:
    """(GPU seconds, host seconds) of each of `runs` calls of `call` (module doc). `first`: the
    seconds of one call with a synchronisation after it, which the caller has measured: no less
    than the host's time per call, so a spin of `runs` times that covers the host's queueing."""
    cuda.Context.synchronize()
    starts = [cuda.Event() for _ in range(runs)]
    ends = [cuda.Event() for _ in range(runs)]
    host = np.empty(runs)
    spin(1.5 * runs * first + 1e-3)
    for i in range(runs):
        t = time.perf_counter()
        starts[i].record()
        call()
        ends[i].record()
        host[i] = time.perf_counter() - t
    cuda.Context.synchronize()
    device = np.array([e.time_since(s) * 1e-3 for s, e in zip(starts, ends)])
    return device, host


__all__ = ["MAX_SPIN_SECONDS", "spin", "time_queued"]

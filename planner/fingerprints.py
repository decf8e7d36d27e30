"""The identities measurements are keyed by (planner/db.py): a kernel's *source hash*
(`kernel_info`: its code and reference graphs, so a changed kernel is a new kernel) and a
device's *fingerprint* (`device_info`: a hash of its description: the CPU model, numpy and its
BLAS for the numpy backend; the GPU name, compute capability, driver and CUDA version for a GPU
backend; tgc's version for all). A record is used only on a device with the same fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import platform
import sys
from collections.abc import Callable

from tgc.planner.db_schema import DeviceInfo, KernelInfo
from tgc.planner.kernel import BACKEND_SPACE, Kernel

# -- kernels and devices ----------------------------------------------------------------------------


@functools.cache
def kernel_info(kernel: Kernel) -> KernelInfo:
    """The kernel's database identity: its source hash covers its name, backend, op or
    reference texts, parameter domains, stated error and the code of `run` (and of the
    functions and op classes it closes over)."""
    parts = [
        kernel.name,
        kernel.backend,
        str(kernel.op),
        repr(kernel.reference_texts()),
        repr(sorted(kernel.params.items())),
        repr(kernel.max_rel_error),
        _code_text(kernel.run),
    ]
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]
    domains = {k: list(v) for k, v in kernel.params.items()}
    return KernelInfo(kernel.name, kernel.backend, digest, domains)


def _code_text(fn) -> str:
    if fn is None:
        return "None"
    parts = [_source(fn)]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(value):
            parts.append(_source(value))
        elif inspect.isclass(value) and callable(getattr(value, "reference", None)):
            parts.append(value.__qualname__ + _source(value.reference))
    return "\n".join(parts)


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return code.co_code.hex() if code is not None else repr(fn)


def device_backend(kernel: Kernel) -> str:
    """Whose fingerprint a kernel's timings belong to: its backend's; for a copy, that of the
    device end (a host <-> cuda copy is timed on the GPU machine)."""
    if kernel.op == "kernel.copy":
        from tgc.planner.options import COPY_KERNELS

        for (src, dst), name in COPY_KERNELS.items():
            if name == kernel.name:
                space = src or dst
                if space is not None:
                    return next(b for b, s in BACKEND_SPACE.items() if s == space)
    return kernel.backend


def _tgc_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tgc")
    except metadata.PackageNotFoundError:
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas() -> str:
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except Exception:  # noqa: BLE001  (older numpy: no dicts mode; the version still tells)
        return "unknown"


def cpu_description() -> dict:
    import numpy as np

    threads = {
        k: os.environ[k]
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        if k in os.environ
    }
    return {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "numpy": np.__version__,
        "blas": _blas(),
        "threads": threads,
        "tgc": _tgc_version(),
    }


def cuda_description() -> dict:
    """The GPU (device 0) through PyCUDA, else through torch."""
    try:
        import pycuda.driver as drv

        drv.init()
        dev = drv.Device(0)
        gpu = {
            "gpu": dev.name(),
            "compute_capability": ".".join(map(str, dev.compute_capability())),
            "driver": drv.get_driver_version(),
            "cuda": ".".join(map(str, drv.get_version())),
        }
    except Exception:  # noqa: BLE001  (no PyCUDA: ask torch)
        import torch

        props = torch.cuda.get_device_properties(0)
        gpu = {
            "gpu": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
        }
    return {**gpu, "host": _cpu_model(), "tgc": _tgc_version()}


def _torch_version() -> str:
    import torch

    return torch.__version__


# backend -> its device description (how a timing's machine is recognised); a backend module may
# register a better one.
FINGERPRINTS: dict[str, Callable[[], dict]] = {
    "numpy": cpu_description,
    "torch-cpu": lambda: {**cpu_description(), "torch": _torch_version()},
    "cuda": cuda_description,
    "torch-cuda": lambda: {**cuda_description(), "torch": _torch_version()},
}


@functools.cache
def device_info(backend: str) -> DeviceInfo:
    describe = FINGERPRINTS.get(backend)
    if describe is None:
        raise LookupError(f"no device fingerprint is defined for backend '{backend}'")
    description = {"backend": backend, **describe()}
    text = json.dumps(description, sort_keys=True)
    return DeviceInfo(hashlib.sha256(text.encode()).hexdigest()[:16], backend, description)


def device_of(kernel: Kernel) -> DeviceInfo:
    return device_info(device_backend(kernel))

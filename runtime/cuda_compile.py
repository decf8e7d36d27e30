"""Generated kernels on the GPU: the device's context and architecture, and each kernel's
source compiled by nvcc and loaded through PyCUDA.

- Each kernel is compiled once by nvcc to a cubin, cached in memory and on disk (keyed by the
  hash of its source, the GPU architecture and the nvcc version; `$TGC_CACHE_DIR`, default
  `~/.cache/tgc/cuda`). Kernels loaded together compile in parallel.
- A kernel that fails to compile or to load raises a TgcError that names the kernel and points
  at the IR op it came from. IR names reach messages through `display_name` (one line).

The planner's CUDA backend (planner/backends/cuda.py) runs the kernels; runtime/cuda_timing.py
times them.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from tgc.codegen.kernels import KernelSource, prelude
from tgc.diagnostics import TgcError
from tgc.runtime.driver_kernel import DriverKernel

try:
    import pycuda.driver as cuda
except ImportError as e:  # the GPU needs PyCUDA; everything else in tgc does not
    raise ImportError(f"PyCUDA is not installed ({e})") from None

NVCC_OPTIONS = ("-O3", "-std=c++17")
_context = None
_cubins: dict[str, bytes] = {}
_functions: dict[tuple[str, str], object] = {}


def context():
    """Make the primary context of GPU 0 current (the one PyTorch and cuBLAS use too)."""
    global _context
    if _context is None:
        cuda.init()
        if cuda.Device.count() == 0:
            raise TgcError("no CUDA device is visible")
        _context = cuda.Device(0).retain_primary_context()
        _context.push()
        atexit.register(_release)
    return _context


def _release() -> None:
    global _context
    if _context is not None:
        try:
            _context.pop()
        except cuda.Error:  # at exit the context may already be gone
            pass
        _context = None


def device_arch() -> str:
    """nvcc's name of the GPU ("sm_90"); its context is made current first (tgc-run plans for
    it before any kernel is loaded)."""
    context()
    major, minor = cuda.Context.get_device().compute_capability()
    return f"sm_{major}{minor}"


def _compute_capability(arch: str) -> int:
    """90 for "sm_90" and "sm_90a"."""
    return int(arch.removeprefix("sm_").rstrip("a"))


def _nvcc_version() -> str:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.CalledProcessError) as e:
        raise TgcError(f"nvcc is needed to compile CUDA kernels: {e}") from None


def cache_dir() -> Path:
    root = os.environ.get("TGC_CACHE_DIR") or os.path.join(Path.home(), ".cache", "tgc", "cuda")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_cubin(source: str, arch: str, what: KernelSource | None = None) -> bytes:
    """nvcc source -> cubin, through the memory and disk caches."""
    target = what.nvcc_target(arch) if what is not None else [f"-arch={arch}"]
    key = hashlib.sha256(
        "\0".join([source, *target, _nvcc_version(), *NVCC_OPTIONS]).encode()
    ).hexdigest()
    if key in _cubins:
        return _cubins[key]
    cached = cache_dir() / f"{key}.cubin"
    if cached.exists():
        _cubins[key] = cached.read_bytes()
        return _cubins[key]
    with tempfile.TemporaryDirectory(prefix="tgc-nvcc-") as tmp:
        src, out = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.cubin")
        Path(src).write_text(source)
        proc = subprocess.run(
            ["nvcc", "-cubin", *target, *NVCC_OPTIONS, "-o", out, src],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            name = what.label if what else "a kernel"
            detail = "\n".join(proc.stderr.strip().splitlines()[:12])
            raise TgcError(f"{name} failed to compile:\n{detail}", what.loc if what else None)
        data = Path(out).read_bytes()
    tmp_path = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp_path.write_bytes(data)
    os.replace(tmp_path, cached)
    _cubins[key] = data
    return data


def load_kernels(kernels: list[KernelSource]) -> list:
    """The CUDA function of each kernel, compiling (in parallel) what no cache holds."""
    context()
    arch = device_arch()
    sources = [prelude() + "\n" + k.source for k in kernels]
    # each source once: two threads compiling one source would write one temporary file
    todo = list(
        {s: (s, k) for s, k in zip(sources, kernels) if (s, arch) not in _functions}.values()
    )
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(todo)))) as pool:
        cubins = list(pool.map(lambda sk: compile_cubin(sk[0], arch, sk[1]), todo))
    for (s, k), cubin in zip(todo, cubins):
        programmatic = k.dependent_launch and _compute_capability(arch) >= 90
        if k.tensor_maps or programmatic:  # launched by the driver itself (driver_kernel.py)
            _functions[(s, arch)] = (None, DriverKernel(cubin, k, programmatic))
            continue
        try:
            module = cuda.module_from_buffer(cubin)
            fn = module.get_function(k.name)
        except cuda.Error as e:
            raise TgcError(f"{k.label} failed to load: {e}", k.loc) from None
        fn.prepare("P" * (k.num_inputs + k.num_outputs))
        if k.shared_bytes > 48 * 1024:
            try:
                fn.set_attribute(
                    cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, k.shared_bytes
                )
            except cuda.Error as e:
                raise TgcError(
                    f"{k.label} needs {k.shared_bytes} bytes of shared memory: {e}",
                    k.loc,
                ) from None
        _functions[(s, arch)] = (module, fn)
    return [_functions[(s, arch)][1] for s in sources]

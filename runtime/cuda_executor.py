"""The CUDA executor: runs a plan (tgc.codegen.plan) through PyCUDA on one stream.

- Each kernel is compiled once by nvcc to a cubin, cached in memory and on disk (keyed by the
  hash of its source, the GPU architecture and the nvcc version; `$TGC_CACHE_DIR`, default
  `~/.cache/tgc/cuda`). Kernels of a plan compile in parallel.
- All buffers of a plan are allocated once (inputs, outputs, constants, one scratch arena) and
  reused by every run; steps are launched in order on one stream; plain matmuls go to cuBLAS.
- Parameters (arguments marked `{tgc.param}`): the plan's prologue steps (codegen/plan.py: the
  steps that read only parameters, constants and each other's results, such as the packing of
  merged weights) run once, when the runner first sees a set of parameter arrays, and every
  later run only the rest. The set is known by the identity of the parameter arrays
  (runtime/param_set.py): the same objects are not uploaded again; a new array object for any
  parameter uploads the parameters again and repeats the prologue. An array changed in place
  is not noticed: parameters must not change between calls (docs/gpu.md).
- A kernel that fails to compile or to launch raises a TgcError that names the kernel and
  points at the IR op it came from.

`tgc-run --backend cuda` no longer comes here: it runs the planner's GPU route
(planner/route.py). The executor reads placed IR only and runs no pass. IR names reach messages through `display_name` (one line).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tgc.codegen.kernels import KernelSource, prelude
from tgc.codegen.names import display_name
from tgc.codegen.plan import DeviceCopy, Gemm, Launch, Plan
from tgc.diagnostics import TgcError
from tgc.runtime.param_set import ParamSet

try:
    import pycuda.driver as cuda
except ImportError as e:  # the executor needs PyCUDA; everything else in tgc does not
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
    it before any runner exists)."""
    context()
    major, minor = cuda.Context.get_device().compute_capability()
    return f"sm_{major}{minor}"


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
            name = _kernel_label(what) if what else "a kernel"
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
    todo = [(s, k) for s, k in zip(sources, kernels) if (s, arch) not in _functions]
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(todo)))) as pool:
        cubins = list(pool.map(lambda sk: compile_cubin(sk[0], arch, sk[1]), todo))
    for (s, k), cubin in zip(todo, cubins):
        try:
            module = cuda.module_from_buffer(cubin)
            fn = module.get_function(k.name)
        except cuda.Error as e:
            raise TgcError(f"{_kernel_label(k)} failed to load: {e}", k.loc) from None
        fn.prepare("P" * (k.num_inputs + k.num_outputs))
        if k.shared_bytes > 48 * 1024:
            try:
                fn.set_attribute(
                    cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, k.shared_bytes
                )
            except cuda.Error as e:
                raise TgcError(
                    f"{_kernel_label(k)} needs {k.shared_bytes} bytes of shared memory: {e}",
                    k.loc,
                ) from None
        _functions[(s, arch)] = (module, fn)
    return [_functions[(s, arch)][1] for s in sources]


class CudaPlanRunner:
    """Owns the device memory of one plan and runs it; reuse it for repeated runs."""

    def __init__(self, plan: Plan) -> None:
        context()
        self.plan = plan
        self.stream = cuda.Stream()
        launches = [s for s in plan.steps if isinstance(s, Launch)]
        functions = load_kernels([s.kernel for s in launches])
        self.functions = {id(s): f for s, f in zip(launches, functions)}
        self.allocations = []
        self.ptr: dict[int, int] = {}
        arena = self._alloc(plan.scratch_bytes) if plan.scratch_bytes else 0
        self.arena = arena
        for b in plan.buffers:  # a view's base comes before it
            if b.base is not None:
                self.ptr[id(b)] = self.ptr[id(b.base)] + b.view_offset
            elif b.kind == "scratch":
                self.ptr[id(b)] = arena + b.offset
            else:
                self.ptr[id(b)] = self._alloc(b.nbytes)
            if b.kind == "const":
                cuda.memcpy_htod(self.ptr[id(b)], np.ascontiguousarray(b.data))
        self.inputs = {b.index: b for b in plan.buffers if b.kind == "input"}
        self.outputs = {b.index: b for b in plan.buffers if b.kind == "output"}
        self.param_set = ParamSet(plan.params)  # the parameter arrays on the device
        self.prologue_pending = True  # the prologue has not run on the current parameters
        self.prologue_runs = 0
        self.blas = None
        if any(isinstance(s, Gemm) for s in plan.steps):
            from tgc.runtime.cublas import cublas

            self.blas = cublas()
        self.calls = [self._prepare(s) for s in plan.steps]

    def _alloc(self, nbytes: int) -> int:
        a = cuda.mem_alloc(max(int(nbytes), 1))
        self.allocations.append(a)
        return int(a)

    def _prepare(self, step):
        if isinstance(step, Launch):
            fn = self.functions[id(step)]
            args = [self.ptr[id(b)] for b in step.args]
            k = step.kernel
            if k.shared_bytes:
                return lambda: fn.prepared_async_call(
                    k.grid, k.block, self.stream, *args, shared_size=k.shared_bytes
                )
            return lambda: fn.prepared_async_call(k.grid, k.block, self.stream, *args)
        if isinstance(step, Gemm):
            a, b, c = self.ptr[id(step.a)], self.ptr[id(step.b)], self.ptr[id(step.c)]

            def gemm():
                self.blas.set_stream(self.stream.handle)
                status = self.blas.gemm(step, a, b, c)
                if status != 0:
                    raise TgcError(f"cuBLAS gemm failed with status {status}", step.loc)

            return gemm
        if isinstance(step, DeviceCopy):
            src, dst, n = self.ptr[id(step.src)], self.ptr[id(step.dst)], step.dst.nbytes
            return lambda: cuda.memcpy_dtod_async(dst, src, n, self.stream)
        raise TypeError(step)

    def upload(self, inputs: list[np.ndarray]) -> None:
        """Copy the inputs to the device: parameters only when `inputs` holds another set of
        parameter arrays than the last upload (by identity), which also schedules the prologue."""
        same_params = self.param_set.same(inputs)
        for i, b in self.inputs.items():
            if same_params and i in self.param_set.positions:
                continue
            host = np.ascontiguousarray(np.asarray(inputs[i]).astype(b.type.dtype, copy=False))
            cuda.memcpy_htod_async(self.ptr[id(b)], host, self.stream)
        if not same_params:
            self.param_set.hold(inputs)
            self.prologue_pending = True
        self.stream.synchronize()

    def launch(self, check_each: bool = False) -> None:
        """Enqueue the prologue if the current parameters have not had it, then every other
        step, in order on the stream (no synchronisation unless `check_each`)."""
        if self.prologue_pending:
            self._launch(self.plan.prologue, check_each)
            self.prologue_pending = False
            self.prologue_runs += 1
        self._launch(self.plan.per_call, check_each)

    def _launch(self, steps: list[int], check_each: bool) -> None:
        for i in steps:
            step = self.plan.steps[i]
            try:
                self.calls[i]()
                if check_each:
                    self.stream.synchronize()
            except cuda.Error as e:
                raise TgcError(f"{_describe(step)} failed to run: {e}", _loc(step)) from None

    def profile(self, reps: int = 5) -> list[tuple[str, float]]:
        """Median milliseconds of each step a call runs (CUDA events between steps; inputs as
        uploaded); the prologue runs first if it is due, untimed."""
        if self.prologue_pending:
            self.launch()
        steps = self.plan.per_call
        times: list[list[float]] = [[] for _ in steps]
        for _ in range(reps):
            marks = [cuda.Event() for _ in range(len(steps) + 1)]
            marks[0].record(self.stream)
            for j, i in enumerate(steps):
                self.calls[i]()
                marks[j + 1].record(self.stream)
            marks[-1].synchronize()
            for j in range(len(steps)):
                times[j].append(marks[j].time_till(marks[j + 1]))
        return [(_describe(self.plan.steps[i]), float(np.median(t))) for i, t in zip(steps, times)]

    def download(self) -> list[np.ndarray]:
        outs = []
        for j, t in enumerate(self.plan.outputs):
            host = np.empty(t.shape, dtype=t.dtype)
            cuda.memcpy_dtoh_async(host, self.ptr[id(self.outputs[j])], self.stream)
            outs.append(host)
        self.stream.synchronize()
        return outs

    def poison(self, byte: int = 0xFF) -> None:
        """Fill outputs and scratch with `byte` (0xFF bytes are NaN for floats), so that an
        element a kernel forgets to write, or a read of memory nothing wrote, shows. That
        overwrites the prologue's results too, so the next launch runs the prologue again."""
        for b in self.outputs.values():
            cuda.memset_d8(self.ptr[id(b)], byte, b.nbytes)
        if self.plan.scratch_bytes:
            cuda.memset_d8(self.arena, byte, self.plan.scratch_bytes)
        self.prologue_pending = True

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        self.upload(inputs)
        self.launch(check_each=True)
        return self.download()


def _kernel_label(k: KernelSource) -> str:
    """`kernel 'IR name' (C symbol)`, on one line whatever characters the IR name holds."""
    return f"kernel '{display_name(k.ir_name)}' ({k.name})"


def _describe(step) -> str:
    if isinstance(step, Launch):
        return _kernel_label(step.kernel)
    if isinstance(step, Gemm):
        return f"cuBLAS gemm ({step.m}x{step.n}x{step.k})"
    return "device copy"


def _loc(step):
    if isinstance(step, Launch):
        return step.kernel.loc
    return getattr(step, "loc", None)

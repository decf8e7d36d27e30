"""What the CUDA runner enqueues, call by call, checked on the CPU: PyCUDA and cuBLAS are replaced
by recorders, so the test sees every upload, launch and GEMM (not their results; those are
test/test_cuda_params.py's, on a GPU).

The prologue (the packing of merged parameter weights) runs on the first call, again after a new
parameter array or a poison, and never otherwise; parameters are uploaded only with it; every
other input is uploaded on every call.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import tgc.dialects  # noqa: F401  (registers the ops)
import tgc.runtime
from tgc.codegen.plan import Launch, build_plan
from tgc.parser import parse_module
from tgc.pass_manager import PassManager


class Recorder:
    def __init__(self) -> None:
        self.log: list[tuple] = []

    def take(self) -> list[tuple]:
        out, self.log = self.log, []
        return out


def fake_driver(rec: Recorder) -> types.ModuleType:
    """The parts of pycuda.driver the executor calls, recording what reaches the device."""
    cuda = types.ModuleType("pycuda.driver")
    next_ptr = [0x1000]

    class Error(Exception):
        pass

    class Context:
        @staticmethod
        def get_device():
            return types.SimpleNamespace(compute_capability=lambda: (9, 0))

        def push(self):
            pass

        def pop(self):
            pass

    class Device:
        @staticmethod
        def count():
            return 1

        def __init__(self, index):
            pass

        def retain_primary_context(self):
            return Context()

    class Stream:
        handle = 0

        def synchronize(self):
            pass

    class Event:
        def record(self, stream):
            pass

        def synchronize(self):
            pass

        def time_till(self, other):
            return 0.001

    def mem_alloc(nbytes):
        next_ptr[0] += (int(nbytes) + 255) // 256 * 256
        return next_ptr[0]

    cuda.Error, cuda.Context, cuda.Device, cuda.Stream, cuda.Event = (
        Error,
        Context,
        Device,
        Stream,
        Event,
    )
    cuda.init = lambda: None
    cuda.mem_alloc = mem_alloc
    cuda.memcpy_htod = lambda ptr, data: rec.log.append(("const", ptr))
    cuda.memcpy_htod_async = lambda ptr, host, stream: rec.log.append(("upload", ptr))
    cuda.memcpy_dtoh_async = lambda host, ptr, stream: rec.log.append(("download", ptr))
    cuda.memcpy_dtod_async = lambda dst, src, n, stream: rec.log.append(("copy", dst))
    cuda.memset_d8 = lambda ptr, byte, n: rec.log.append(("poison", ptr))
    return cuda


@pytest.fixture
def executor(monkeypatch):
    return install(monkeypatch)


def install(monkeypatch):
    """tgc.runtime.cuda_executor imported over the recorders; undoing `monkeypatch` brings back
    the real modules (or their absence)."""
    rec = Recorder()
    pycuda = types.ModuleType("pycuda")
    pycuda.driver = fake_driver(rec)
    monkeypatch.setitem(sys.modules, "pycuda", pycuda)
    monkeypatch.setitem(sys.modules, "pycuda.driver", pycuda.driver)
    blas = types.SimpleNamespace(
        set_stream=lambda handle: None,
        gemm=lambda step, a, b, c: rec.log.append(("gemm", c)) or 0,
    )
    cublas = types.ModuleType("tgc.runtime.cublas")
    cublas.cublas = lambda: blas
    monkeypatch.setitem(sys.modules, "tgc.runtime.cublas", cublas)
    monkeypatch.delitem(sys.modules, "tgc.runtime.cuda_executor", raising=False)
    # the import below sets the package's attribute: this puts the old one (or none) back after
    monkeypatch.setattr(tgc.runtime, "cuda_executor", None, raising=False)
    import tgc.runtime.cuda_executor as module

    class Function:
        def __init__(self, kernel):
            self.kernel = kernel

        def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
            rec.log.append(("launch", self.kernel.ir_name))

    monkeypatch.setattr(module, "load_kernels", lambda kernels: [Function(k) for k in kernels])
    return module, rec


def qkv_runner(executor, params: bool):
    module, rec = executor
    x, w = "tensor<48x32xbf16>", "tensor<32x16xbf16>"
    w3, y, y3 = "tensor<32x48xbf16>", "tensor<48x16xbf16>", "tensor<48x48xbf16>"
    p = " {tgc.param}" if params else ""
    # QKV already merged (algebraic leaves returned products apart: each piece of the split
    # would be copied out), so that the plan has a concat for the prologue to run.
    text = f"""func.func @qkv(%x: {x}, %wq: {w}{p}, %wk: {w}{p}, %wv: {w}{p}) -> ({y}, {y}, {y}) {{
  %w = atomic.concat %wq, %wk, %wv {{axis = 1}} : ({w}, {w}, {w}) -> {w3}
  %m = atomic.matmul %x, %w : ({x}, {w3}) -> {y3}
  %q, %k, %v = atomic.split %m {{axis = 1, sizes = [16, 16, 16]}} : ({y3}) -> ({y}, {y}, {y})
  func.return %q, %k, %v : {y}, {y}, {y}
}}"""
    m = parse_module(text)
    PassManager.from_text("cuda").run(m)
    runner = module.CudaPlanRunner(build_plan(m.funcs[0]))
    rec.take()  # constants uploaded at construction
    uploads = {runner.ptr[id(b)]: i for i, b in runner.inputs.items()}
    return runner, rec, uploads


def calls(rec: Recorder, uploads: dict) -> tuple[list[int], list[str]]:
    """(the inputs uploaded, the device work enqueued) since the last look."""
    log = rec.take()
    sent = sorted(uploads[e[1]] for e in log if e[0] == "upload")
    work = [e[1] if e[0] == "launch" else e[0] for e in log if e[0] in ("launch", "gemm", "copy")]
    return sent, work


def arrays(rng, n: int = 3):
    x = rng.standard_normal((48, 32)).astype(np.float32)
    return x, [rng.standard_normal((32, 16)).astype(np.float32) for _ in range(n)]


def test_prologue_runs_once_per_parameter_set(executor):
    runner, rec, uploads = qkv_runner(executor, params=True)
    plan = runner.plan
    assert [type(plan.steps[i]).__name__ for i in plan.prologue] == ["Launch"]
    concat = plan.steps[plan.prologue[0]].kernel.ir_name
    per_call = [
        plan.steps[i].kernel.ir_name if isinstance(plan.steps[i], Launch) else "gemm"
        for i in plan.per_call
    ]
    assert per_call[0] == "gemm" and len(per_call) == 4  # the GEMM and three slices
    rng = np.random.default_rng(0)
    x, ws = arrays(rng)

    runner.run([x, *ws])
    assert calls(rec, uploads) == ([0, 1, 2, 3], [concat, *per_call])
    assert runner.prologue_runs == 1

    x2, _ = arrays(rng, 0)
    runner.run([x2, *ws])  # same parameters: x alone, no packing
    assert calls(rec, uploads) == ([0], per_call)

    ws[0] = ws[0].copy()  # a new array for one parameter: all of them again, and the packing
    runner.run([x2, *ws])
    assert calls(rec, uploads) == ([0, 1, 2, 3], [concat, *per_call])

    runner.poison()  # the packed weights are overwritten: pack again, no new upload needed
    runner.run([x2, *ws])
    assert calls(rec, uploads) == ([0], [concat, *per_call])
    assert runner.prologue_runs == 3


def test_launch_after_upload_and_profile(executor):
    """The benchmark's way (upload once, then launch repeatedly) packs on the first launch only;
    profile() times the per-call steps."""
    runner, rec, uploads = qkv_runner(executor, params=True)
    concat = runner.plan.steps[runner.plan.prologue[0]].kernel.ir_name
    x, ws = arrays(np.random.default_rng(1))
    runner.upload([x, *ws])
    runner.launch()
    runner.launch()
    sent, work = calls(rec, uploads)
    assert sent == [0, 1, 2, 3]
    assert work.count(concat) == 1 and work.count("gemm") == 2
    times = runner.profile(reps=2)
    assert len(times) == len(runner.plan.per_call)
    assert concat not in calls(rec, uploads)[1]


def test_without_params_every_step_runs_every_call(executor):
    """Plain weights: at this small size algebraic still merges (two launches saved pay for a
    concat of 3 KB), but the concat then runs on every call, as does every upload."""
    runner, rec, uploads = qkv_runner(executor, params=False)
    plan = runner.plan
    assert plan.prologue == [] and plan.per_call == list(range(len(plan.steps)))
    every = [s.kernel.ir_name if isinstance(s, Launch) else "gemm" for s in plan.steps]
    assert every[:2] == ["qkv_concat", "gemm"]
    x, ws = arrays(np.random.default_rng(2))
    for _ in range(2):
        runner.run([x, *ws])
        assert calls(rec, uploads) == ([0, 1, 2, 3], every)
    assert runner.prologue_runs == 1  # no parameters: one set, and an empty prologue


def test_recorders_do_not_outlive_the_test():
    def state():
        names = ("pycuda", "pycuda.driver", "tgc.runtime.cublas", "tgc.runtime.cuda_executor")
        return [sys.modules.get(n) for n in names] + [getattr(tgc.runtime, "cuda_executor", None)]

    before = state()
    with pytest.MonkeyPatch.context() as mp:
        module, _ = install(mp)
        assert state()[-1] is module
    assert all(a is b for a, b in zip(state(), before))

"""The profiler and tuning (planner/profile.py, planner/tune.py): instances of a module, checks
before timings, a killed run resumed, two profilers at once, wrong kernels and wrong parameter
points never chosen, the best measured parameters used by select-kernels."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tgc.parser import parse_module
from tgc.planner import load_backends
from tgc.planner.cost import DictCostSource, RooflineCostSource
from tgc.planner.db import Database
from tgc.planner.estimate import DatabaseCostSource
from tgc.planner.executor import run_plan
from tgc.diagnostics import TgcError
from tgc.planner.kernel import KERNELS, Kernel, register_kernel, unregister_kernel
from tgc.planner.options import PlanContext
from tgc.planner.profile import (
    MIN_RUNS,
    Instance,
    Profiler,
    Progress,
    instances,
    measure,
    time_call,
)
from tgc.planner.select import prepare, select_kernels
from tgc.types import TensorType

load_backends(["numpy"])  # numpy's kernels alone, whatever is installed
BIN = os.path.dirname(sys.executable)
NUMPY = [k for k in KERNELS.values() if k.backend == "numpy"]


def func_of(text: str):
    module = parse_module(text, "<test>")
    func = module.funcs[0]
    prepare(func)
    return func


def block(n: int) -> str:
    """n equal MLP blocks in a chain."""
    t, w = "tensor<8x32xf32>", "tensor<32x32xf32>"
    lines, x = [], "%x"
    for i in range(n):
        lines.append(f"%h{i} = hl.linear {x}, %w : ({t}, {w}) -> {t}")
        lines.append(f'%g{i} = hl.gelu %h{i} {{approximate = "tanh"}} : ({t}) -> {t}')
        lines.append(f"%y{i} = atomic.add %g{i}, {x} : ({t}, {t}) -> {t}")
        x = f"%y{i}"
    body = "\n  ".join(lines)
    return f"func.func @f(%x: {t}, %w: {w}) -> {t} {{\n  {body}\n  func.return {x} : {t}\n}}\n"


def test_repeated_blocks_give_their_instances_once():
    ctx = PlanContext(NUMPY, 1e-5)
    one = {i.key() for i in instances(func_of(block(1)), ctx)}
    four = instances(func_of(block(4)), PlanContext(NUMPY, 1e-5))
    assert len(four) == len({i.key() for i in four}) == len(one)
    assert {i.key() for i in four} == one
    names = {i.kernel.name for i in four}
    # every option: the hl kernels, their decompositions' kernels, the graph kernels
    assert {"numpy.hl.linear", "numpy.atomic.matmul", "numpy.hl.gelu", "numpy.tanh"} <= names


def test_measure_checks_then_times():
    a, b = TensorType.get((48, 64), "f32"), TensorType.get((64, 32), "f32")
    inst = Instance(KERNELS["numpy.atomic.matmul"], (a, b), (TensorType.get((48, 32), "f32"),))
    m = measure(inst, min_time=0.01)
    assert m.ok and m.runs >= MIN_RUNS and 0 < m.min <= m.median
    assert 0 <= m.max_error < 1e-5  # float32 BLAS against float64
    assert (m.bytes, m.flops) == (4.0 * (48 * 64 + 64 * 32 + 48 * 32), 2.0 * 48 * 32 * 64)


def test_a_large_constant_is_keyed_by_a_digest_and_each_key_printed_once(monkeypatch):
    """GPT-2's causal mask (4x1x512x512) printed into an instance's key was 5.8 MB of text,
    printed six times a compile: most of a second compile's time."""
    from tgc.attributes import DenseAttr
    from tgc.planner import profile

    t = TensorType.get((4, 1, 512, 512), "f32")
    mask = np.triu(np.full((512, 512), -np.inf, np.float32), 1) * np.ones((4, 1, 1, 1), np.float32)
    other = mask.copy()
    other[3, 0, 511, 0] = 1.0
    kernel = KERNELS["numpy.atomic.constant"]
    one, two = (Instance(kernel, (), (t,), {"value": DenseAttr(v, t)}) for v in (mask, other))
    assert len(one.attrs_text) < 200 and one.attrs_key != two.attrs_key
    again = Instance(kernel, (), (t,), {"value": DenseAttr(mask.copy(), t)})
    assert again.attrs_key == one.attrs_key
    printed = []
    original = profile.format_attr_dict
    monkeypatch.setattr(
        profile, "format_attr_dict", lambda attrs: printed.append(attrs) or original(attrs)
    )
    fresh = Instance(kernel, (), (t,), {"value": DenseAttr(mask, t)})
    keys = {fresh.key() for _ in range(5)}
    assert len(keys) == 1 and len(printed) == 1
    small = TensorType.get((2, 2), "f32")
    value = {"value": DenseAttr(np.eye(2, dtype=np.float32), small)}
    # a small constant keeps the key it had: its printed attributes
    assert Instance(kernel, (), (small,), value).attrs_text == original(value)


def test_a_reference_that_cannot_run_on_random_inputs_is_a_failure_not_a_crash(monkeypatch):
    """A region whose indices are computed inside it may index out of range on random inputs
    (BERT's first use on the GPU stopped with that error): the instance fails, the run goes
    on."""
    from tgc.planner import profile

    class Unrunnable:
        def reference(self, precision):
            raise TgcError("'atomic.gather' op index 3 is out of range [0, 2) of axis 0")

    monkeypatch.setattr(profile, "checker", lambda inst, ref, seed: Unrunnable())
    x = TensorType.get((4, 8), "f32")
    m = measure(Instance(KERNELS["numpy.atomic.exp"], (x,), (x,)), min_time=0.005)
    assert not m.ok
    assert m.message == (
        "its reference cannot be evaluated on random inputs: 'atomic.gather' op index 3 is out "
        "of range [0, 2) of axis 0"
    )


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_16_bit_instance_is_checked_and_timed(dtype):
    """The check's rounding allowance reads the type's epsilon (numpy's finfo knows no bf16:
    tgc-profile stopped with an internal error on a bf16 GPT-2 block)."""
    x = TensorType.get((32, 64), dtype)
    m = measure(Instance(KERNELS["numpy.atomic.exp"], (x,), (x,)), min_time=0.005)
    assert m.ok, m.message
    assert 0 <= m.max_error < 8 * 2.0 ** (-8 if dtype == "bf16" else -11)


def test_queued_work_costs_the_longer_of_device_and_host_time():
    """In a space that times queued work (the GPU), each call costs max(device, host): the
    device's time where the host keeps ahead, the host's where the device waits for it."""
    calls = []
    device = np.array([5e-6, 5e-6, 5e-6, 40e-6, 40e-6, 40e-6, 40e-6])
    host = np.array([20e-6, 20e-6, 20e-6, 1e-6, 1e-6, 1e-6, 1e-6])

    def queued(call, runs, first):
        assert runs == MIN_RUNS  # a slow first call: the fewest runs
        assert first >= 0.01  # the synchronised call time_call measured, passed on
        for _ in range(runs):
            call()
        return device[:runs], host[:runs]

    def slow():
        calls.append(1)
        time.sleep(0.01)

    timing = time_call(slow, lambda: None, min_time=1e-3, queued=queued)
    want = np.maximum(device[:MIN_RUNS], host[:MIN_RUNS])
    assert timing.runs == MIN_RUNS and len(calls) == 2 + MIN_RUNS  # warm-up and first call
    assert timing.median == pytest.approx(float(np.median(want)))
    assert timing.min == pytest.approx(float(want.min()))
    # what the call adds to a plan replayed as a CUDA graph: the device's time alone
    assert timing.device_median == pytest.approx(float(np.median(device[:MIN_RUNS])))
    assert time_call(slow, lambda: None, min_time=1e-3).device_median is None


def _exp_times(factor: float):
    def run(inputs, attrs, result_types):
        return [(np.exp(inputs[0]) * factor).astype(result_types[0].dtype)]

    return run


def _raises(inputs, attrs, result_types):
    raise RuntimeError("out of registers")


@pytest.fixture
def bad_kernels():
    made = [
        register_kernel(Kernel("numpy.wrong_exp", "numpy", op="atomic.exp", run=_exp_times(1.01))),
        register_kernel(Kernel("numpy.raising_exp", "numpy", op="atomic.exp", run=_raises)),
    ]
    yield made
    for k in made:
        unregister_kernel(k.name)


EXP = """
func.func @f(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %y = atomic.exp %x : (tensor<64x64xf32>) -> tensor<64x64xf32>
  func.return %y : tensor<64x64xf32>
}
"""


def test_a_wrong_kernel_is_recorded_as_a_failure_and_never_chosen(tmp_path, bad_kernels):
    path = str(tmp_path / "m.sqlite")
    pool = [KERNELS["numpy.atomic.exp"], *bad_kernels]
    # the wrong kernels look cheapest to the model: only the measurement can tell
    model = DictCostSource(
        {"numpy.wrong_exp": 1e-9, "numpy.raising_exp": 1e-9}, RooflineCostSource()
    )

    def chosen() -> str:
        func = func_of(EXP)
        select_kernels(func, DatabaseCostSource(path, fallback=model), kernels=pool)
        return next(op.attr("callee") for op in func.body.ops if op.name == "kernel.call")

    assert chosen() in ("numpy.wrong_exp", "numpy.raising_exp")
    with Database.open(path) as db:
        report = Profiler(db, min_time=0.005, progress=False).run(
            instances(func_of(EXP), PlanContext(pool, 1e-5))
        )
        rows = {m.kernel.name: m for m in db.rows()}
    assert (report.measured, report.failed) == (1, 2)
    wrong, raising = rows["numpy.wrong_exp"], rows["numpy.raising_exp"]
    assert wrong.status == "failed" and wrong.median is None and wrong.runs is None
    assert wrong.max_error == pytest.approx(0.01, rel=1e-3)
    assert wrong.message.startswith("wrong result: error 0.01 against float64 exceeds")
    assert raising.message == "raised RuntimeError: out of registers"
    assert rows["numpy.atomic.exp"].ok
    assert chosen() == "numpy.atomic.exp"


# -- tuning --------------------------------------------------------------------------------------


def _rows_exp(inputs, attrs, result_types):
    """exp in blocks of `rows` rows; the block size 16 forgets the last block (a bug that makes
    it the fastest point)."""
    x, rows = np.asarray(inputs[0]), attrs["rows"]
    out = np.zeros_like(x)
    stop = x.shape[0] - rows if rows == 16 else x.shape[0]
    for start in range(0, stop, rows):
        out[start : start + rows] = np.exp(x[start : start + rows])
    return [out]


def _rows_divide(types, params) -> str | None:
    (x, *_), _ = types
    return None if x.shape[0] % params["rows"] == 0 else "rows must divide the row count"


@pytest.fixture
def rows_kernel():
    k = register_kernel(
        Kernel(
            "numpy.rows_exp",
            "numpy",
            op="atomic.exp",
            run=_rows_exp,
            params={"rows": (1, 2, 3, 4, 8, 16, 32)},
            param_constraints=_rows_divide,
        )
    )
    yield k
    unregister_kernel(k.name)


ROWS = """
func.func @f(%x: tensor<32x2048xf32>) -> tensor<32x2048xf32> {
  %y = atomic.exp %x : (tensor<32x2048xf32>) -> tensor<32x2048xf32>
  func.return %y : tensor<32x2048xf32>
}
"""


def test_tuning_stores_every_point_and_select_kernels_runs_the_best(tmp_path, rows_kernel):
    path = str(tmp_path / "m.sqlite")
    insts = instances(func_of(ROWS), PlanContext([rows_kernel], 1e-5))
    with Database.open(path) as db:
        report = Profiler(db, min_time=0.01, progress=False).run(insts, tune=True)
        rows = db.rows()
    points = {m.params["rows"]: m for m in rows}
    assert sorted(points) == [1, 2, 4, 8, 16, 32]  # 3 is refused by the constraint, not run
    assert report.measured == 1 and report.tuned == 5
    assert points[1].origin == "profile" and {points[r].origin for r in (2, 4, 8, 16, 32)} == {
        "tune"
    }
    assert points[16].status == "failed" and points[16].median is None
    fastest = min((m.median, r) for r, m in points.items() if m.ok)[1]
    assert fastest != 16
    source = DatabaseCostSource(path)
    x = TensorType.get((32, 2048), "f32")
    assert source.tuned_params(rows_kernel, (x,), (x,)) == {"rows": fastest}
    func = func_of(ROWS)
    select_kernels(func, source, kernels=[rows_kernel])
    (call,) = [op for op in func.body.ops if op.name == "kernel.call"]
    assert call.attr("param.rows") == fastest
    assert call.attr("plan.source") == "measured"
    data = np.random.default_rng(3).standard_normal((32, 2048)).astype(np.float32)
    (got,) = run_plan(func, [data])
    np.testing.assert_allclose(got, np.exp(data.astype(np.float64)), rtol=1e-6)


def test_tuning_resumes_without_measuring_a_point_twice(tmp_path, rows_kernel):
    path = str(tmp_path / "m.sqlite")
    insts = instances(func_of(ROWS), PlanContext([rows_kernel], 1e-5))
    with Database.open(path) as db:
        first = Profiler(db, min_time=0.005, progress=False).run(insts, tune=True)
        again = Profiler(db, min_time=0.005, progress=False).run(insts, tune=True)
        assert len(db.rows()) == 6
    assert (first.tuned, again.tuned, again.known, again.measured) == (5, 0, 1, 0)


def test_kernels_of_one_name_are_known_apart_after_a_run(tmp_path):
    """Generated regions share their template's name and differ in source hash: a second run
    finds each one's record (it once looked up every region under the first one's)."""
    same_name = [
        Kernel("numpy.region_like", "numpy", op="atomic.exp", run=_exp_times(1.0), max_rel_error=e)
        for e in (0.0, 1e-7, 2e-7)
    ]
    x, y = TensorType.get((16, 64), "f32"), TensorType.get((8, 32), "f32")
    # two regions on their own types, and a third on the first one's types
    insts = [Instance(k, (t,), (t,)) for k, t in zip(same_name, (x, y, x))]
    path = str(tmp_path / "m.sqlite")
    with Database.open(path) as db:
        first = Profiler(db, min_time=0.002, progress=False).run(insts[:2])
        again = Profiler(db, min_time=0.002, progress=False).run(insts)
        assert len(db.rows()) == 3
    assert (first.measured, again.known, again.measured) == (2, 2, 1)


# -- a run: progress, kill, concurrency -----------------------------------------------------------


def test_progress_without_tqdm_prints_counts_and_eta(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    out = io.StringIO()
    bar = Progress(2, "measuring", stream=out)
    bar.step("numpy.atomic.exp")
    bar.step("numpy.atomic.add")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("measuring: 1/2, ETA ") and lines[0].endswith("numpy.atomic.exp")
    assert lines[1].startswith("measuring: 2/2, ETA 0 s")


CHAIN = """
func.func @f(%x: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %a = atomic.exp %x : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %b = atomic.sin %a : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %c = atomic.cos %b : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %d = atomic.abs %c : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %e = atomic.neg %d : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %f = atomic.sqrt %d : (tensor<256x256xf32>) -> tensor<256x256xf32>
  %g = atomic.mul %e, %f : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
  %h = atomic.erf %g : (tensor<256x256xf32>) -> tensor<256x256xf32>
  func.return %h : tensor<256x256xf32>
}
"""


def profile_cmd(module: str, db: str, *extra: str) -> list[str]:
    # The planner's backends are named, so the instances do not depend on what this machine
    # has installed (with torch or a GPU, more options would reach numpy kernels).
    return [
        os.path.join(BIN, "tgc-profile"),
        module,
        "--db",
        db,
        "--kernel-backend",
        "numpy",
        "--planner-backends",
        "numpy",
        *extra,
    ]


def record_count(path: str) -> int:
    with Database.open(path, readonly=True) as db:
        assert db.con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return len(db.rows())


def test_sigkill_mid_run_leaves_a_readable_database_the_next_run_completes(tmp_path):
    module, path = tmp_path / "chain.tg", str(tmp_path / "m.sqlite")
    module.write_text(CHAIN)
    total = len(instances(func_of(CHAIN), PlanContext(NUMPY, 1e-5)))
    proc = subprocess.Popen(
        profile_cmd(str(module), path, "--min-time", "0.4", "--quiet"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(path) and _safe_count(path) >= 2:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done = record_count(path)
    assert 2 <= done < total
    out = subprocess.run(
        profile_cmd(str(module), path, "--min-time", "0.001", "--quiet"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"{total} kernel instance(s), {done} already known, {total - done} measured" in out
    assert record_count(path) == total
    dry = subprocess.run(
        profile_cmd(str(module), path, "--dry-run"), capture_output=True, text=True, check=True
    )
    assert dry.stdout.strip().endswith(
        f"0 of {total} kernel instance(s) to measure on this machine (database {path})"
    )


def _safe_count(path: str) -> int:
    try:
        with Database.open(path, readonly=True) as db:
            return len(db.rows())
    except Exception:  # noqa: BLE001  (the file is being created)
        return 0


OTHER = CHAIN.replace("atomic.erf %g", "hl.tanh %g").replace("atomic.sin", "atomic.log")


def test_two_profilers_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "m.sqlite")
    keys = set()
    procs = []
    for i, text in enumerate((CHAIN, OTHER)):
        module = tmp_path / f"m{i}.tg"
        module.write_text(text)
        keys |= {k.key() for k in instances(func_of(text), PlanContext(NUMPY, 1e-5))}
        procs.append(
            subprocess.Popen(
                # -p '': the program as written, whose instances `keys` lists
                profile_cmd(str(module), path, "--min-time", "0.02", "--quiet", "-p", ""),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert "0 failed" in out and err == ""
    with Database.open(path, readonly=True) as db:
        stored = {(m.kernel.name, m.signature) for m in db.rows()}
    assert stored == {(name, signature) for name, signature, _, _ in keys}


# -- generated kernels: no `run`, the backend runs the call's region -----------------------------

FMA_TEXT = """
func.func @fma(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %c: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %bc = atomic.mul %b, %c : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = atomic.add %a, %bc : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}
"""


@pytest.mark.parametrize("offset, ok", [(0.0, True), (1.0, False)])
def test_a_generated_kernel_is_checked_and_timed_through_run_region(monkeypatch, offset, ok):
    from tgc.planner.backends import BACKENDS, Backend
    from tgc.evaluate import evaluate_block

    seen = []

    def run_region(op, inputs):  # what a CUDA backend does, interpreted on the host
        seen.append(op.attr("callee"))
        return [r + np.float32(offset) for r in evaluate_block(op.body, inputs, "native")]

    monkeypatch.setitem(BACKENDS, "numpy", Backend("numpy", run_region=run_region))
    kernel = Kernel("numpy.generated_fma", "numpy", reference=FMA_TEXT)  # no run
    x = TensorType.get((64, 32), "f32")
    m = measure(Instance(kernel, (x, x, x), (x,)), min_time=0.001)
    assert seen and set(seen) == {"numpy.generated_fma"}
    assert m.ok is ok
    if ok:
        assert m.median > 0 and m.max_error < 1e-6
    else:
        assert m.message.startswith("wrong result") and m.median is None


TWO_RESULTS = """
func.func @two(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %s = atomic.add %a, %b : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = atomic.exp %s : (tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %s, %y : tensor<4x8xf32>, tensor<4x8xf32>
}
"""


@pytest.mark.parametrize("wrong", [None, 0, 1])
def test_a_generated_kernel_with_two_results_is_checked_on_both(monkeypatch, wrong):
    """A region that also writes a value it covers (two results) is checked on every result
    against float64: a kernel wrong in either one is a failure, never a time."""
    from tgc.evaluate import evaluate_block
    from tgc.planner.backends import BACKENDS, Backend

    def run_region(op, inputs):
        outs = list(evaluate_block(op.body, inputs, "native"))
        if wrong is not None:
            outs[wrong] = outs[wrong] + np.float32(1.0)
        return outs

    monkeypatch.setitem(BACKENDS, "numpy", Backend("numpy", run_region=run_region))
    kernel = Kernel("numpy.generated_two", "numpy", reference=TWO_RESULTS)  # no run
    x = TensorType.get((64, 32), "f32")
    m = measure(Instance(kernel, (x, x), (x, x)), min_time=0.001)
    assert m.ok is (wrong is None)
    if wrong is None:
        assert m.median > 0 and m.max_error < 1e-6
    else:
        assert m.message.startswith("wrong result") and m.median is None

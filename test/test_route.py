"""The GPU route (planner/route.py) on the stand-in device of test_planner_cuda.py: no GPU needed.

What is checked: the route measures on first use into the database and a second compile of the
same program measures nothing; library kernels are measured first, the heaviest op first; the
whole-plan check runs the fastest candidate; the planning tolerance follows the element types;
with --no-measure nothing is written; results match float64.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from test_planner_cuda import stand_in as _stand_in_device  # noqa: F401  (a fixture)

import tgc
from tgc.planner import route
from tgc.planner.db import dtypes_of
from tgc.planner.estimate import instance_bytes
from tgc.planner.profile import instances
from tgc.planner.select import prepare
from tgc.planner.cost import RooflineCostSource
from tgc.runtime.interpreter import random_inputs, run_function

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
QUICK = route.RouteOptions(measure_budget=60.0, progress=False, min_time=0.002)


@pytest.fixture
def stand_in(_stand_in_device, monkeypatch):  # noqa: F811
    """The stand-in device, its timings said to be the stand-in's (no GPU to describe), and
    the torch backends left out (their torch-cuda needs a GPU)."""
    from tgc.planner import db

    monkeypatch.setitem(db.FINGERPRINTS, "cuda", lambda: {"gpu": "stand-in"})
    monkeypatch.setattr(route, "FAMILIES", ("cuda",))
    db.device_info.cache_clear()
    yield _stand_in_device
    db.device_info.cache_clear()


def _compile(text: str, db: Path, **options):
    module = tgc.parse(text)
    opts = route.RouteOptions(**{**QUICK.__dict__, "db": str(db), **options})
    return route.compile_module(module, None, opts)


def _records(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT count(*) FROM measurements").fetchone()[0]


@pytest.mark.parametrize("example", ["mlp", "gelu_scale"])
def test_first_use_measures_and_the_second_compile_measures_nothing(example, stand_in, tmp_path):
    db = tmp_path / "m.sqlite"
    text = (EXAMPLES / f"{example}.tg").read_text()
    first = _compile(text, db)
    assert first.report.measured > 0 and first.report.unmeasured == 0
    recorded = _records(db)
    assert recorded >= first.report.measured
    second = _compile(text, db)
    assert second.report.measured == 0 and second.report.unmeasured == 0
    assert _records(db) == recorded
    tgc.verify(second.func)  # the planned function: copies where the signature needs them
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 3)
    want = run_function(reference, inputs, "f64")
    got = second.run_host(inputs)
    for g, w in zip(got, want):
        scale = max(float(np.max(np.abs(w))), 1.0)
        assert float(np.max(np.abs(np.asarray(g, np.float64) - w))) <= 2e-4 * scale


def test_no_measure_writes_nothing_and_counts_what_it_left(stand_in, tmp_path):
    db = tmp_path / "m.sqlite"
    compiled = _compile((EXAMPLES / "mlp.tg").read_text(), db, measure=False)
    assert compiled.report.measured == 0
    assert compiled.report.unmeasured > 0
    assert not db.exists()


def test_a_budget_of_zero_measures_nothing_and_says_what_is_left(stand_in, tmp_path):
    db = tmp_path / "m.sqlite"
    compiled = _compile((EXAMPLES / "mlp.tg").read_text(), db, measure_budget=0.0)
    assert compiled.report.measured == 0 and compiled.report.unmeasured > 0
    assert "left unmeasured" in compiled.report.summary()


def test_library_products_are_measured_first_the_heaviest_first(stand_in, tmp_path):
    module = tgc.parse((EXAMPLES / "gpt2_block.tg").read_text())
    tgc.run_pipeline(module, "lower-for-planning")
    func = module.funcs[0]
    route.move_signature_to_device(func)
    insts = route._instances(func, 1e-5, str(tmp_path / "none.sqlite"))
    library = [route.is_library(i.kernel) and route.is_product(i.kernel) for i in insts]
    assert any(library) and not all(library)
    first_other = library.index(False)
    assert all(library[:first_other]) and not any(library[first_other:])
    defaults = RooflineCostSource.gpu_defaults()
    weights = [
        defaults.cost(i.kernel, i.operand_types, i.result_types, {}).seconds
        for i in insts[:first_other]
    ]
    assert weights == sorted(weights, reverse=True)


class _Sleeper:
    """A stand-in for a planned function: each call takes `seconds`."""

    def __init__(self, func, seconds: float) -> None:
        self.func, self.seconds, self.calls = func, seconds, 0

    def __call__(self, values):
        self.calls += 1
        time.sleep(self.seconds)
        return []


def test_the_whole_plan_check_runs_the_fastest_candidate(stand_in):
    func = tgc.parse((EXAMPLES / "softmax.tg").read_text()).funcs[0]
    route.move_signature_to_device(func)
    report = route.RouteReport()
    slow, fast = _Sleeper(func, 0.004), _Sleeper(func, 0.0005)
    # two different plans (their text tells them apart): the faster one wins
    other = (EXAMPLES / "softmax.tg").read_text().replace("{axis = -1}", "{axis = 0}")
    fast.func = tgc.parse(other).funcs[0]
    route.move_signature_to_device(fast.func)
    chosen = route._choose({"planned": slow, "library": fast, "default": None}, report)
    assert chosen == "library"
    assert set(report.candidates) == {"planned", "library"}
    assert report.candidates["library"] < report.candidates["planned"]
    assert slow.calls > 1 and fast.calls > 1


def test_the_library_plan_exists_where_some_op_has_no_library_kernel(stand_in, tmp_path):
    """The whole-plan check's baseline: where some op no library kernel runs (here the GELU:
    the stand-in device has cuBLAS but not PyTorch), generated kernels run there alone and
    every product stays on cuBLAS, as eager would run it; before, there was no library plan
    and nothing to hold the planned one against."""
    from tgc.planner.backends import TEMPLATES

    db = tmp_path / "m.sqlite"
    text = (EXAMPLES / "mlp.tg").read_text()
    compiled = _compile(text, db)
    assert "library" in compiled.report.candidates
    module = tgc.parse(text)
    tgc.run_pipeline(module, "lower-for-planning")
    func = module.funcs[0]
    route.move_signature_to_device(func)
    prepare(func)
    # the GPU's default costs (the stand-in's timings of cuBLAS are its host's, not a GPU's)
    costs = route.CachedCosts(route._costs(str(tmp_path / "none.sqlite")))
    tolerance = route.plan_tolerance(func)
    assert route._plan(func, tolerance, costs, False, generated=False) is None
    library = route._library_plan(func, tolerance, costs, False)
    callees = [op.attr("callee") for op in library.func.body.ops if op.name == "kernel.call"]
    products = [c for c in callees if c.startswith("cuda.cublas")]
    generated = [c for c in callees if c in TEMPLATES]
    assert products and generated, callees
    assert "cuda.matmul" not in generated, callees  # every product on the library's kernel
    # the plan's costs are the kernels' own: the bias that kept generated kernels out is not
    # in them (it made a GPT-2 plan read 63,001 ms planned)
    seconds = [op.attr("plan.seconds") for op in library.func.body.ops if op.name == "kernel.call"]
    assert max(seconds) < route.GENERATED_PENALTY / 100, seconds


def test_a_candidate_with_the_same_plan_is_not_timed_again(stand_in):
    func = tgc.parse((EXAMPLES / "softmax.tg").read_text()).funcs[0]
    route.move_signature_to_device(func)
    report = route.RouteReport()
    planned, same = _Sleeper(func, 0.0005), _Sleeper(func, 0.0)
    assert route._choose({"planned": planned, "default": same}, report) == "planned"
    assert same.calls == 0
    assert report.candidates["default"] == report.candidates["planned"]


@pytest.mark.parametrize(
    "types, tolerance",
    [
        ("tensor<4xbf16>", 3e-2),
        ("tensor<4xf16>", 2e-2),
        ("tensor<4xf32>", 2e-4),
        ("tensor<4xf64>", 1e-5),
        ("tensor<4xi64>", 1e-5),
    ],
)
def test_the_planning_tolerance_follows_the_element_type(types, tolerance):
    func = tgc.parse(
        f"func.func @f(%x: {types}) -> {types} {{\n  func.return %x : {types}\n}}"
    ).funcs[0]
    assert route.plan_tolerance(func) == tolerance


def test_the_signature_moves_to_the_device():
    func = tgc.parse((EXAMPLES / "mlp.tg").read_text()).funcs[0]
    route.move_signature_to_device(func)
    assert all(a.type.encoding == "cuda" for a in func.body.args)
    ftype = func.function_type
    assert all(t.encoding == "cuda" for t in (*ftype.inputs, *ftype.results))


@pytest.mark.parametrize("example", ["mlp", "gelu_scale"])
def test_a_planned_call_runs_on_the_device_alone_so_it_can_be_a_cuda_graph(
    example, stand_in, tmp_path
):
    compiled = _compile((EXAMPLES / f"{example}.tg").read_text(), tmp_path / "m.sqlite")
    assert compiled.planned.on_device_per_call()


CONSTANT_MASK = """func.func @masked(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %m = atomic.constant {value = dense<[[0.0, -1.0, 2.0, 3.5], [1.0, 0.5, -2.0, 0.0]]> : tensor<2x4xf32>} : () -> tensor<2x4xf32>
  %y = atomic.add %x, %m : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  func.return %y : tensor<2x4xf32>
}
"""


def test_constants_made_on_the_host_are_made_and_copied_once(stand_in, tmp_path):
    """A constant the plan makes on the host and copies to the device (host_constants) runs
    with the once steps: a call then works on the device alone (a CUDA graph can replay it)."""
    compiled = _compile(CONSTANT_MASK, tmp_path / "m.sqlite", measure=False)
    planned = compiled.planned
    names = [s.op.name for s in planned.steps if s.once]
    assert "kernel.copy" in names, [s.op.name for s in planned.steps]
    assert planned.on_device_per_call()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    mask = np.array([[0.0, -1.0, 2.0, 3.5], [1.0, 0.5, -2.0, 0.0]], np.float32)
    uploads = stand_in["from_host"]
    for _ in range(3):
        (got,) = compiled.run_host([x])
        np.testing.assert_array_equal(got, x + mask)
    # each call's argument alone: the constant was copied when the compile timed the plan
    assert stand_in["from_host"] - uploads == 3


def test_first_use_measures_what_the_plan_would_run_on_a_guess(stand_in, tmp_path, monkeypatch):
    """After the library's products, the instances the plan would run on a guessed cost are
    measured, dearest first, until the plan runs on measurements alone; then the rest."""
    from tgc.planner import profile

    runs: list[list] = []
    original = profile.Profiler.run

    def recording(self, insts, tune=False):
        runs.append(profile.unknown(insts, self.db))
        return original(self, insts, tune)

    monkeypatch.setattr(profile.Profiler, "run", recording)
    db = tmp_path / "m.sqlite"
    compiled = _compile((EXAMPLES / "gpt2_block.tg").read_text(), db)
    assert compiled.report.unmeasured == 0
    library, guessed, *rest = runs
    assert library and all(route.is_library(i.kernel) for i in library)
    assert guessed and not any(route.is_library(i.kernel) for i in guessed)
    func = compiled.func  # the function as planned: on the device, in canonical form
    tolerance = route.plan_tolerance(func)
    assert route._guessed(func, tolerance, str(db)) == []  # the plan: measurements alone
    assert rest  # then the rest


def test_the_plans_guesses_are_listed_dearest_first(stand_in, tmp_path):
    from tgc.pass_manager import PassManager
    from tgc.planner.select import prepare

    module = tgc.parse((EXAMPLES / "gpt2_block.tg").read_text())
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    route.move_signature_to_device(func)
    prepare(func)
    db = str(tmp_path / "empty.sqlite")
    guessed = route._guessed(func, 1e-5, db)
    assert guessed
    defaults = route.CachedCosts(route._costs(db))
    seconds = [defaults.cost(i.kernel, i.operand_types, i.result_types).seconds for i in guessed]
    assert seconds == sorted(seconds, reverse=True)
    assert len({i.key() for i in guessed}) == len(guessed)


def test_copies_are_measured_at_a_few_sizes_and_the_rest_estimated(stand_in, tmp_path):
    """A copy's time is a line in its bytes: first use measures COPY_SAMPLES sizes of each
    copy direction and element type (the smallest, the middle, the largest), and the
    database's estimate prices the others; a second compile measures nothing."""
    db = tmp_path / "m.sqlite"
    text = (EXAMPLES / "gpt2_block.tg").read_text()
    module = tgc.parse(text)
    tgc.run_pipeline(module, "lower-for-planning")
    func = module.funcs[0]
    route.move_signature_to_device(func)
    prepare(func)
    possible: dict[tuple, list[float]] = {}  # every copy a plan could make, by group
    for i in instances(func, route._context(1e-5)):
        if i.kernel.op == "kernel.copy":
            key = (i.kernel.name, dtypes_of(i.operand_types, i.result_types))
            possible.setdefault(key, []).append(instance_bytes(i.operand_types, i.result_types))
    assert max(len(v) for v in possible.values()) > route.COPY_SAMPLES  # some are thinned

    first = _compile(text, db)
    assert first.report.unmeasured == 0
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT k.name, m.dtypes, m.bytes FROM measurements m JOIN kernels k "
            "ON k.id = m.kernel_id WHERE k.name LIKE 'copy.%'"
        ).fetchall()
    measured: dict[tuple, list[float]] = {}
    for name, dtypes, size in rows:
        measured.setdefault((name, dtypes), []).append(size)
    for key, sizes in possible.items():
        got = sorted(measured.get(key, []))
        assert len(got) <= route.COPY_SAMPLES, key
        if key in measured:  # the extremes among what was measured
            assert got[0] == min(sizes) and got[-1] == max(sizes), key
    second = _compile(text, db)
    assert second.report.measured == 0 and second.report.unmeasured == 0


def test_a_replayed_plan_costs_a_kernel_by_the_devices_time_alone(stand_in, tmp_path):
    """No host queues a kernel of a replayed CUDA graph: a library call whose host work
    outlasts its kernel (PyTorch's dispatch, a ctypes call) costs its device time in a plan
    replayed as a graph, and the longer of the two in a plan launched call by call."""
    db = tmp_path / "m.sqlite"
    text = (EXAMPLES / "mlp.tg").read_text()
    _compile(text, db)  # every instance measured (the stand-in's times have no device part)
    with sqlite3.connect(db) as con:  # cuBLAS host-bound: slow per call, fast on the device
        con.execute(
            "UPDATE measurements SET median = 1.0, device_median = 1e-9 WHERE kernel_id IN "
            "(SELECT id FROM kernels WHERE name LIKE 'cuda.cublas%')"
        )

    def callees(graphs: bool) -> set[str]:
        compiled = _compile(text, db, graphs=graphs, whole_plan_check=False)
        assert compiled.report.measured == 0
        return {op.attr("callee") for op in compiled.func.body.ops if op.name == "kernel.call"}

    replayed, launched = callees(True), callees(False)
    assert any(c.startswith("cuda.cublas") for c in replayed)
    assert not any(c.startswith("cuda.cublas") for c in launched)


def test_the_summary_counts_failed_and_noisy_measurements():
    """The line tgc-run --backend cuda prints says what the first use measured, what failed
    its check and what was flagged noisy."""
    report = route.RouteReport(measure_s=1.25, measured=12, failed=2, noisy=3)
    text = report.summary()
    assert "measured 12 kernel instance(s) in 1.2 s" in text
    assert "2 failed their check (not used)" in text
    assert "3 noisy (kept and flagged: tgc-db prune --noisy)" in text
    quiet = route.RouteReport(measure_s=1.0, measured=5).summary()
    assert "failed" not in quiet and "noisy" not in quiet

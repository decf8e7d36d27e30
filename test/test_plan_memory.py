"""Whole-plan choices remembered (issue 22, item 3; planner/plan_memory.py), on the stand-in
device of test_planner_cuda.py: the GPU route records every candidate plan's whole time, and
which one ran, under the function's canonical hash and the device; a second compile of the same
function with the same candidate plans takes the choice without timing any plan, and a plan that
changed (the database learnt something) is timed again. tgc-db lists, exports, imports
(checked), and prunes these records. Timings are made steady (their spread set to 0) where a
test needs them remembered: the stand-in's timings on a busy CPU are often noisy, and a noisy
comparison is never remembered (tested too)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_planner_cuda import stand_in as _stand_in_device  # noqa: F401  (a fixture)

import tgc
from tgc.planner import db as dbmod
from tgc.planner import load_backends, profile, route
from tgc.planner.blocks import function_hash
from tgc.planner.db import Database
from tgc.planner.db_plans import plan_time_problem, plan_times, remember
from tgc.planner.db_schema import MIGRATIONS, PlanTime
from tgc.planner.plan_memory import PlanMemory, identify
from tgc.tools import db as dbtool

load_backends(["numpy"])

# A linear layer and an exp, small enough that the stand-in plans and times it in a second.
TEXT = """func.func @f(%x: tensor<8x32xf32>, %w: tensor<32x32xf32>, %b: tensor<32xf32>) -> tensor<8x32xf32> {
  %h = atomic.matmul %x, %w : (tensor<8x32xf32>, tensor<32x32xf32>) -> tensor<8x32xf32>
  %y = atomic.add %h, %b : (tensor<8x32xf32>, tensor<32xf32>) -> tensor<8x32xf32>
  %z = atomic.exp %y : (tensor<8x32xf32>) -> tensor<8x32xf32>
  func.return %z : tensor<8x32xf32>
}
"""  # noqa: E501


@pytest.fixture
def stand_in(_stand_in_device, monkeypatch):  # noqa: F811
    """The stand-in device as test_route.py has it (its own fingerprint, no torch)."""
    monkeypatch.setitem(dbmod.FINGERPRINTS, "cuda", lambda: {"gpu": "stand-in"})
    monkeypatch.setattr(route, "FAMILIES", ("cuda",))
    dbmod.device_info.cache_clear()
    yield _stand_in_device
    dbmod.device_info.cache_clear()


class Timings:
    """profile.time_call made steady (or noisy) and profile.steady_time counted: the whole-plan
    check and the profiler both time through them."""

    def __init__(self, monkeypatch, spread: float = 0.0) -> None:
        self.calls = 0
        real_time, real_steady = profile.time_call, profile.steady_time

        def timed(call, sync, min_time, queued=None):
            return replace(real_time(call, sync, min_time, queued), spread=spread)

        def counted(*args, **kwargs):
            self.calls += 1
            return real_steady(*args, **kwargs)

        monkeypatch.setattr(profile, "time_call", timed)
        monkeypatch.setattr(profile, "steady_time", counted)


def compile_text(db: Path, text: str = TEXT, **options):
    opts = route.RouteOptions(
        db=str(db), measure_budget=60.0, progress=False, min_time=0.002, **options
    )
    return route.compile_module(tgc.parse(text), None, opts)


def as_planned(text: str):
    """The function as the route hashes it: lowered, on the device, in canonical form."""
    from tgc.pass_manager import PassManager
    from tgc.planner.select import prepare

    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    route.move_signature_to_device(func)
    prepare(func)
    return func


def stored(db: Path) -> list[PlanTime]:
    with Database.open(str(db), readonly=True) as d:
        return plan_times(d)


# -- the route -------------------------------------------------------------------------------------


def test_a_second_compile_takes_the_remembered_choice_and_times_no_plan(
    stand_in, tmp_path, monkeypatch
):
    db = tmp_path / "m.sqlite"
    timings = Timings(monkeypatch)
    first = compile_text(db)
    assert not first.report.remembered and len(first.report.candidates) >= 2
    rows = stored(db)  # every candidate with a plan, its time as the report gave it
    assert {r.candidate: r.median * 1e3 for r in rows if r.ok} == pytest.approx(
        first.report.candidates
    )
    assert [r.candidate for r in rows if r.chosen] == [first.report.chosen]
    assert {r.function_hash for r in rows} == {function_hash(as_planned(TEXT))}
    timings.calls = 0
    second = compile_text(db)
    assert timings.calls == 0  # neither a kernel nor a plan was timed
    assert second.report.remembered and second.report.chosen == first.report.chosen
    assert second.report.candidates == pytest.approx(first.report.candidates)
    assert "whole plans (remembered, not timed again):" in second.report.summary()
    x = [np.ones((8, 32), np.float32), np.eye(32, dtype=np.float32), np.zeros(32, np.float32)]
    np.testing.assert_allclose(second.run_host(x)[0], np.exp(x[0]), rtol=1e-5)


def test_the_remembered_choice_is_the_one_run(stand_in, tmp_path, monkeypatch):
    """The database, not a fresh timing, decides: a row that says another candidate won makes
    that candidate run."""
    db = tmp_path / "m.sqlite"
    Timings(monkeypatch)
    first = compile_text(db)
    other = next(r for r in stored(db) if r.ok and not r.chosen)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("UPDATE plan_times SET chosen = (candidate = ?)", (other.candidate,))
    con.close()
    second = compile_text(db)
    assert second.report.remembered and second.report.chosen == other.candidate
    assert first.report.chosen != other.candidate


def test_a_plan_changed_by_the_database_is_timed_again(stand_in, tmp_path, monkeypatch):
    db = tmp_path / "m.sqlite"
    timings = Timings(monkeypatch)
    compile_text(db)
    before = {r.candidate: r.plan_hash for r in stored(db)}
    # the planned candidate's first kernel (the one that ran may be another candidate's)
    (planned,) = (r for r in stored(db) if r.candidate == "planned")
    callee = planned.kernels[0][0]
    # The database learns that the planned plan's first kernel is slow: the plan changes.
    con = sqlite3.connect(db, isolation_level=None)
    con.execute(
        "UPDATE measurements SET median = 10.0 WHERE kernel_id IN "
        "(SELECT id FROM kernels WHERE name = ?)",
        (callee,),
    )
    con.close()
    timings.calls = 0
    second = compile_text(db)
    assert not second.report.remembered
    assert timings.calls >= 1  # the plans were timed again
    after = {r.candidate: r.plan_hash for r in stored(db)}
    assert after["planned"] != before["planned"]  # and the new plan recorded in its place
    # What runs is the chosen candidate's plan (on a busy machine another candidate can win).
    assert identify(second.planned.func).plan_hash == after[second.report.chosen]


def test_a_noisy_comparison_is_not_remembered(stand_in, tmp_path, monkeypatch):
    db = tmp_path / "m.sqlite"
    timings = Timings(monkeypatch, spread=10 * profile.NOISY_SPREAD)
    compile_text(db)
    assert all(r.noisy for r in stored(db) if r.ok)
    timings.calls = 0
    second = compile_text(db)
    assert not second.report.remembered and timings.calls >= 1


def test_no_measure_takes_a_remembered_choice_and_writes_nothing(stand_in, tmp_path, monkeypatch):
    db = tmp_path / "m.sqlite"
    Timings(monkeypatch)
    first = compile_text(db)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("UPDATE plan_times SET created = 1")  # any write would change this
    con.close()
    second = compile_text(db, measure=False)
    assert second.report.remembered and second.report.chosen == first.report.chosen
    assert {r.created for r in stored(db)} == {1.0}
    empty = tmp_path / "empty.sqlite"
    third = compile_text(empty, measure=False)
    assert not third.report.remembered and not empty.exists()


def test_a_damaged_row_is_timed_again_and_replaced(stand_in, tmp_path, monkeypatch):
    db = tmp_path / "m.sqlite"
    timings = Timings(monkeypatch)
    compile_text(db)
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("UPDATE plan_times SET median = 'fast' WHERE chosen = 1")
    con.close()
    timings.calls = 0
    second = compile_text(db)
    assert not second.report.remembered and timings.calls >= 1
    assert all(plan_time_problem(r) is None for r in stored(db))


# -- the keys ----------------------------------------------------------------------------------------


def _func(text: str):
    return tgc.parse(text).funcs[0]


def test_the_function_hash_is_its_computation():
    base = _func(TEXT)
    renamed = _func(TEXT.replace("%h", "%hidden").replace("@f", "@g"))
    assert function_hash(renamed) == function_hash(base)
    swapped = _func(TEXT.replace("atomic.exp %y", "atomic.exp %h").replace("%z = ", "%z = "))
    assert function_hash(swapped) != function_hash(base)
    other_op = _func(TEXT.replace("atomic.exp", "atomic.neg"))
    assert function_hash(other_op) != function_hash(base)
    two = "func.func @f(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {{\n  %y = {} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n  func.return %y : tensor<4xf32>\n}}\n"  # noqa: E501
    a_minus_b = function_hash(_func(two.format("atomic.sub %a, %b")))
    assert a_minus_b != function_hash(_func(two.format("atomic.sub %b, %a")))
    # a commutative op's operand order does not matter
    assert function_hash(_func(two.format("atomic.add %a, %b"))) == function_hash(
        _func(two.format("atomic.add %b, %a"))
    )


def test_a_plans_identity_leaves_out_its_cost_annotations(stand_in, tmp_path, monkeypatch):
    Timings(monkeypatch)
    compiled = compile_text(tmp_path / "m.sqlite")
    func = compiled.planned.func
    same = identify(func)
    for op in func.body.ops:
        if "plan.seconds" in op.attributes:
            op.attributes["plan.seconds"] = type(op.attributes["plan.seconds"])(123.0)
    assert identify(func) == same
    assert same.kernels and all(len(k) == 3 for k in same.kernels)


# -- tgc-db ------------------------------------------------------------------------------------------


def numpy_plans(path: Path, source: str | None = None, **kw) -> list[PlanTime]:
    """Plan times of one function on this machine's numpy device, written to `path`: planned
    chosen, library slower, default did not run; their kernel numpy.atomic.exp (with `source`
    as its source hash: another one is a version gone)."""
    from tgc.planner.kernel import KERNELS

    exp = KERNELS["numpy.atomic.exp"]
    device = dbmod.device_of(exp)
    kernels = [["numpy.atomic.exp", "numpy", source or dbmod.kernel_info(exp).source_hash]]
    rows = [
        PlanTime("fh" * 16, device, "planned", "p1", kernels, "ok", 2e-4, 0.01, 20, chosen=True),
        PlanTime("fh" * 16, device, "library", "p2", kernels, "ok", 3e-4, 0.01, 20, **kw),
        PlanTime("fh" * 16, device, "default", "p3", kernels, "failed", message="out of memory"),
    ]
    with Database.open(str(path)) as db:
        remember(db, "fh" * 16, device, rows)
    return rows


def test_list_shows_the_whole_plan_times(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    numpy_plans(path, noisy=True)
    assert dbtool.main(["--db", str(path), "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "1 device(s), 0 record(s), 3 whole-plan time(s)"
    assert (
        f"  plans of function {'fh' * 8}  device 1: default did not run, library 0.3000 ms "
        "(noisy), planned 0.2000 ms (chosen)"
    ) in out


def test_export_and_import_carry_plan_times(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    rows = numpy_plans(path)
    out = tmp_path / "e.json"
    assert dbtool.main(["--db", str(path), "export", "-o", str(out)]) == 0
    assert "exported 0 record(s) and 3 whole-plan time(s)" in capsys.readouterr().err
    data = json.loads(out.read_text())
    assert len(data["plans"]) == 3 and len(data["devices"]) == 1
    other = tmp_path / "n.sqlite"
    assert dbtool.main(["--db", str(other), "import", str(out)]) == 0
    assert "3 whole-plan time(s), kept 0" in capsys.readouterr().out
    got = stored(other)
    assert [(r.candidate, r.median, r.chosen, r.origin) for r in got] == [
        (r.candidate, r.median, r.chosen, "import") for r in sorted(rows, key=lambda r: r.candidate)
    ]
    assert dbtool.main(["--db", str(other), "import", str(out)]) == 0  # again: nothing new
    assert "0 whole-plan time(s), kept 3" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.update(median=0), "plan time 0 (planned): median is 0, not a positive"),
        (lambda p: p.update(chosen="yes"), "plan time 0 (planned): chosen is 'yes', not true"),
        (lambda p: p.update(kernels=[["x"]]), "kernels holds ['x'], not [name, backend, source"),
        (lambda p: p.update(device="nope"), "plan time 0: device 'nope' is not among the file"),
        (lambda p: p.pop("status"), "plan time 0: no 'status'"),
        (lambda p: p.update(colour="red"), "plan time 0: unknown field 'colour'"),
        (
            lambda p: p.update(status="failed"),
            "plan time 0 (planned): a plan that did not run is marked chosen",
        ),
    ],
)
def test_import_checks_plan_times_and_imports_nothing_on_a_bad_one(
    tmp_path, capsys, change, message
):
    path = tmp_path / "m.sqlite"
    numpy_plans(path)
    out = tmp_path / "e.json"
    assert dbtool.main(["--db", str(path), "export", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    data["plans"].sort(key=lambda p: p["candidate"] != "planned")
    change(data["plans"][0])
    out.write_text(json.dumps(data))
    other = tmp_path / "n.sqlite"
    capsys.readouterr()
    assert dbtool.main(["--db", str(other), "import", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "nothing was imported" in err, err
    assert not other.exists() or stored(other) == []


def test_a_damaged_plan_time_is_refused_by_tgc_db_in_one_line(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    numpy_plans(path)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("UPDATE plan_times SET kernels = '[[' WHERE candidate = 'planned'")
    con.close()
    assert dbtool.main(["--db", str(path), "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has a damaged record (plan time" in err, err
    assert "kernels is not valid JSON" in err


def test_prune_deletes_plans_of_a_kernel_version_gone_and_by_its_options(tmp_path, capsys):
    path = tmp_path / "m.sqlite"
    numpy_plans(path, source="0" * 16)  # a numpy.atomic.exp that no longer exists
    assert dbtool.main(["--db", str(path), "prune", "--dry-run"]) == 0
    assert "would prune 0 record(s) and 3 whole-plan time(s)" in capsys.readouterr().out
    assert dbtool.main(["--db", str(path), "prune"]) == 0
    assert "pruned 0 record(s) and 3 whole-plan time(s)" in capsys.readouterr().out
    assert stored(path) == []
    numpy_plans(path, noisy=True)  # current kernels: only the options prune them
    assert dbtool.main(["--db", str(path), "prune"]) == 0
    assert "nothing to prune" in capsys.readouterr().out
    assert dbtool.main(["--db", str(path), "prune", "--noisy", "--failures"]) == 0
    assert "pruned 0 record(s) and 2 whole-plan time(s)" in capsys.readouterr().out
    assert [r.candidate for r in stored(path)] == ["planned"]
    assert dbtool.main(["--db", str(path), "prune", "--plans"]) == 0
    assert "pruned 0 record(s) and 1 whole-plan time(s)" in capsys.readouterr().out
    assert stored(path) == []
    with Database.open(str(path), readonly=True) as db:
        assert db.devices() == []  # the device held plan times alone: it went with them


def test_recall_needs_the_same_candidates(tmp_path):
    path = tmp_path / "m.sqlite"
    rows = numpy_plans(path)
    memory = PlanMemory(str(path), "fh" * 16, rows[0].device, write=False)
    from tgc.planner.plan_memory import PlanIdentity

    same = {r.candidate: PlanIdentity(r.plan_hash, ()) for r in rows}
    recalled = memory.recall(same)
    assert recalled is not None and recalled.chosen == "planned"
    assert recalled.times == {"planned": 2e-4, "library": 3e-4}
    assert recalled.failures == {"default": "out of memory"}
    assert memory.recall({**same, "library": PlanIdentity("changed", ())}) is None
    assert memory.recall({k: v for k, v in same.items() if k != "library"}) is None
    other = PlanMemory(str(path), "another function", rows[0].device, write=False)
    assert other.recall(same) is None


# -- schema 3 files ----------------------------------------------------------------------------------


def test_a_schema_3_file_is_read_with_no_plan_times_and_upgraded_by_a_writer(tmp_path, capsys):
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:3]:
        step(con)
    con.execute("PRAGMA user_version = 3")
    con.execute(f"PRAGMA application_id = {dbmod.APPLICATION_ID}")
    con.close()
    before = path.read_bytes()
    assert dbtool.main(["--db", str(path), "list"]) == 0
    assert capsys.readouterr().out.startswith("0 device(s), 0 record(s)\n")
    assert stored(path) == []
    assert path.read_bytes() == before
    numpy_plans(path)  # a writer upgrades the file to schema 4 and records
    assert len(stored(path)) == 3

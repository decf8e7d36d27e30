"""Noisy measurements (issue 22, item 2: "measurements whose spread is large are repeated or
flagged, never silently kept"). A timing whose spread is above `NOISY_SPREAD` is taken again, up
to `MAX_ATTEMPTS` times; a steady repeat is kept as a steady record, and a timing that stays
noisy is recorded with a flag the database keeps (schema 3), `tgc-db list` and `show` say,
export and import carry, and `tgc-db prune --noisy` deletes, so that the next profile measures
it again. Files of schema 2 are read as they are (no record is noisy) and upgraded by a writer.
A fake timer gives the noisy and steady timings."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from test_planner_cuda import stand_in  # noqa: F401  (a fixture: the stand-in device)

from tgc.planner import load_backends
from tgc.planner import db as dbmod
from tgc.planner import profile
from tgc.planner.db import MIGRATIONS, SCHEMA_VERSION, Database, DatabaseUnavailable
from tgc.planner.estimate import DatabaseCostSource
from tgc.planner.kernel import KERNELS
from tgc.planner.profile import MAX_ATTEMPTS, NOISY_SPREAD, Instance, Profiler, Timing, measure
from tgc.tools import db as dbtool
from tgc.types import TensorType

load_backends(["numpy"])

T = TensorType.get((16, 32), "f32")
EXP = Instance(KERNELS["numpy.atomic.exp"], (T,), (T,))
NOISY = Timing(median=2e-5, min=1e-5, spread=4 * NOISY_SPREAD, runs=40)
NOISIER = Timing(median=3e-5, min=1e-5, spread=8 * NOISY_SPREAD, runs=40)
STEADY = Timing(median=1e-5, min=0.9e-5, spread=NOISY_SPREAD / 10, runs=50)


class FakeTimer:
    """`time_call`'s stand-in: the timings given, in turn (the last one again when they run
    out); counts its calls."""

    def __init__(self, *timings: Timing) -> None:
        self.timings, self.calls = list(timings), 0

    def __call__(self, call, sync, min_time, queued=None) -> Timing:
        call()
        self.calls += 1
        return self.timings[min(self.calls, len(self.timings)) - 1]


@pytest.fixture
def timer(monkeypatch):
    def install(*timings: Timing) -> FakeTimer:
        fake = FakeTimer(*timings)
        monkeypatch.setattr(profile, "time_call", fake)
        return fake

    return install


# -- the profiler ----------------------------------------------------------------------------------


def test_a_noisy_timing_is_taken_again_and_the_steady_one_kept(timer):
    fake = timer(NOISY, STEADY)
    m = measure(EXP, min_time=0.001)
    assert fake.calls == 2
    assert m.ok and not m.noisy
    assert (m.median, m.spread, m.runs) == (STEADY.median, STEADY.spread, STEADY.runs)


def test_a_timing_that_stays_noisy_is_flagged_with_the_steadiest_attempt(timer):
    fake = timer(NOISIER, NOISY, NOISIER)
    m = measure(EXP, min_time=0.001)
    assert fake.calls == MAX_ATTEMPTS  # bounded: never more
    assert m.ok and m.noisy
    assert (m.median, m.spread) == (NOISY.median, NOISY.spread)


def test_a_steady_timing_is_taken_once(timer):
    fake = timer(STEADY)
    m = measure(EXP, min_time=0.001)
    assert fake.calls == 1 and not m.noisy


def test_a_copy_is_repeated_and_flagged_too(timer, stand_in, monkeypatch):  # noqa: F811
    """A copy to the (stand-in) device is timed like a kernel: repeated, then flagged."""
    monkeypatch.setitem(dbmod.FINGERPRINTS, "cuda", lambda: {"gpu": "stand-in"})
    dbmod.device_info.cache_clear()
    fake = timer(NOISY)
    copy = Instance(KERNELS["copy.host_to_cuda"], (T,), (T.with_encoding("cuda"),))
    try:
        m = measure(copy, min_time=0.001)
    finally:
        dbmod.device_info.cache_clear()  # the stand-in's fingerprint is not the machine's
    assert fake.calls == MAX_ATTEMPTS and m.ok and m.noisy


def test_the_profiler_records_the_flag_and_says_how_many(timer, tmp_path):
    timer(NOISY)
    with Database.open(str(tmp_path / "m.sqlite")) as db:
        report = Profiler(db, min_time=0.001, progress=False).run([EXP])
        (m,) = db.rows()
    assert m.noisy and report.noisy == 1 and report.measured == 1
    assert "1 noisy (kept and flagged; `tgc-db prune --noisy`" in report.summary()


# -- tgc-db ----------------------------------------------------------------------------------------


@pytest.fixture
def noisy_db(timer, tmp_path) -> Path:
    """A database with exp measured noisy and matmul measured steady."""
    path = tmp_path / "m.sqlite"
    a, b = TensorType.get((8, 16), "f32"), TensorType.get((16, 8), "f32")
    matmul = Instance(KERNELS["numpy.atomic.matmul"], (a, b), (TensorType.get((8, 8), "f32"),))
    with Database.open(str(path)) as db:
        timer(NOISY)
        Profiler(db, min_time=0.001, progress=False).run([EXP])
        timer(STEADY)
        Profiler(db, min_time=0.001, progress=False).run([matmul])
    return path


def test_list_and_show_say_which_records_are_noisy(noisy_db, capsys):
    assert dbtool.main(["--db", str(noisy_db), "list"]) == 0
    out = capsys.readouterr().out
    assert "numpy.atomic.exp" in out and "1 measured (1 noisy), 0 failed" in out
    matmul = next(line for line in out.splitlines() if "numpy.atomic.matmul" in line)
    assert matmul.endswith("1 measured, 0 failed")
    assert dbtool.main(["--db", str(noisy_db), "show", "numpy.atomic.exp"]) == 0
    assert "spread 200% (noisy)," in capsys.readouterr().out


def test_export_and_import_carry_the_flag(noisy_db, tmp_path, capsys):
    out = tmp_path / "e.json"
    assert dbtool.main(["--db", str(noisy_db), "export", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["version"] == dbtool.EXPORT_VERSION == 3
    assert sorted(r["noisy"] for r in data["measurements"]) == [False, True]
    other = tmp_path / "n.sqlite"
    assert dbtool.main(["--db", str(other), "import", str(out)]) == 0
    with Database.open(str(other), readonly=True) as db:
        flags = {m.kernel.name: m.noisy for m in db.rows()}
    assert flags == {"numpy.atomic.exp": True, "numpy.atomic.matmul": False}


def test_an_export_of_version_1_imports_with_no_record_noisy(noisy_db, tmp_path, capsys):
    out = tmp_path / "e.json"
    assert dbtool.main(["--db", str(noisy_db), "export", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    data["version"] = 1
    for r in data["measurements"]:
        del r["noisy"]
    out.write_text(json.dumps(data))
    other = tmp_path / "n.sqlite"
    assert dbtool.main(["--db", str(other), "import", str(out)]) == 0
    with Database.open(str(other), readonly=True) as db:
        assert [m.noisy for m in db.rows()] == [False, False]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["measurements"][0].update(noisy="yes"), "noisy is 'yes', not true or false"),
        (lambda d: d["measurements"][0].update(noisy=1), "noisy is 1, not true or false"),
        (lambda d: d.update(version=True), "is export version True; this tgc reads 1, 2 and 3"),
        (lambda d: d.update(version=4), "is export version 4; this tgc reads 1, 2 and 3"),
        (
            lambda d: d["measurements"][0].update(device_median=-1.0),
            "device_median is -1.0, not a positive finite number of seconds",
        ),
    ],
)
def test_import_refuses_a_bad_flag_or_export_version(noisy_db, tmp_path, capsys, change, message):
    out = tmp_path / "e.json"
    assert dbtool.main(["--db", str(noisy_db), "export", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    change(data)
    out.write_text(json.dumps(data))
    before = noisy_db.read_bytes()
    capsys.readouterr()
    assert dbtool.main(["--db", str(noisy_db), "import", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert noisy_db.read_bytes() == before


def test_a_damaged_flag_is_refused_by_tgc_db_in_one_line(noisy_db, capsys):
    con = sqlite3.connect(noisy_db, isolation_level=None)
    con.execute("UPDATE measurements SET noisy = 'loud'")
    con.close()
    assert dbtool.main(["--db", str(noisy_db), "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "has a damaged record" in err and "noisy is 'loud', not true or false" in err


def test_prune_noisy_deletes_them_and_the_next_profile_measures_them_again(noisy_db, timer, capsys):
    assert dbtool.main(["--db", str(noisy_db), "prune", "--noisy", "--dry-run"]) == 0
    assert "would prune 1 record(s)" in capsys.readouterr().out
    assert dbtool.main(["--db", str(noisy_db), "prune", "--noisy"]) == 0
    assert "pruned 1 record(s)" in capsys.readouterr().out
    with Database.open(str(noisy_db)) as db:
        assert [m.kernel.name for m in db.rows()] == ["numpy.atomic.matmul"]
        timer(STEADY)
        report = Profiler(db, min_time=0.001, progress=False).run([EXP])
        assert report.measured == 1
        assert {m.kernel.name: m.noisy for m in db.rows()}["numpy.atomic.exp"] is False


# -- schema 2 files --------------------------------------------------------------------------------


def schema_2_file(path: Path) -> Path:
    """A tgc database of schema 2 (before the flag) with one exp record."""
    con = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:2]:
        step(con)
    con.execute("PRAGMA user_version = 2")
    con.execute(f"PRAGMA application_id = {dbmod.APPLICATION_ID}")
    device = dbmod.device_of(EXP.kernel)
    info = dbmod.kernel_info(EXP.kernel)
    con.execute(
        "INSERT INTO devices VALUES (1, ?, ?, ?)",
        (device.fingerprint, device.backend, json.dumps(device.description)),
    )
    con.execute(
        "INSERT INTO kernels VALUES (1, ?, ?, ?, '{}')", (info.name, info.backend, info.source_hash)
    )
    con.execute(
        "INSERT INTO measurements (kernel_id, device_id, signature, dtypes, params, attrs_key, "
        "attrs, bytes, flops, status, median, min, spread, runs, max_error, created) VALUES "
        "(1, 1, ?, 'f32->f32', '{}', '', '', 4096, 512, 'ok', 3e-6, 2e-6, 0.1, 10, 0, 0)",
        (EXP.signature,),
    )
    con.close()
    return path


def test_a_schema_2_file_is_read_as_it_is_and_upgraded_by_a_writer(tmp_path, capsys):
    path = schema_2_file(tmp_path / "old.sqlite")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with Database.open(str(path), readonly=True) as db:
        assert db.version == 2
        (m,) = db.rows()
        assert m.noisy is False and m.median == 3e-6
    assert dbtool.main(["--db", str(path), "list"]) == 0
    assert "1 measured, 0 failed" in capsys.readouterr().out
    assert dbtool.main(["--db", str(path), "prune", "--noisy", "--dry-run"]) == 0
    assert "would prune 0 record(s)" in capsys.readouterr().out  # no flag column: none noisy
    got = DatabaseCostSource(str(path)).cost(EXP.kernel, [T], [T], {})
    assert (got.seconds, got.source) == (3e-6, "measured")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # reading wrote nothing
    with Database.open(str(path)) as db:
        assert db.version == SCHEMA_VERSION
        (m,) = db.rows()
        assert m.noisy is False and m.median == 3e-6


def test_a_schema_1_file_is_still_upgraded_before_it_is_read(tmp_path):
    path = tmp_path / "v1.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    MIGRATIONS[0](con)
    con.execute("PRAGMA user_version = 1")
    con.close()
    with pytest.raises(DatabaseUnavailable, match="has schema 1; open it for writing once"):
        Database.open(str(path), readonly=True)

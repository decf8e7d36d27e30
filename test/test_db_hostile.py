"""The measurement database under hostile and careless input (issue 23, items 1-7), one test (or
a few) per case, each of which failed before: a foreign file migrated, a corrupt file written,
a record filed under another kernel after a prune, poison imported, damaged values crashing the
planner and tgc-db, reading leaving WAL files, a lock wait that Ctrl-C could not end and a FIFO
that blocked. docs/measurements.md, "What the database promises"."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tgc.planner import load_backends
from tgc.planner import db as dbmod
from tgc.planner.cost import RooflineCostSource
from tgc.planner.db import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    Database,
    DatabaseUnavailable,
    Measurement,
    expected_tables,
    kernel_info,
)
from tgc.planner.estimate import DatabaseCostSource
from tgc.planner.kernel import KERNELS
from tgc.tools import db as dbtool
from tgc.tools import plan as plantool
from tgc.tools import profile as profiletool
from tgc.types import TensorType

load_backends(["numpy"])

ROOT = Path(__file__).resolve().parent.parent
EXP_TG = str(ROOT / "test" / "lit" / "tgc-db" / "Inputs" / "exp.tg")  # exp of 16x32 f32
PY = sys.executable


def rec(name: str = "numpy.atomic.exp", rows: int = 16, seconds: float = 1e-4, **kw):
    t = TensorType.get((rows, 32), "f32")
    k = KERNELS[name]
    args = {
        "kernel": kernel_info(k),
        "device": dbmod.device_of(k),
        "signature": dbmod.signature_of([t], [t]),
        "dtypes": "f32->f32",
        "params": {},
        "attrs_key": "",
        "attrs": name,  # which kernel the record was taken for (test_prune_racing...)
        "bytes": 2.0 * t.nbytes,
        "flops": float(t.num_elements),
        "status": "ok",
        "median": seconds,
        "min": seconds,
        "spread": 0.01,
        "runs": 10,
        "max_error": 0.0,
    }
    args.update(kw)
    return Measurement(**args)


def curve_db(path: Path) -> Path:
    """exp measured at 8, 32, 64 and 128 rows (not at 16: tgc-plan estimates it)."""
    with Database.open(str(path)) as db:
        db.record_all([rec(rows=r, seconds=1e-6 * r) for r in (8, 32, 64, 128)])
    return path


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err, err
    return lines[0]


def tgc_main(tool, argv, capsys) -> tuple[int, str, str]:
    code = tool.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def side_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(("-wal", "-shm", "-journal")))


# -- 1: only its own files -----------------------------------------------------------------------


def foreign_with_a_measurements_table(path: Path) -> bytes:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE measurements (id INTEGER PRIMARY KEY, value REAL)")
    con.execute("INSERT INTO measurements VALUES (1, 2.5)")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    return path.read_bytes()


def foreign_with_our_schema_and_its_own_id(path: Path) -> bytes:
    con = sqlite3.connect(path, isolation_level=None)
    for step in dbmod.MIGRATIONS:
        step(con)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    con.execute("PRAGMA application_id = 1234")
    con.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    "make", [foreign_with_a_measurements_table, foreign_with_our_schema_and_its_own_id]
)
def test_another_programs_sqlite_file_is_refused_before_a_byte_is_written(tmp_path, make, capsys):
    path = tmp_path / "theirs.sqlite"
    content = make(path)
    for readonly in (True, False):
        with pytest.raises(DatabaseUnavailable, match="not a tgc measurement database"):
            Database.open(str(path), readonly=readonly)
    code, _, err = tgc_main(
        profiletool,
        [EXP_TG, "--planner-backends", "numpy", "--db", str(path), "--min-time", "0.001"],
        capsys,
    )
    assert code == 1 and "not a tgc measurement database" in one_line_error(err)
    code, _, err = tgc_main(dbtool, ["--db", str(path), "list"], capsys)
    assert code == 1 and "not a tgc measurement database" in one_line_error(err)
    assert path.read_bytes() == content  # no migration, no WAL switch, no user_version
    assert side_files(tmp_path) == []


def test_a_tgc_database_of_an_earlier_version_is_opened_and_marked(tmp_path):
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    for step in dbmod.MIGRATIONS:
        step(con)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    con.close()
    with Database.open(str(path), readonly=True) as db:
        assert db.rows() == []
    with Database.open(str(path)) as db:
        db.record(rec())
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    con.close()


def test_a_dropped_table_is_damage_refused_by_tgc_db_and_said_once_by_planning(tmp_path, capsys):
    path = curve_db(tmp_path / "m.sqlite")
    con = sqlite3.connect(path)
    con.execute("DROP TABLE kernels")
    con.commit()
    con.close()
    content = path.read_bytes()
    for argv in (["list"], ["export"], ["import", str(tmp_path / "none.json")]):
        code, _, err = tgc_main(dbtool, ["--db", str(path), *argv], capsys)
        assert code == 1, argv
        line = one_line_error(err)
        assert "damaged tgc measurement database (table 'kernels' is missing)" in line or (
            "could not open" in line
        )
    code, out, err = tgc_main(
        plantool, [EXP_TG, "--planner-backends", "numpy", "--db", str(path)], capsys
    )
    assert code == 0 and "table 'kernels' is missing" in one_line_error(err)
    assert path.read_bytes() == content


# -- 2: no write into a corrupt file -----------------------------------------------------------------


def corrupt_db(tmp_path: Path) -> Path:
    """A tgc database of several pages with one b-tree page zeroed, the header intact."""
    path = tmp_path / "m.sqlite"
    with Database.open(str(path)) as db:
        db.record_all([rec(rows=r, signature=f"s{r}-" + "x" * 200) for r in range(1, 120)])
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) >= 4 * page
    data[2 * page : 3 * page] = bytes(page)  # page 3
    path.write_bytes(bytes(data))
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert con.execute("PRAGMA quick_check").fetchone()[0] != "ok"
    con.close()
    return path


def test_a_corrupt_database_is_refused_for_writing_and_never_modified(tmp_path, capsys):
    path = corrupt_db(tmp_path)
    content = path.read_bytes()
    with pytest.raises(DatabaseUnavailable, match="is a corrupt SQLite database") as info:
        Database.open(str(path))
    assert "\n" not in info.value.render()
    code, _, err = tgc_main(
        profiletool,
        [EXP_TG, "--planner-backends", "numpy", "--db", str(path), "--min-time", "0.001"],
        capsys,
    )
    assert code == 1 and "is a corrupt SQLite database" in one_line_error(err)
    export = tmp_path / "e.json"
    good = tmp_path / "good.sqlite"
    with Database.open(str(good)) as db:
        db.record(rec())
    assert dbtool.main(["--db", str(good), "export", "-o", str(export)]) == 0
    capsys.readouterr()
    code, _, err = tgc_main(dbtool, ["--db", str(path), "import", str(export)], capsys)
    assert code == 1 and "is a corrupt SQLite database" in one_line_error(err)
    code, _, err = tgc_main(dbtool, ["--db", str(path), "list"], capsys)
    assert code == 1 and "is a corrupt SQLite database" in one_line_error(err)
    assert path.read_bytes() == content
    assert side_files(tmp_path) == []


# -- 3: a prune beside a profile files nothing under the wrong kernel --------------------------------


def filed_wrongly(path: Path) -> list[tuple]:
    """Records whose kernel row is not the kernel they were taken for (or is missing)."""
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT m.attrs, k.name FROM measurements m LEFT JOIN kernels k ON k.id = m.kernel_id"
    ).fetchall()
    missing_device = con.execute(
        "SELECT COUNT(*) FROM measurements m LEFT JOIN devices d ON d.id = m.device_id "
        "WHERE d.id IS NULL"
    ).fetchone()[0]
    con.close()
    return [r for r in rows if r[0] != r[1]] + [("missing device",)] * missing_device


def test_prune_between_two_records_of_a_profiler_files_nothing_under_another_kernel(tmp_path):
    path = tmp_path / "m.sqlite"
    profiler = Database.open(str(path))
    pruner = Database.open(str(path))
    profiler.record(rec("numpy.atomic.exp"))
    assert pruner.delete("1") == 1  # prune everything: the kernel and device rows go too
    profiler.record(rec("numpy.atomic.neg"))  # takes the freed row id
    profiler.record(rec("numpy.atomic.exp", rows=32))
    profiler.close()
    pruner.close()
    assert filed_wrongly(path) == []
    with Database.open(str(path), readonly=True) as db:
        assert sorted(m.kernel.name for m in db.rows()) == ["numpy.atomic.exp", "numpy.atomic.neg"]


def test_tgc_db_prune_reads_stale_ids_inside_its_transaction(tmp_path, capsys, monkeypatch):
    """prune judges kernels and deletes in one transaction (a profiler's new kernel row may
    take a stale kernel's id between the two)."""
    path = tmp_path / "m.sqlite"
    stale = rec("numpy.atomic.exp")
    stale.kernel = dbmod.KernelInfo(stale.kernel.name, "numpy", "0ld", {})
    with Database.open(str(path)) as db:
        db.record(stale)
    calls = []
    real = Database.delete

    def spy(self, where, args=()):
        calls.append(callable(where))
        return real(self, where, args)

    monkeypatch.setattr(Database, "delete", spy)
    code, out, _ = tgc_main(dbtool, ["--db", str(path), "prune"], capsys)
    assert code == 0 and out.strip() == "pruned 1 record(s)"
    assert calls == [True]


# -- 4: imports are validated, record by record ------------------------------------------------------


def export_of(tmp_path: Path, capsys) -> dict:
    src = tmp_path / "src.sqlite"
    with Database.open(str(src)) as db:
        db.record_all(
            [
                rec(rows=8),
                rec(
                    rows=64,
                    status="failed",
                    median=None,
                    min=None,
                    max_error=float("inf"),
                    message="wrong",
                ),
            ]
        )
    out = tmp_path / "e.json"
    assert dbtool.main(["--db", str(src), "export", "-o", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


POISON = [
    ("median", 0, "median is 0, not a positive finite number"),
    ("median", -1e-3, "median is -0.001"),
    ("median", "inf", "median is inf"),
    ("median", True, "median is True"),
    ("min", 0.0, "min is 0.0"),
    ("bytes", -8, "bytes is -8"),
    ("bytes", "inf", "bytes is inf"),
    ("flops", 1e400, "flops is inf"),
    ("spread", -1, "spread is -1"),
    ("runs", 2.5, "runs is 2.5"),
    ("status", "maybe", "status is 'maybe'"),
    ("params", [1], "params is [1], not a JSON object"),
    ("signature", 7, "signature is 7, not text"),
]


@pytest.mark.parametrize("field, value, message", POISON, ids=[f"{p[0]}={p[1]!r}" for p in POISON])
def test_import_refuses_poison_names_the_record_and_imports_nothing(
    tmp_path, capsys, field, value, message
):
    data = export_of(tmp_path, capsys)
    data["measurements"][0][field] = value  # record 0 stays good: nothing at all is imported
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data).replace("1e+400", "1e400"))
    if value == 1e400:
        bad.write_text(bad.read_text().replace("Infinity", "1e400"))
    target = tmp_path / "t.sqlite"
    with Database.open(str(target)) as db:
        db.record(rec(rows=1))
    content = target.read_bytes()
    code, _, err = tgc_main(dbtool, ["--db", str(target), "import", str(bad)], capsys)
    line = one_line_error(err)
    assert code == 1 and "record 0" in line and message in line, line
    assert "nothing was imported" in line
    assert target.read_bytes() == content


@pytest.mark.parametrize(
    "text, message",
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
        (
            '{"format": "tgc-measurements", "version": ' + "9" * 401 + "}",
            "an integer of 401 digits",
        ),
        ('{"format": "tgc-measurements", "version": NaN}', "NaN is not a JSON number"),
    ],
    ids=["deep", "long-integer", "nan"],
)
def test_import_of_crafted_json_is_one_line(tmp_path, capsys, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    code, _, err = tgc_main(
        dbtool, ["--db", str(tmp_path / "t.sqlite"), "import", str(bad)], capsys
    )
    assert code == 1 and message in one_line_error(err)
    assert not (tmp_path / "t.sqlite").exists()


def test_poisoned_records_never_reach_the_estimator(tmp_path, capsys):
    """What a poisoned import used to cause: every plan that needed an estimate failed with
    'LinAlgError: SVD did not converge'. Here the poison is written straight into the file."""
    path = curve_db(tmp_path / "m.sqlite")
    con = sqlite3.connect(path)
    con.execute("UPDATE measurements SET median = 0 WHERE signature LIKE '%8x32%'")
    con.execute("UPDATE measurements SET bytes = 9e999 WHERE signature LIKE '%32x32%'")
    con.commit()
    con.close()
    code, out, err = tgc_main(
        plantool, [EXP_TG, "--planner-backends", "numpy", "--db", str(path)], capsys
    )
    assert code == 0 and "has damaged records" in one_line_error(err)


# -- 5: damaged values: skipped once by planning, refused by tgc-db ---------------------------------

DAMAGE = {
    "null median": "UPDATE measurements SET median = NULL",
    "text median": "UPDATE measurements SET median = 'fast'",
    "text bytes": "UPDATE measurements SET bytes = 'many'",
    "bad description": "UPDATE devices SET description = '{not json'",
    "bad params": "UPDATE measurements SET params = '[[['",
    "bad status": "UPDATE measurements SET status = 'perhaps'",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_values_are_skipped_once_by_planning_and_refused_by_tgc_db(
    tmp_path, capsys, damage
):
    path = curve_db(tmp_path / "m.sqlite")
    con = sqlite3.connect(path)
    con.execute(
        DAMAGE[damage] + " WHERE id IN (SELECT id FROM measurements LIMIT 2)"
        if DAMAGE[damage].startswith("UPDATE measurements")
        else DAMAGE[damage]
    )
    con.commit()
    con.close()
    for argv in (["list"], ["show", "numpy.atomic.exp"], ["export"]):
        code, _, err = tgc_main(dbtool, ["--db", str(path), *argv], capsys)
        assert code == 1 and "has a damaged record" in one_line_error(err), (argv, err)
    for tool, argv in (
        (plantool, [EXP_TG, "--planner-backends", "numpy", "--db", str(path)]),
        (profiletool, [EXP_TG, "--planner-backends", "numpy", "--db", str(path), "--dry-run"]),
    ):
        code, _, err = tgc_main(tool, argv, capsys)
        assert code == 0, err
        assert len(err.strip().splitlines()) <= 1, err
        assert "internal error" not in err and "Traceback" not in err
    # the cost source itself: a record it cannot use is skipped, said once
    said = []
    source = DatabaseCostSource(str(path), warn=said.append)
    exp = KERNELS["numpy.atomic.exp"]
    for rows in (8, 16, 32, 200):
        t = TensorType.get((rows, 32), "f32")
        got = source.cost(exp, [t], [t], {})
        assert got.seconds > 0
    assert len(said) <= 1


def test_the_curve_and_its_least_squares_refuse_non_finite_points():
    import numpy as np

    from tgc.planner.estimate import Curve, nonnegative_lstsq

    with pytest.raises(ValueError):
        Curve([(1.0, 1.0, 0.0), (2.0, 2.0, 1.0)])
    with pytest.raises(ValueError):
        Curve([(float("inf"), 1.0, 1e-3), (2.0, 2.0, 1.0)])
    a = np.array([[1.0, np.inf], [1.0, 2.0]])
    assert list(nonnegative_lstsq(a, np.ones(2))) == [0.0, 0.0]
    # huge but finite points fit without LinAlgError
    c = Curve([(1e300, 1e300, 1e-300), (1e-300, 0.0, 1e300), (1.0, 1.0, 1.0), (5.0, 5.0, 2.0)])
    seconds, _ = c.predict(2.0, 2.0)
    assert 0 < seconds < float("inf")


# -- 6: reading writes nothing -------------------------------------------------------------------


def test_reading_a_wal_mode_database_leaves_no_files(tmp_path, capsys):
    path = curve_db(tmp_path / "m.sqlite")
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    con.close()
    assert side_files(tmp_path) == []
    assert dbtool.main(["--db", str(path), "list"]) == 0
    source = DatabaseCostSource(str(path))
    t = TensorType.get((16, 32), "f32")
    assert source.cost(KERNELS["numpy.atomic.exp"], [t], [t], {}).source == "estimated"
    source.db.close()
    assert side_files(tmp_path) == []
    # a writer takes it back to a rollback journal
    with Database.open(str(path)) as db:
        db.record(rec(rows=2))
    assert path.read_bytes()[18:20] == b"\x01\x01"
    assert side_files(tmp_path) == []


def test_reading_works_in_a_folder_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = curve_db(folder / "m.sqlite")
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    uris = []
    real = dbmod._connect

    def spy(target, p, uri=False):
        uris.append(target)
        return real(target, p, uri)

    monkeypatch.setattr(dbmod, "_connect", spy)
    # as root the folder stays writable: ask as a user who could not write it would
    monkeypatch.setattr(dbmod.os, "access", lambda p, mode: False)
    os.chmod(folder, 0o555)
    try:
        with Database.open(str(path), readonly=True) as db:
            assert len(db.rows()) == 4
    finally:
        os.chmod(folder, 0o755)
    assert uris and all("mode=ro" in u and "immutable=1" in u for u in uris)
    assert side_files(folder) == []


def test_the_shipped_databases_are_marked_and_in_rollback_journal_mode(tmp_path, capsys):
    shipped = sorted((ROOT / "bench" / "results").glob("*.sqlite"))
    assert shipped
    for path in shipped:
        head = path.read_bytes()[:100]
        assert head[18:20] == b"\x01\x01", f"{path.name} is in WAL mode"
        assert int.from_bytes(head[68:72], "big") == APPLICATION_ID, path.name
    folder = shipped[0].parent
    before = sorted(p.name for p in folder.iterdir())
    for path in shipped[:3]:
        assert dbtool.main(["--db", str(path), "list"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == before


# -- 7: waiting says so and Ctrl-C ends it; only regular files ---------------------------------------


def _as_from_a_terminal() -> None:
    """In the child before it runs: SIGINT handled and not blocked, as a tool started from a
    terminal has it (a test runner's process may have inherited it ignored or blocked, and
    the child would inherit that in turn)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signal_state(pid: int) -> str:
    """The process's state and its blocked, ignored and caught signals, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            keep = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
            return "; ".join(line.strip() for line in f if line.startswith(keep))
    except OSError as e:
        return f"no /proc status ({e})"


def test_a_lock_wait_is_said_and_ctrl_c_ends_it_at_once(tmp_path):
    path = tmp_path / "m.sqlite"
    with Database.open(str(path)) as db:
        db.record(rec())
    holder = subprocess.Popen(
        [
            PY,
            "-c",
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        export = tmp_path / "e.json"
        export.write_text(
            json.dumps(
                {
                    "format": "tgc-measurements",
                    "version": 1,
                    "devices": [],
                    "kernels": [],
                    "measurements": [],
                }
            )
        )
        waiter = subprocess.Popen(
            [PY, "-m", "tgc.tools.db", "--db", str(path), "import", str(export)],
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_as_from_a_terminal,
        )
        try:
            fd = waiter.stderr.fileno()
            os.set_blocking(fd, False)
            said, deadline = "", time.monotonic() + 30
            while "waiting" not in said and time.monotonic() < deadline:
                try:
                    said += os.read(fd, 4096).decode()
                except BlockingIOError:
                    time.sleep(0.05)
            assert "waiting for another process's lock on" in said, said
            assert len(said.strip().splitlines()) == 1
            start = time.monotonic()
            waiter.send_signal(signal.SIGINT)
            try:
                code = waiter.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"no exit 10 s after SIGINT; {_signal_state(waiter.pid)}")
            # at once, against the lock's 60 s: 5 s leaves room for a loaded 2-core machine
            assert time.monotonic() - start < 5.0
            assert code == 130
        finally:
            waiter.kill()
            waiter.wait()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_only_regular_files_are_opened_and_nothing_blocks(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "pipe.sqlite"
        os.mkfifo(path)
    elif kind == "directory":
        path = tmp_path / "dir.sqlite"
        path.mkdir()
    else:
        path = Path("/dev/null")
    for argv in (["list"], ["import", str(path)]):
        proc = subprocess.run(
            [PY, "-m", "tgc.tools.db", "--db", str(path), *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1
        line = one_line_error(proc.stderr)
        assert "regular file" in line or "is a directory" in line, line
    for readonly in (True, False):
        with pytest.raises(DatabaseUnavailable):
            Database.open(str(path), readonly=readonly)


def test_expected_tables_are_the_migrations_tables():
    assert set(expected_tables(SCHEMA_VERSION)) == {
        "meta",
        "devices",
        "kernels",
        "measurements",
        "plan_times",
    }
    assert "plan_times" not in expected_tables(3)
    assert "origin" in expected_tables(2)["measurements"]
    assert "origin" not in expected_tables(1)["measurements"]


def test_roofline_is_the_fallback_for_a_foreign_file(tmp_path, capsys):
    path = tmp_path / "theirs.sqlite"
    foreign_with_a_measurements_table(path)
    t = TensorType.get((16, 32), "f32")
    exp = KERNELS["numpy.atomic.exp"]
    got = DatabaseCostSource(str(path)).cost(exp, [t], [t], {})
    assert got == RooflineCostSource().cost(exp, [t], [t], {})
    assert "not a tgc measurement database" in one_line_error(capsys.readouterr().err)


def test_copying_a_database_keeps_it_usable(tmp_path):
    path = curve_db(tmp_path / "m.sqlite")
    shutil.copy(path, tmp_path / "copy.sqlite")
    with Database.open(str(tmp_path / "copy.sqlite")) as db:
        assert len(db.rows()) == 4

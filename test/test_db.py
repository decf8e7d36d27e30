"""The measurement database (planner/db.py): schema and migration, unusable files left untouched,
device fingerprints, kernel source hashes, merging, and tgc-db."""

from __future__ import annotations

import json
import os
import sqlite3

import numpy as np
import pytest

from tgc.planner import db as dbmod
from tgc.planner import load_backends
from tgc.planner.cost import RooflineCostSource
from tgc.planner.db import (
    FINGERPRINTS,
    MIGRATIONS,
    SCHEMA_VERSION,
    Database,
    DatabaseUnavailable,
    DeviceInfo,
    KernelInfo,
    Measurement,
    device_info,
    kernel_info,
)
from tgc.planner.estimate import DatabaseCostSource
from tgc.planner.kernel import KERNELS, Kernel
from tgc.tools import db as dbtool
from tgc.types import TensorType

load_backends(["numpy"])  # numpy's kernels alone, whatever is installed

X = TensorType.get((64, 128), "f32")


def record(name: str = "numpy.atomic.exp", seconds: float = 1e-4, **kw) -> Measurement:
    k = KERNELS[name]
    args = {
        "kernel": kernel_info(k),
        "device": dbmod.device_of(k),
        "signature": dbmod.signature_of([X], [X]),
        "dtypes": "f32->f32",
        "params": {},
        "attrs_key": "",
        "attrs": "",
        "bytes": 2.0 * X.nbytes,
        "flops": float(X.num_elements),
        "status": "ok",
        "median": seconds,
        "min": seconds,
        "spread": 0.01,
        "runs": 10,
        "max_error": 0.0,
    }
    args.update(kw)
    return Measurement(**args)


def test_new_file_has_the_schema_its_mark_and_a_rollback_journal(tmp_path):
    path = tmp_path / "sub" / "m.sqlite"
    with Database.open(str(path)) as db:
        assert db.version == SCHEMA_VERSION
        assert db.con.execute("PRAGMA application_id").fetchone()[0] == dbmod.APPLICATION_ID
        assert db.con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        # sqlite waits in short steps, so that Ctrl-C is seen; the whole wait is longer
        assert int(db.con.execute("PRAGMA busy_timeout").fetchone()[0]) <= 100
        assert dbmod.BUSY_TIMEOUT_S >= 10
        tables = set(db._tables())
    assert {"meta", "devices", "kernels", "measurements"} <= tables


def test_migration_from_version_1_keeps_the_records(tmp_path):
    path = str(tmp_path / "old.sqlite")
    con = sqlite3.connect(path, isolation_level=None)
    MIGRATIONS[0](con)
    con.execute("PRAGMA user_version = 1")
    con.execute("INSERT INTO devices VALUES (1, 'fp', 'numpy', '{}')")
    con.execute("INSERT INTO kernels VALUES (1, 'numpy.atomic.exp', 'numpy', 'h', '{}')")
    con.execute(
        "INSERT INTO measurements (kernel_id, device_id, signature, dtypes, params, attrs_key, "
        "attrs, bytes, flops, status, median, created) VALUES "
        "(1, 1, 's', 'f32->f32', '{}', '', '', 8, 2, 'ok', 0.5, 0)"
    )
    con.close()
    with pytest.raises(DatabaseUnavailable, match="has schema 1; open it for writing"):
        Database.open(path, readonly=True)
    with Database.open(path) as db:
        assert db.version == SCHEMA_VERSION
        (m,) = db.rows()
    assert (m.kernel.name, m.median, m.origin) == ("numpy.atomic.exp", 0.5, "profile")


def test_the_device_time_is_kept_and_read_by_a_replayed_plans_costs(tmp_path):
    """A kernel timed on a device keeps the device's time alone beside its median (the longer
    of device and host per call); costs for a plan replayed as a CUDA graph read it, other
    costs the median; a record without it (a version-4 file's, or the host's) costs its
    median either way. Export and import carry it."""
    path = str(tmp_path / "m.sqlite")
    exp = KERNELS["numpy.atomic.exp"]
    with Database.open(path) as db:
        db.record(record(seconds=4e-5, device_median=1e-5))
    with Database.open(path, readonly=True) as db:
        (m,) = db.rows()
    assert (m.median, m.device_median) == (4e-5, 1e-5)

    def seconds(device_time: bool, file: str = path) -> float:
        source = DatabaseCostSource(file, device_time=device_time)
        return source.cost(exp, [X], [X], {}).seconds

    assert (seconds(True), seconds(False)) == (1e-5, 4e-5)
    out, other = tmp_path / "e.json", str(tmp_path / "n.sqlite")
    assert dbtool.main(["--db", path, "export", "-o", str(out)]) == 0
    assert dbtool.main(["--db", other, "import", str(out)]) == 0
    with Database.open(other, readonly=True) as db:
        assert [m.device_median for m in db.rows()] == [1e-5]
    old = str(tmp_path / "v4.sqlite")  # a version-4 file: no device_median column
    with Database.open(old) as db:
        db.record(record(seconds=4e-5))
    con = sqlite3.connect(old, isolation_level=None)
    con.execute("ALTER TABLE measurements DROP COLUMN device_median")
    con.execute("PRAGMA user_version = 4")
    con.close()
    with Database.open(old, readonly=True) as db:
        (m,) = db.rows()
    assert m.device_median is None
    assert (seconds(True, old), seconds(False, old)) == (4e-5, 4e-5)


def test_show_prints_a_record_that_lacks_its_optional_fields(tmp_path, capsys):
    """A success needs its median alone: tgc-db show prints '?' for a missing min, spread, run
    count or error (it raised an internal error; found by test_db_fuzz)."""
    path = str(tmp_path / "m.sqlite")
    with Database.open(path) as db:
        db.record(record(seconds=2e-4, min=None, spread=None, runs=None, max_error=None))
    assert dbtool.main(["--db", path, "show", "numpy.atomic.exp"]) == 0
    out = capsys.readouterr().out
    assert "median 2.000e-04 s, min ? s, spread ?, ? runs, error ?" in out


def unusable_files(tmp_path) -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE photos (id INTEGER)")
    con.commit()
    con.close()
    newer = tmp_path / "newer.sqlite"
    with Database.open(str(newer)) as db:
        db.record(record())
        db.con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.con.execute("PRAGMA user_version = 99")
    return {
        "corrupt": rng.bytes(4096),
        "text": b"these are my notes, not a database\n",
        "truncated header": dbmod.SQLITE_HEADER[:9] + rng.bytes(3000),
        "other program": other.read_bytes(),
        "newer": newer.read_bytes(),
    }


@pytest.mark.parametrize(
    "kind, message",
    [
        ("corrupt", "is not an SQLite database"),
        ("text", "is not an SQLite database"),
        ("truncated header", "is not an SQLite database"),
        ("other program", "is an SQLite database but not a tgc measurement database"),
        ("newer", "was written by a newer tgc \\(schema 99"),
    ],
)
def test_unusable_file_is_reported_and_left_byte_identical(tmp_path, kind, message, capsys):
    content = unusable_files(tmp_path)[kind]
    path = tmp_path / "user.sqlite"
    path.write_bytes(content)
    for readonly in (True, False):
        with pytest.raises(DatabaseUnavailable, match=message) as info:
            Database.open(str(path), readonly=readonly)
        assert "\n" not in info.value.render()
    # the planner goes on with the roofline, saying why once
    source = DatabaseCostSource(str(path))
    exp = KERNELS["numpy.atomic.exp"]
    for _ in range(2):
        got = source.cost(exp, [X], [X], {})
        assert got == RooflineCostSource().cost(exp, [X], [X], {})
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and "using estimates without it" in warnings[0]
    assert path.read_bytes() == content
    if not content.startswith(dbmod.SQLITE_HEADER):  # sqlite never saw it: no side files
        assert not [n for n in os.listdir(tmp_path) if n.startswith("user.sqlite-")]


def test_records_replace_by_instance_and_keep_newer(tmp_path):
    with Database.open(str(tmp_path / "m.sqlite")) as db:
        assert db.record(record(seconds=2e-4, created=100.0))
        assert db.record(record(seconds=1e-4, created=50.0))  # a re-measurement replaces
        assert not db.record(record(seconds=3e-4, created=10.0), keep_newer=True)
        assert db.record(record(seconds=4e-4, created=200.0), keep_newer=True)
        (m,) = db.rows()
    assert (m.median, m.created) == (4e-4, 200.0)


def test_fingerprints_keep_one_machines_records_from_another(tmp_path, monkeypatch):
    path = str(tmp_path / "m.sqlite")
    exp = KERNELS["numpy.atomic.exp"]
    real = FINGERPRINTS["numpy"]
    # another machine (a different CPU) measured exp: its record must not be used here
    monkeypatch.setitem(FINGERPRINTS, "numpy", lambda: {**real(), "cpu": "Another CPU 9000"})
    device_info.cache_clear()
    other = device_info("numpy")
    with Database.open(path) as db:
        db.record(record(seconds=0.123, device=other))
    monkeypatch.setitem(FINGERPRINTS, "numpy", real)
    device_info.cache_clear()
    assert device_info("numpy").fingerprint != other.fingerprint
    assert DatabaseCostSource(path).cost(exp, [X], [X], {}).source == "roofline"
    with Database.open(path) as db:
        db.record(record(seconds=0.5))
    found = DatabaseCostSource(path).cost(exp, [X], [X], {})
    assert (found.source, found.seconds) == ("measured", 0.5)


def test_fingerprint_describes_cpu_numpy_blas_and_tgc():
    d = device_info("numpy").description
    assert {"cpu", "numpy", "blas", "tgc", "backend"} <= set(d)
    assert d["numpy"] == np.__version__


def test_a_changed_kernel_has_another_source_hash():
    def run_a(inputs, attrs, result_types):
        return [np.exp(inputs[0])]

    def run_b(inputs, attrs, result_types):
        return [np.exp(inputs[0]) + 0]

    a = Kernel("numpy.hash_a", "numpy", op="atomic.exp", run=run_a)
    b = Kernel("numpy.hash_a", "numpy", op="atomic.exp", run=run_b)
    c = Kernel("numpy.hash_a", "numpy", op="atomic.exp", run=run_a, max_rel_error=1e-3)
    hashes = {kernel_info(k).source_hash for k in (a, b, c)}
    assert len(hashes) == 3
    assert kernel_info(a) == kernel_info(
        Kernel("numpy.hash_a", "numpy", op="atomic.exp", run=run_a)
    )


def test_export_import_merges_without_duplicates(tmp_path, capsys):
    one, two = str(tmp_path / "one.sqlite"), str(tmp_path / "two.sqlite")
    fake = DeviceInfo("f" * 16, "numpy", {"cpu": "elsewhere"})
    with Database.open(one) as db:
        db.record(record(seconds=1e-4, created=10.0))
        db.record(record(seconds=7e-4, created=10.0, device=fake))
        db.record(
            record(
                status="failed",
                median=None,
                max_error=float("inf"),
                message="bad",
                signature="other",
                created=10.0,
            )
        )
    assert dbtool.main(["--db", one, "export", "-o", str(tmp_path / "e.json")]) == 0
    data = json.loads((tmp_path / "e.json").read_text())
    assert len(data["measurements"]) == 3 and len(data["devices"]) == 2
    with Database.open(two) as db:
        db.record(record(seconds=5e-5, created=20.0))  # newer than the exported one
    for _ in range(2):
        assert dbtool.main(["--db", two, "import", str(tmp_path / "e.json")]) == 0
    with Database.open(two) as db:
        rows = db.rows()
    assert len(rows) == 3
    here = [r for r in rows if r.device.fingerprint != fake.fingerprint and r.ok]
    assert [r.median for r in here] == [5e-5]  # the newer record stayed
    failed = [r for r in rows if not r.ok]
    assert failed[0].max_error == float("inf") and failed[0].message == "bad"
    out = capsys.readouterr().out
    assert "imported 2 record(s), kept 1 existing" in out
    assert "imported 0 record(s), kept 3 existing" in out


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "could not read"),
        ('{"format": "photos"}', "is not a tgc-db export"),
        ('{"format": "tgc-measurements", "version": 7}', "is export version 7"),
        (
            (
                '{"format": "tgc-measurements", "version": 1, "devices": [], "kernels": [], '
                '"measurements": [{"kernel": ["k", "h"], "device": "d"}]}'
            ),
            "is not a valid tgc-db export: record 0: kernel ['k', 'h'] is not among",
        ),
    ],
)
def test_import_of_a_bad_file_is_one_line_and_writes_nothing(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    path = tmp_path / "m.sqlite"
    assert dbtool.main(["--db", str(path), "import", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not path.exists()


def test_prune_removes_stale_kernel_versions_and_failures(tmp_path, capsys):
    path = str(tmp_path / "m.sqlite")
    stale = KernelInfo("numpy.atomic.exp", "numpy", "0" * 16, {})
    gone = KernelInfo("cuda.not_here", "cuda", "1" * 16, {})  # a backend not loaded: kept
    with Database.open(path) as db:
        db.record(record())
        db.record(record(kernel=stale))
        db.record(record(kernel=gone))
        db.record(record(signature="x", status="failed", median=None, message="wrong"))
    assert dbtool.main(["--db", path, "prune", "--dry-run"]) == 0
    assert "would prune 1 record(s)" in capsys.readouterr().out
    assert dbtool.main(["--db", path, "prune"]) == 0
    assert dbtool.main(["--db", path, "prune", "--failures"]) == 0
    out = capsys.readouterr().out
    assert "pruned 1 record(s)" in out
    with Database.open(path) as db:
        names = sorted((r.kernel.name, r.kernel.source_hash[:1]) for r in db.rows())
    assert names == [
        ("cuda.not_here", "1"),
        ("numpy.atomic.exp", kernel_info(KERNELS["numpy.atomic.exp"]).source_hash[:1]),
    ]


def test_show_prints_records_and_the_fitted_curve(tmp_path, capsys):
    path = str(tmp_path / "m.sqlite")
    with Database.open(path) as db:
        for rows in (16, 32, 64, 128, 256):
            t = TensorType.get((rows, 128), "f32")
            seconds = 2e-6 + 2 * t.nbytes / 4e9  # a 4 GB/s kernel with 2 us per call
            db.record(record(signature=f"r{rows}", bytes=2.0 * t.nbytes, flops=0.0, median=seconds))
    assert dbtool.main(["--db", path, "show", "numpy.atomic.exp"]) == 0
    out = capsys.readouterr().out
    assert "(this machine)" in out and out.count("median ") == 5
    assert (
        "fit f32->f32: t = 2e-06 s + bytes / 4 GB/s; leave-one-out error 2.0% (5 point(s))" in out
    )
    assert dbtool.main(["--db", path, "show", "numpy.atomic.tanh"]) == 1
    assert "no records of kernel 'numpy.atomic.tanh'" in capsys.readouterr().err


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    import sys

    path = str(tmp_path / "m.sqlite")
    with Database.open(path) as db:
        db.record(record())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert (
        dbtool.main(["--db", path, "plot", "numpy.atomic.exp", "-o", str(tmp_path / "p.png")]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: plot needs matplotlib, which is not installed (pip install matplotlib, or in a "
        "clone pip install -e '.[plot]')"
    )


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    path = str(tmp_path / "m.sqlite")
    with Database.open(path) as db:
        for rows in (16, 32, 64):
            db.record(record(signature=f"r{rows}", bytes=rows * 1024.0, median=rows * 1e-6))
    out = tmp_path / "p.png"
    assert dbtool.main(["--db", path, "plot", "numpy.atomic.exp", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_read_commands_on_a_missing_database_fail_without_creating_it(tmp_path, capsys):
    path = tmp_path / "none.sqlite"
    assert dbtool.main(["--db", str(path), "list"]) == 1
    assert f"no measurement database at '{path}'" in capsys.readouterr().err
    assert not path.exists()


def test_default_path_is_tgc_db_else_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TGC_DB", str(tmp_path / "chosen.sqlite"))
    assert dbmod.default_path() == str(tmp_path / "chosen.sqlite")
    monkeypatch.delenv("TGC_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert dbmod.default_path() == str(tmp_path / "cache" / "tgc" / "measurements.sqlite")

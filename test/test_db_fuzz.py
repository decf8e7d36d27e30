"""Fuzzing the measurement database (issue 23; docs/measurements.md, "How it is tested"):
random page damage, random value damage, crafted imports, and a prune racing a profiler.

Each test runs once with a fresh seed, printed on failure (replay with TGC_FUZZ_SEED=<seed>),
and once with every seed that ever failed (FAILED_SEEDS: add a seed there when one fails).
What must hold, whatever the damage:

- never an internal error: tgc-db exits 0, or 1 with one line; the planner's cost source
  answers (from the roofline where it must) and says at most two lines (the file given up, a
  damaged record skipped); a writer opens and records, or refuses with DatabaseUnavailable;
- never a write into a corrupt or foreign file: a file that fails `PRAGMA quick_check`, or
  carries another application id, is byte-identical after every tool has tried it;
- never a record under the wrong kernel: each record's kernel row is the kernel it was taken
  for, and its device row exists.

About 3 s on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import sqlite3
import threading
from pathlib import Path

import pytest
from test_db_hostile import rec as hostile_rec

from tgc.planner import db as dbmod
from tgc.planner import load_backends
from tgc.planner.db import Database, DatabaseUnavailable, Measurement
from tgc.planner.estimate import DatabaseCostSource
from tgc.planner.kernel import KERNELS
from tgc.tools import db as dbtool
from tgc.types import TensorType

load_backends(["numpy"])

FAILED_SEEDS: dict[str, list[int]] = {"pages": [], "values": [], "imports": [], "race": []}
TRIALS = 10
NAMES = ["numpy.atomic.exp", "numpy.atomic.neg", "numpy.tanh"]


def fresh_seed() -> int:
    return int(os.environ.get("TGC_FUZZ_SEED", random.randrange(2**32)))


def rec(name: str, rows: int, seconds: float | None = None, **kw) -> Measurement:
    """test_db_hostile's record, its time by default growing with the rows (a curve to fit)."""
    return hostile_rec(name, rows, 1e-7 * rows if seconds is None else seconds, **kw)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[bytes, dict]:
    """A database of three kernels at 30 shapes each (several pages), and its export."""
    folder = tmp_path_factory.mktemp("base")
    path = folder / "m.sqlite"
    with Database.open(str(path)) as db:
        db.record_all(
            [rec(n, r) for n in NAMES for r in range(1, 31)]
            + [rec(NAMES[0], 99, status="failed", median=None, min=None, message="wrong")]
        )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert dbtool.main(["--db", str(path), "export", "-o", str(folder / "e.json")]) == 0
    return path.read_bytes(), json.loads((folder / "e.json").read_text())


@pytest.fixture(autouse=True)
def quick_machine(monkeypatch):
    """tgc-db's "this machine" marks need every backend's device: not what is fuzzed here."""
    monkeypatch.setattr(dbtool, "_this_machine", lambda: set())


def corrupt_or_foreign(path: Path) -> bool:
    """Whether tgc must never write `path`: not SQLite, failing quick_check, another
    application's id (0 is a tgc database of an earlier version, if its tables are tgc's)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            ok = con.execute("PRAGMA quick_check").fetchall() == [("ok",)]
            app = con.execute("PRAGMA application_id").fetchone()[0]
        finally:
            con.close()
    except (sqlite3.Error, UnicodeDecodeError):  # sqlite's message may quote damaged bytes
        return True
    return not ok or app not in (0, dbmod.APPLICATION_ID)


def tool(argv: list[str], where: str) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = dbtool.main(argv)
    text = err.getvalue()
    assert code in (0, 1), f"{where}: tgc-db {argv[2:]} exit {code}: {text}"
    assert "internal error" not in text and "Traceback" not in text, f"{where}: {text}"
    if code == 1:
        assert len(text.strip().splitlines()) == 1, f"{where}: {text}"
    return code


def plan_costs(path: Path, where: str) -> None:
    for device_time in (False, True):  # a plan launched call by call, one replayed
        _plan_costs(path, where, device_time)


def _plan_costs(path: Path, where: str, device_time: bool) -> None:
    said: list[str] = []
    source = DatabaseCostSource(str(path), warn=said.append, device_time=device_time)
    try:
        for name in NAMES:
            for rows in (1, 7, 30, 45, 500):
                t = TensorType.get((rows, 32), "f32")
                got = source.cost(KERNELS[name], [t], [t], {})
                assert got.seconds > 0 and not math.isnan(got.seconds), f"{where}: {got}"
    except Exception as e:  # noqa: BLE001  (any exception is the failure reported)
        raise AssertionError(f"{where}: the cost source raised {type(e).__name__}: {e}") from e
    finally:
        if source._db is not None:
            source._db.close()
    assert len(said) <= 2 and all("\n" not in s for s in said), f"{where}: {said}"


def write(path: Path, where: str) -> None:
    try:
        with Database.open(str(path)) as db:
            db.record(rec(NAMES[1], 77))
    except DatabaseUnavailable as e:
        assert "\n" not in e.render(), where


def attempt_everything(path: Path, export: Path, where: str) -> None:
    """Every reader and writer on `path`; a corrupt or foreign file must come out unchanged."""
    before = path.read_bytes()
    protected = corrupt_or_foreign(path)
    for argv in (["list"], ["show", NAMES[0]], ["export", "-o", os.devnull]):
        tool(["--db", str(path), *argv], where)
    plan_costs(path, where)
    write(path, where)
    tool(["--db", str(path), "import", str(export)], where)
    tool(["--db", str(path), "prune", "--failures"], where)
    if protected:
        assert path.read_bytes() == before, f"{where}: a corrupt or foreign file was written"
    side = [p.name for p in path.parent.iterdir() if p.name.endswith(("-wal", "-shm", "-journal"))]
    assert side == [], f"{where}: side files left: {side}"


# -- random page damage ------------------------------------------------------------------------------


def damage_pages(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    page = int.from_bytes(out[16:18], "big")
    page = 65536 if page == 1 else page
    for _ in range(rng.randint(1, 3)):
        start = rng.randrange(len(out) // page) * page
        kind = rng.random()
        if kind < 0.3:
            out[start : start + page] = bytes(page)
        elif kind < 0.4 and start == 0:
            out[rng.randrange(100)] = rng.randrange(256)  # the header
        else:
            for _ in range(rng.randint(1, 16)):
                out[start + rng.randrange(page)] = rng.randrange(256)
    return bytes(out)


@pytest.mark.parametrize("seed", [None, *FAILED_SEEDS["pages"]], ids=lambda s: f"seed={s}")
def test_random_page_damage(tmp_path, base, seed):
    seed = fresh_seed() if seed is None else seed
    rng = random.Random(seed)
    data, exported = base
    export = tmp_path / "e.json"
    export.write_text(json.dumps(exported))
    for i in range(TRIALS):
        folder = tmp_path / f"t{i}"
        folder.mkdir()
        path = folder / "m.sqlite"
        path.write_bytes(damage_pages(rng, data))
        attempt_everything(path, export, f"page trial {i} of seed {seed} (TGC_FUZZ_SEED={seed})")


# -- random value damage -----------------------------------------------------------------------------

JUNK = [None, "x", "", -1, 0, 1e308, -1e308, 1e-320, b"\x00\xff", "{", "[[[[", "inf", 7, "ok"]
COLUMNS = {
    "measurements": [
        "kernel_id",
        "device_id",
        "signature",
        "dtypes",
        "params",
        "attrs_key",
        "bytes",
        "flops",
        "status",
        "median",
        "min",
        "spread",
        "runs",
        "max_error",
        "created",
        "origin",
        "device_median",
    ],
    "kernels": ["name", "backend", "source_hash", "params"],
    "devices": ["fingerprint", "backend", "description"],
}


def damage_values(rng: random.Random, path: Path) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    try:
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            if kind < 0.06:
                con.execute(f"DROP TABLE IF EXISTS {rng.choice(list(COLUMNS))}")
            elif kind < 0.1:
                con.execute(f"PRAGMA application_id = {rng.choice([0, 1, 99, -5])}")
            elif kind < 0.14:
                con.execute(f"PRAGMA user_version = {rng.choice([0, 1, 3, 1000])}")
            else:
                table = rng.choice(list(COLUMNS))
                column = rng.choice(COLUMNS[table])
                value = rng.choice(JUNK)
                if isinstance(value, str) and value in ("{", "[[[[") and rng.random() < 0.5:
                    value = value * rng.randint(1, 3000)
                with contextlib.suppress(sqlite3.Error):  # a NOT NULL or UNIQUE constraint
                    con.execute(
                        f"UPDATE {table} SET {column} = ? WHERE id IN "
                        f"(SELECT id FROM {table} ORDER BY random() LIMIT ?)",
                        (value, rng.randint(1, 5)),
                    )
    except sqlite3.Error:
        pass  # the table was dropped
    finally:
        con.close()


@pytest.mark.parametrize("seed", [None, *FAILED_SEEDS["values"]], ids=lambda s: f"seed={s}")
def test_random_value_damage(tmp_path, base, seed):
    seed = fresh_seed() if seed is None else seed
    rng = random.Random(seed)
    data, exported = base
    export = tmp_path / "e.json"
    export.write_text(json.dumps(exported))
    for i in range(TRIALS):
        folder = tmp_path / f"t{i}"
        folder.mkdir()
        path = folder / "m.sqlite"
        path.write_bytes(data)
        damage_values(rng, path)
        attempt_everything(path, export, f"value trial {i} of seed {seed} (TGC_FUZZ_SEED={seed})")


# -- crafted imports ---------------------------------------------------------------------------------

POISON = [0, -1, -0.0, 1e-320, "inf", "nan", "Infinity", True, None, [], {}, "x", 10**30, 2.5]


def craft(rng: random.Random, data: dict) -> str:
    data = json.loads(json.dumps(data))
    for _ in range(rng.randint(1, 3)):
        part = rng.choice(["measurements", "measurements", "measurements", "devices", "kernels"])
        if not data[part]:
            continue
        item = rng.choice(data[part])
        key = rng.choice(sorted(item))
        roll = rng.random()
        if roll < 0.1:
            del item[key]
        elif roll < 0.2:
            nested: list = []
            for _ in range(rng.choice([5, 40, 5000])):
                nested = [nested]
            item[key] = nested
        else:
            item[key] = rng.choice(POISON)
    text = json.dumps(data, check_circular=False) if _shallow(data) else _deep_text(data)
    if rng.random() < 0.2:
        text = text.replace('"median": ', '"median": 1e999 + ', 1).replace(" + ", "", 1)
    if rng.random() < 0.1:
        text = text.replace('"runs": 10', '"runs": ' + "9" * rng.randint(19, 500), 1)
    return text


def _shallow(value, depth: int = 0) -> bool:
    if depth > 100:
        return False
    if isinstance(value, dict):
        return all(_shallow(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return all(_shallow(v, depth + 1) for v in value)
    return True


def _deep_text(data: dict) -> str:
    """JSON text of `data` holding one list nested too deep for json.dumps: written as
    brackets."""
    marker = "@@deep@@"
    depth = 0
    for part in ("measurements", "devices", "kernels"):
        for item in data[part]:
            for key, v in item.items():
                if isinstance(v, list) and not _shallow(v):
                    while isinstance(v, list) and v:
                        v, depth = v[0], depth + 1
                    item[key] = marker
    return json.dumps(data).replace(f'"{marker}"', "[" * (depth + 1) + "]" * (depth + 1))


@pytest.mark.parametrize("seed", [None, *FAILED_SEEDS["imports"]], ids=lambda s: f"seed={s}")
def test_crafted_imports(tmp_path, base, seed):
    seed = fresh_seed() if seed is None else seed
    rng = random.Random(seed)
    data, exported = base
    path = tmp_path / "m.sqlite"
    refused = 0
    for i in range(TRIALS * 2):
        where = f"import {i} of seed {seed} (TGC_FUZZ_SEED={seed})"
        path.write_bytes(data)
        crafted = tmp_path / "c.json"
        crafted.write_text(craft(rng, exported))
        if tool(["--db", str(path), "import", str(crafted)], where) == 1:
            refused += 1
            assert path.read_bytes() == data, f"{where}: a refused import wrote"
        with Database.open(str(path), readonly=True, check=True) as db:
            rows = db.rows()  # whatever was imported is valid
        assert rows, where
    assert refused > 0, f"seed {seed}: no crafted import was refused"


# -- a prune racing a profiler -----------------------------------------------------------------------


def filed_wrongly(path: Path) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        rows = con.execute(
            "SELECT m.attrs, k.name, d.id FROM measurements m "
            "LEFT JOIN kernels k ON k.id = m.kernel_id LEFT JOIN devices d ON d.id = m.device_id"
        ).fetchall()
    finally:
        con.close()
    return [r for r in rows if r[0] != r[1] or r[2] is None]


@pytest.mark.parametrize("seed", [None, *FAILED_SEEDS["race"]], ids=lambda s: f"seed={s}")
def test_prune_racing_a_profiler(tmp_path, seed):
    seed = fresh_seed() if seed is None else seed
    rng = random.Random(seed)
    path = tmp_path / "m.sqlite"
    order = [(rng.choice(NAMES), rng.randint(1, 6)) for _ in range(30)]
    prunes = [rng.choice(["all", "one", "failed"]) for _ in range(15)]
    errors: list[str] = []

    def profile() -> None:
        try:
            with Database.open(str(path)) as db:
                for name, rows in order:
                    db.record(rec(name, rows))
        except Exception as e:  # noqa: BLE001
            errors.append(f"profiler: {type(e).__name__}: {e}")

    def prune() -> None:
        try:
            with Database.open(str(path)) as db:
                for what in prunes:
                    if what == "all":
                        db.delete("1")
                    elif what == "one":
                        name = rng.choice(NAMES)
                        db.delete(
                            lambda d, n=name: (
                                "kernel_id IN (SELECT id FROM kernels WHERE name = ?)",
                                [n],
                            )
                        )
                    else:
                        db.delete("status = 'failed'")
        except Exception as e:  # noqa: BLE001
            errors.append(f"pruner: {type(e).__name__}: {e}")

    Database.open(str(path)).close()
    threads = [threading.Thread(target=profile), threading.Thread(target=prune)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    where = f"seed {seed} (TGC_FUZZ_SEED={seed})"
    assert errors == [], f"{where}: {errors}"
    assert filed_wrongly(path) == [], f"{where}: records under the wrong kernel"
    with Database.open(str(path), readonly=True, check=True) as db:
        db.rows()

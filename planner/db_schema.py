"""What the measurement database (planner/db.py) holds: its tables, the migrations that bring
an older file to `SCHEMA_VERSION`, and the records a row reads as (`Measurement`, with its
`KernelInfo` and `DeviceInfo`).

Tables (schema version in `PRAGMA user_version`, upgraded by `MIGRATIONS`):

- `devices`: what a timing was taken on, as a *fingerprint* (planner/fingerprints.py).
- `kernels`: name, backend, *source hash* (the kernel's code and reference graphs: a changed
  kernel is a new row, its old timings are not used) and its parameter domains.
- `measurements`: kernel, device, the instance (operand and result types, parameters, op
  attributes), bytes and flops moved, then either a time (median, min, spread, runs) with the
  error against float64, or a failure with its message; when, and what took it (profile, tune,
  import); and whether the time is *noisy* (its spread stayed above the profiler's
  `NOISY_SPREAD` however often it was taken again). A kernel timed on a device (schema 5) also
  has its *device median*: the time of the work it queued alone, without the host's time to
  queue it, which is what it adds to a plan replayed as a CUDA graph (the `median` is the
  longer of the two, what it adds to a plan launched call by call). One row per instance and
  device: measuring again replaces it.
- `plan_times` (schema 4): whole-plan times the GPU route took (planner/plan_memory.py): per
  function (its canonical hash) and device, each candidate plan (`planned`, `library`,
  `default`) by the hash of its kernels, its time or why it did not run, and which one was
  chosen. A later compile of the function whose candidate plans are the same takes the choice
  without timing them again. A compile that times them replaces the function's rows.

Readers read a file of schema `READABLE_FROM` or later as it is (a column added since reads as
its default); only a writer upgrades it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SCHEMA_VERSION = 5
# The oldest schema a reader reads without an upgrade: later versions only add columns with
# defaults (`column_or_default`). Version 1 lacks `origin`, which every read names.
READABLE_FROM = 2
OK, FAILED = "ok", "failed"
ORIGINS = ("profile", "tune", "import")
PLAN_ORIGINS = ("route", "import")  # what took a whole-plan time

# -- schema -----------------------------------------------------------------------------------------


def _v1(con: sqlite3.Connection) -> None:
    _statements(
        con,
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE devices (
            id INTEGER PRIMARY KEY,
            fingerprint TEXT NOT NULL UNIQUE,
            backend TEXT NOT NULL,
            description TEXT NOT NULL
        );
        CREATE TABLE kernels (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            backend TEXT NOT NULL,
            source_hash TEXT NOT NULL,
            params TEXT NOT NULL,
            UNIQUE (name, source_hash)
        );
        CREATE TABLE measurements (
            id INTEGER PRIMARY KEY,
            kernel_id INTEGER NOT NULL REFERENCES kernels(id),
            device_id INTEGER NOT NULL REFERENCES devices(id),
            signature TEXT NOT NULL,
            dtypes TEXT NOT NULL,
            params TEXT NOT NULL,
            attrs_key TEXT NOT NULL,
            attrs TEXT NOT NULL,
            bytes REAL NOT NULL,
            flops REAL NOT NULL,
            status TEXT NOT NULL,
            median REAL,
            min REAL,
            spread REAL,
            runs INTEGER,
            max_error REAL,
            message TEXT,
            created REAL NOT NULL,
            UNIQUE (kernel_id, device_id, signature, params, attrs_key)
        );
        """,
    )


def _statements(con: sqlite3.Connection, script: str) -> None:
    """Run `;`-separated statements inside the caller's transaction (executescript would
    commit it first)."""
    for statement in script.split(";"):
        if statement.strip():
            con.execute(statement)


def _v2(con: sqlite3.Connection) -> None:
    # What took a measurement (tuning points are told apart from the profile's defaults), and
    # an index for the estimator's per-kernel, per-device reads.
    con.execute("ALTER TABLE measurements ADD COLUMN origin TEXT NOT NULL DEFAULT 'profile'")
    con.execute("CREATE INDEX measurements_by_kernel ON measurements (kernel_id, device_id)")


def _v3(con: sqlite3.Connection) -> None:
    # A time whose spread stayed large however often it was taken is kept, flagged, never
    # silently trusted as a steady one (planner/profile.py `steady_time`).
    con.execute("ALTER TABLE measurements ADD COLUMN noisy INTEGER NOT NULL DEFAULT 0")


def _v4(con: sqlite3.Connection) -> None:
    # Whole-plan times, so that the GPU route remembers which candidate plan of a function ran
    # fastest (planner/plan_memory.py). `kernels`: JSON [[name, backend, source hash], ...] of
    # the kernels the plan calls (what `tgc-db prune` judges a plan stale by).
    _statements(
        con,
        """
        CREATE TABLE plan_times (
            id INTEGER PRIMARY KEY,
            function_hash TEXT NOT NULL,
            device_id INTEGER NOT NULL REFERENCES devices(id),
            candidate TEXT NOT NULL,
            plan_hash TEXT NOT NULL,
            kernels TEXT NOT NULL,
            status TEXT NOT NULL,
            median REAL,
            spread REAL,
            runs INTEGER,
            noisy INTEGER NOT NULL DEFAULT 0,
            chosen INTEGER NOT NULL DEFAULT 0,
            message TEXT,
            created REAL NOT NULL,
            origin TEXT NOT NULL,
            UNIQUE (function_hash, device_id, candidate)
        );
        CREATE INDEX plan_times_by_function ON plan_times (function_hash, device_id);
        """,
    )


def _v5(con: sqlite3.Connection) -> None:
    # A replayed CUDA graph launches its kernels without the host: the planner of a replayed
    # plan costs a kernel by the device's time alone (planner/profile.py `time_call`).
    con.execute("ALTER TABLE measurements ADD COLUMN device_median REAL")


# MIGRATIONS[i] takes a database from version i to i + 1; a new file runs them all.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3, _v4, _v5]
assert len(MIGRATIONS) == SCHEMA_VERSION

# measurements' column -> (the schema version that added it, what a reader of an older file
# reads instead)
ADDED_COLUMNS = {"noisy": (3, "0"), "device_median": (5, "NULL")}
PLAN_TIMES_SINCE = 4  # a file older than this has no whole-plan times (reads find none)


def column_or_default(column: str, version: int, table: str = "") -> str:
    """Measurements' `column` (`table`: its alias and a dot) in a query on a file of schema
    `version`, or its default where the file is older than the column."""
    since, default = ADDED_COLUMNS[column]
    return table + column if version >= since else default


# -- records ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceInfo:
    fingerprint: str
    backend: str
    description: dict


@dataclass(frozen=True)
class KernelInfo:
    name: str
    backend: str
    source_hash: str
    params: dict  # name -> domain (list)


@dataclass
class Measurement:
    """One row of `measurements`, with its kernel and device."""

    kernel: KernelInfo
    device: DeviceInfo
    signature: str
    dtypes: str
    params: dict
    attrs_key: str
    attrs: str
    bytes: float
    flops: float
    status: str
    median: float | None = None
    min: float | None = None
    spread: float | None = None
    runs: int | None = None
    max_error: float | None = None
    message: str | None = None
    created: float = field(default_factory=time.time)
    origin: str = "profile"
    noisy: bool = False  # the spread stayed above NOISY_SPREAD after every repeat
    device_median: float | None = None  # the queued work alone, where timed on a device

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class PlanTime:
    """One row of `plan_times`: a candidate plan of a function on a device, timed whole."""

    function_hash: str  # planner/blocks.py `function_hash` of the function planned
    device: DeviceInfo
    candidate: str  # planned, library, default
    plan_hash: str  # planner/plan_memory.py `plan_hash`: the kernels it calls, in order
    kernels: list  # [[name, backend, source hash], ...] of the kernels it calls, each once
    status: str  # ok, or failed: it did not run (message)
    median: float | None = None  # seconds per call, the whole plan
    spread: float | None = None
    runs: int | None = None
    noisy: bool = False  # the spread stayed large: the choice it made is not remembered
    chosen: bool = False  # the candidate that ran
    message: str | None = None
    created: float = field(default_factory=time.time)
    origin: str = "route"

    @property
    def ok(self) -> bool:
        return self.status == OK


def signature_of(operand_types, result_types) -> str:
    """An instance's types, encodings included: `tensor<4x8xf32>,tensor<8xf32>->tensor<4x8xf32>`."""
    return ",".join(map(str, operand_types)) + "->" + ",".join(map(str, result_types))


def dtypes_of(operand_types, result_types) -> str:
    """The element types alone (`f32,f32->f32`): points of one curve share them."""
    ins = ",".join(t.element_type for t in operand_types)
    return ins + "->" + ",".join(t.element_type for t in result_types)


def params_text(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))

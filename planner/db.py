"""The measurement database: every kernel timing tgc has taken, in one sqlite3 file.

What the file holds (tables, migrations, the `Measurement` record) is planner/db_schema.py; the
kernel and device identities a record is keyed by are planner/fingerprints.py. This module opens
the file and reads and writes it (`Database`).

What it promises (docs/measurements.md, "What the database promises"):

- **Only its own files.** A tgc database carries `PRAGMA application_id` = `APPLICATION_ID`. A
  file that is not a regular file, not an SQLite database, an SQLite database of another
  program (another application id, or none and tables that are not exactly a tgc schema), one
  written by a newer tgc, or a damaged one (a tgc table missing) is refused in one line
  (`DatabaseUnavailable`) before anything is written: never migrated, marked, switched to
  another journal mode, renamed or deleted. A tgc database of an earlier version (application
  id 0, a tgc schema) is marked the first time it is opened for writing.
- **No write into a corrupt file.** A file opened for writing passes `PRAGMA quick_check`
  first (so do tgc-db's reads); a corrupt one is refused and left as it is.
- **Stable keys.** A record names its kernel (name, source hash) and device (fingerprint); their
  row ids are looked up inside each write transaction, never cached, so `tgc-db prune` can run
  beside a profiler and no record is filed under another kernel.
- **Valid values.** `measurement_problem` says what is wrong with a record (a time that is not
  a positive finite number, negative bytes, ...): writes refuse such a record, strict reads
  (`rows`, `devices`, `kernels`: tgc-db) refuse a damaged row in one line, and the planner's
  reads (`instance_records`, `curve_records`) return rows as stored for the planner to skip.
- **Reading writes nothing.** Readers open the file `mode=ro`, and `immutable=1` where it (or its
  folder) cannot be written or it is in WAL mode with no WAL beside it, so reading leaves no
  side files and works in a read-only folder. Writers use sqlite's rollback journal (a file in
  WAL mode is switched back when a writer has it alone), one measurement per transaction, so a
  killed profiler loses at most the one in flight.
- **Waiting says so.** A lock held by another process is waited for in short steps
  (`POLL_S`), so Ctrl-C ends the wait at once; after `WAIT_NOTICE_S` one line on stderr says
  it waits, and after `BUSY_TIMEOUT_S` it gives up in one line.

Where the file is: `--db PATH`, else the environment variable `TGC_DB`, else
`measurements.sqlite` in the user cache directory (`platformdirs`). The choice selects a data
file; it does not change what a pipeline means.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Self

from tgc.diagnostics import TgcError
from tgc.planner.db_schema import (
    FAILED,
    MIGRATIONS,
    OK,
    ORIGINS,
    READABLE_FROM,
    SCHEMA_VERSION,
    DeviceInfo,
    KernelInfo,
    Measurement,
    column_or_default,
    dtypes_of,
    params_text,
    signature_of,
)
from tgc.planner.fingerprints import (
    FINGERPRINTS,
    cpu_description,
    cuda_description,
    device_backend,
    device_info,
    device_of,
    kernel_info,
)

# Re-exported: the planner, tools and tests import these from here.
__all__ = [
    "APPLICATION_ID",
    "BUSY_TIMEOUT_S",
    "DB_FILE",
    "FAILED",
    "FINGERPRINTS",
    "MIGRATIONS",
    "OK",
    "ORIGINS",
    "READABLE_FROM",
    "SCHEMA_VERSION",
    "SQLITE_ERRORS",
    "SQLITE_HEADER",
    "Database",
    "DatabaseUnavailable",
    "DeviceInfo",
    "KernelInfo",
    "Measurement",
    "cpu_description",
    "cuda_description",
    "default_path",
    "device_backend",
    "device_info",
    "device_of",
    "dtypes_of",
    "kernel_info",
    "measurement_problem",
    "params_text",
    "resolve_path",
    "signature_of",
]

DB_FILE = "measurements.sqlite"
APPLICATION_ID = 0x54474344  # "TGCD" in the file's header (PRAGMA application_id)
BUSY_TIMEOUT_S = 60.0  # the longest wait for another process's lock
POLL_S = 0.05  # one wait inside sqlite; Ctrl-C is seen between two
WAIT_NOTICE_S = 1.0  # a wait longer than this is said on stderr
SQLITE_HEADER = b"SQLite format 3\x00"
MAX_JSON_DEPTH = 32  # of a stored or imported JSON value (descriptions, parameters)


# What a damaged file can raise from sqlite3: its errors, and an error message quoting bytes of
# the file that are not UTF-8 (the module decodes sqlite's messages).
SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError)


class DatabaseUnavailable(TgcError):
    """The database cannot be used (its one-line reason is the message)."""


def default_path() -> str:
    """`TGC_DB`, else measurements.sqlite in the user cache directory."""
    chosen = os.environ.get("TGC_DB")
    if chosen:
        return chosen
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("tgc", appauthor=False), DB_FILE)


def resolve_path(path: str | None) -> str:
    return path if path else default_path()


# -- values ---------------------------------------------------------------------------------------


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def positive(v: Any) -> bool:
    """A finite number > 0 (a time)."""
    return _number(v) and v > 0


def non_negative(v: Any) -> bool:
    """A finite number >= 0 (bytes, flops, a spread)."""
    return _number(v) and v >= 0


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of a JSON value, counted without recursion; stops past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            items = v.values() if isinstance(v, dict) else v
            stack.extend((x, depth + 1) for x in items)
    return deepest


def _shown(value: Any) -> str:
    """A value in a message: repr, escaped, at most 40 characters."""
    text = ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


def measurement_problem(m: Measurement) -> str | None:
    """What makes `m` unfit to store or use (None: nothing). Times are positive finite numbers;
    bytes, flops, spread and error non-negative (an error may be infinite); texts are text;
    descriptions and parameters are JSON objects nested at most MAX_JSON_DEPTH deep."""
    k, d = m.kernel, m.device
    for what, v in (
        ("kernel name", k.name),
        ("kernel backend", k.backend),
        ("kernel source hash", k.source_hash),
        ("device fingerprint", d.fingerprint),
        ("device backend", d.backend),
    ):
        if not isinstance(v, str) or not v:
            return f"{what} is {_shown(v)}, not a name"
    for what, v in (
        ("kernel params", k.params),
        ("device description", d.description),
        ("params", m.params),
    ):
        if not isinstance(v, dict):
            return f"{what} is {_shown(v)}, not a JSON object"
        if json_depth(v) > MAX_JSON_DEPTH:
            return f"{what} nests deeper than {MAX_JSON_DEPTH}"
    for what in ("signature", "dtypes", "attrs_key", "attrs"):
        if not isinstance(getattr(m, what), str):
            return f"{what} is {_shown(getattr(m, what))}, not text"
    if m.message is not None and not isinstance(m.message, str):
        return f"message is {_shown(m.message)}, not text"
    if m.status not in (OK, FAILED):
        return f"status is {_shown(m.status)}, not '{OK}' or '{FAILED}'"
    if m.origin not in ORIGINS:
        return f"origin is {_shown(m.origin)}, not one of {', '.join(ORIGINS)}"
    for what in ("bytes", "flops"):
        if not non_negative(getattr(m, what)):
            return f"{what} is {_shown(getattr(m, what))}, not a finite number >= 0"
    if not non_negative(m.created):
        return f"created is {_shown(m.created)}, not a time"
    for what in ("median", "min", "device_median"):  # a success needs its median; times > 0
        v = getattr(m, what)
        if ((m.ok and what == "median") or v is not None) and not positive(v):
            return f"{what} is {_shown(v)}, not a positive finite number of seconds"
    if m.spread is not None and not non_negative(m.spread):
        return f"spread is {_shown(m.spread)}, not a finite number >= 0"
    if m.runs is not None and (
        not isinstance(m.runs, int) or isinstance(m.runs, bool) or not 0 < m.runs < 2**53
    ):
        return f"runs is {_shown(m.runs)}, not a positive integer"
    if not isinstance(m.noisy, bool):
        return f"noisy is {_shown(m.noisy)}, not true or false"
    e = m.max_error
    if e is not None:
        # infinite where the reference itself overflowed, or for a failure
        if not (isinstance(e, (int, float)) and not isinstance(e, bool) and e >= 0):
            return f"max_error is {_shown(e)}, not a number >= 0"
    return None


def _label(m: Measurement) -> str:
    """`kernel signature` of a record for a message, escaped where not printable."""
    text = f"{m.kernel.name} {m.signature}"
    return text if text.isprintable() else ascii(text)


# -- the file -------------------------------------------------------------------------------------


@functools.cache
def expected_tables(version: int) -> dict[str, tuple[str, ...]]:
    """The tables (name -> column names) of a tgc database of schema `version`."""
    con = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for step in MIGRATIONS[:version]:
            step(con)
        return _table_columns(con)
    finally:
        con.close()


def _table_columns(con: sqlite3.Connection) -> dict[str, tuple[str, ...]]:
    names = [
        r[0]
        for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    return {
        n: tuple(r[1] for r in con.execute("SELECT * FROM pragma_table_info(?)", (n,)))
        for n in names
    }


def _is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(e) or "busy" in str(e)


def _patiently(path: str, step: Callable[[], Any]) -> Any:
    """`step()`, again while another process holds the lock: sqlite waits POLL_S each time, so
    Ctrl-C (KeyboardInterrupt) ends the wait at once; one line says that it waits."""
    start, told = None, False
    while True:
        try:
            return step()
        except sqlite3.OperationalError as e:
            if not _is_busy(e):
                raise
        now = time.monotonic()
        if start is None:
            start = now
        waited = now - start
        if not told and waited >= WAIT_NOTICE_S:
            told = True
            print(
                f"tgc: waiting for another process's lock on '{path}' (Ctrl-C stops)",
                file=sys.stderr,
                flush=True,
            )
        if waited >= BUSY_TIMEOUT_S:
            raise DatabaseUnavailable(
                f"gave up on measurement database '{path}' after waiting {BUSY_TIMEOUT_S:.0f} s "
                f"for another process's lock"
            )
        time.sleep(0.005)


class Database:
    """An open measurement database. `Database.open(path)` for reading and writing (the file
    and its folder are made when missing), `Database.open(path, readonly=True)` to read."""

    def __init__(self, con: sqlite3.Connection, path: str, readonly: bool) -> None:
        self.con = con
        self.path = path
        self.readonly = readonly

    @classmethod
    def open(cls, path: str, readonly: bool = False, check: bool | None = None) -> Database:
        """Open `path`. `check` (default: when writing) runs `PRAGMA quick_check` first: a
        corrupt file is refused. Every refusal is a one-line DatabaseUnavailable, before
        anything is written (module doc)."""
        check = not readonly if check is None else check
        head = _check_file(path)
        if readonly:
            if head is None:
                raise DatabaseUnavailable(f"no measurement database at '{path}'")
            con = _connect_reader(path, head)
            try:
                _judge(con, path, check, readonly=True)
            except BaseException:
                con.close()
                raise
            return cls(con, path, True)
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise DatabaseUnavailable(f"cannot create '{folder}': {e.strerror}") from None
        if head:
            # Judge the file before a connection that may write opens it. A hot journal
            # (a writer killed mid-commit) needs a writing connection to be rolled back.
            if os.path.exists(path + "-journal"):
                con = _connect(path, path)
            else:
                con = _connect_reader(path, head)
            try:
                _judge(con, path, check, readonly=False)
            finally:
                con.close()
        con = _connect(path, path)
        db = cls(con, path, False)
        try:
            db._initialise()
        except BaseException:
            con.close()
            raise
        return db

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _initialise(self) -> None:
        """Make, upgrade or mark the file in one transaction (a second process that got there
        first leaves nothing to do), then leave WAL mode where it is in it."""
        con = self.con

        def change() -> None:
            version = _judge(con, self.path, False, readonly=False)
            for step in MIGRATIONS[version:]:
                step(con)
            if version == 0:
                con.execute("INSERT INTO meta VALUES ('created', ?)", (str(time.time()),))
            if version != SCHEMA_VERSION:
                con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            if con.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                con.execute(f"PRAGMA application_id = {APPLICATION_ID}")

        self._transaction(change)
        try:
            if con.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                con.execute("PRAGMA journal_mode = DELETE")
        except SQLITE_ERRORS:
            pass  # another connection has it open: it stays in WAL mode for now

    def _transaction(self, body: Callable[[], Any]) -> Any:
        """`body()` inside BEGIN IMMEDIATE ... COMMIT (waited for patiently); all or nothing."""
        if self.readonly:
            raise DatabaseUnavailable(f"'{self.path}' is open for reading only")
        con = self.con
        try:
            _patiently(self.path, lambda: con.execute("BEGIN IMMEDIATE"))
            try:
                result = body()
                _patiently(self.path, lambda: con.execute("COMMIT"))
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        except SQLITE_ERRORS as e:
            raise _unavailable(self.path, e) from None
        return result

    def _read(self, sql: str, args: Iterable = ()) -> list[tuple]:
        """Rows of a query, waited for patiently; sqlite errors as DatabaseUnavailable."""
        try:
            return _patiently(self.path, lambda: self.con.execute(sql, tuple(args)).fetchall())
        except SQLITE_ERRORS as e:
            raise _unavailable(self.path, e) from None

    @property
    def version(self) -> int:
        return self._read("PRAGMA user_version")[0][0]

    @property
    def empty(self) -> bool:
        return self.version == 0

    def _tables(self) -> list[str]:
        return [r[0] for r in self._read("SELECT name FROM sqlite_master WHERE type = 'table'")]

    # -- ids (a snapshot: a concurrent prune may delete them; writes never use them) -----------

    def device_id(self, device: DeviceInfo, create: bool = False) -> int | None:
        if create:
            return self._transaction(lambda: self._device_row(device))
        if self.empty:
            return None
        rows = self._read("SELECT id FROM devices WHERE fingerprint = ?", (device.fingerprint,))
        return rows[0][0] if rows else None

    def kernel_id(self, kernel: KernelInfo, create: bool = False) -> int | None:
        if create:
            return self._transaction(lambda: self._kernel_row(kernel))
        if self.empty:
            return None
        rows = self._read(
            "SELECT id FROM kernels WHERE name = ? AND source_hash = ?",
            (kernel.name, kernel.source_hash),
        )
        return rows[0][0] if rows else None

    def _device_row(self, device: DeviceInfo) -> int:
        """The row id of `device`, made if missing; inside the caller's transaction."""
        cur = self.con.execute(
            "INSERT INTO devices (fingerprint, backend, description) VALUES (?, ?, ?) "
            "ON CONFLICT (fingerprint) DO UPDATE SET backend = backend RETURNING id",
            (device.fingerprint, device.backend, json.dumps(device.description, sort_keys=True)),
        )
        return cur.fetchone()[0]

    def _kernel_row(self, kernel: KernelInfo) -> int:
        cur = self.con.execute(
            "INSERT INTO kernels (name, backend, source_hash, params) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (name, source_hash) DO UPDATE SET name = name RETURNING id",
            (kernel.name, kernel.backend, kernel.source_hash, params_text(kernel.params)),
        )
        return cur.fetchone()[0]

    # -- writing ------------------------------------------------------------------------------------

    def record(self, m: Measurement, keep_newer: bool = False) -> bool:
        """Store one measurement in its own transaction (replacing the row of the same instance
        and device; with `keep_newer`, only when `m` is newer). Returns whether it was stored."""
        return self.record_all([m], keep_newer) == 1

    def record_all(self, ms: Iterable[Measurement], keep_newer: bool = False) -> int:
        """Store measurements in one transaction (all or none); returns how many were stored.
        A record with a bad value (`measurement_problem`) is a ValueError, and nothing is
        stored."""
        ms = list(ms)
        for m in ms:
            problem = measurement_problem(m)
            if problem is not None:
                raise ValueError(f"measurement of {_label(m)}: {problem}")
        return self._transaction(lambda: sum(self._insert(m, keep_newer) for m in ms))

    def _insert(self, m: Measurement, keep_newer: bool) -> bool:
        # The kernel and device are found by their keys inside this transaction: a prune that
        # committed before it cannot leave a stale id here.
        device = self._device_row(m.device)
        kernel = self._kernel_row(m.kernel)
        guard = "WHERE excluded.created > measurements.created" if keep_newer else ""
        cur = self.con.execute(
            f"""
            INSERT INTO measurements (kernel_id, device_id, signature, dtypes, params, attrs_key,
                attrs, bytes, flops, status, median, min, spread, runs, max_error, message,
                created, origin, noisy, device_median)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (kernel_id, device_id, signature, params, attrs_key) DO UPDATE SET
                dtypes = excluded.dtypes, attrs = excluded.attrs, bytes = excluded.bytes,
                flops = excluded.flops, status = excluded.status, median = excluded.median,
                min = excluded.min, spread = excluded.spread, runs = excluded.runs,
                max_error = excluded.max_error, message = excluded.message,
                created = excluded.created, origin = excluded.origin, noisy = excluded.noisy,
                device_median = excluded.device_median
            {guard}
            """,
            (
                kernel,
                device,
                m.signature,
                m.dtypes,
                params_text(m.params),
                m.attrs_key,
                m.attrs,
                m.bytes,
                m.flops,
                m.status,
                m.median,
                m.min,
                m.spread,
                m.runs,
                m.max_error,
                m.message,
                m.created,
                m.origin,
                int(m.noisy),
                m.device_median,
            ),
        )
        return cur.rowcount > 0

    def delete(self, where: str | Callable[[Database], tuple[str, list]], args: Iterable = ()):
        """Delete the measurements matching `where` (over `measurements`), then kernels and
        devices left without any; one transaction. `where` may be a function of the database
        giving (condition, args), called inside the transaction (so the ids it reads cannot go
        stale). Returns how many measurements went."""
        con = self.con

        def change() -> int:
            condition, values = where(self) if callable(where) else (where, args)
            if not condition:
                return 0
            gone = con.execute(f"DELETE FROM measurements WHERE {condition}", tuple(values))
            con.execute("DELETE FROM kernels WHERE id NOT IN (SELECT kernel_id FROM measurements)")
            # a device may hold whole-plan times alone (planner/db_plans.py)
            con.execute(
                "DELETE FROM devices WHERE id NOT IN (SELECT device_id FROM measurements) "
                "AND id NOT IN (SELECT device_id FROM plan_times)"
            )
            return gone.rowcount

        return self._transaction(change)

    def count(self, where: str, args: Iterable = ()) -> int:
        """How many measurements match `where` (over `measurements`)."""
        if self.empty:
            return 0
        return self._read(f"SELECT COUNT(*) FROM measurements WHERE {where}", args)[0][0]

    # -- reading: strict (tgc-db): a damaged row is refused in one line -------------------------------

    def rows(self, where: str = "", args: Iterable = ()) -> list[Measurement]:
        """Measurements joined with their kernel and device, filtered by an SQL condition over
        `m.` (measurements), `k.` (kernels) and `d.` (devices). A damaged row (a value that
        `measurement_problem` refuses, JSON that does not parse) is a DatabaseUnavailable."""
        if self.empty:
            return []
        sql = f"""
            SELECT m.id, k.name, k.backend, k.source_hash, k.params, d.fingerprint, d.backend,
                d.description, m.signature, m.dtypes, m.params, m.attrs_key, m.attrs, m.bytes,
                m.flops, m.status, m.median, m.min, m.spread, m.runs, m.max_error, m.message,
                m.created, m.origin, {column_or_default("noisy", self.version, "m.")},
                {column_or_default("device_median", self.version, "m.")}
            FROM measurements m JOIN kernels k ON k.id = m.kernel_id
                JOIN devices d ON d.id = m.device_id
            {"WHERE " + where if where else ""}
            ORDER BY k.name, d.fingerprint, m.bytes, m.flops, m.signature, m.params
        """
        out = []
        for r in self._read(sql, args):
            try:
                m = _measurement(r[1:])
            except ValueError as e:
                raise self._damaged(f"measurement {r[0]}: {e}") from None
            problem = measurement_problem(m)
            if problem is not None:
                raise self._damaged(f"measurement {r[0]} ({_label(m)}): {problem}")
            out.append(m)
        return out

    def devices(self) -> list[tuple[int, str, str, dict]]:
        if self.empty:
            return []
        out = []
        for i, f, b, d in self._read("SELECT id, fingerprint, backend, description FROM devices"):
            try:
                description = _json_object(d)
            except ValueError as e:
                raise self._damaged(f"device {i}: description {e}") from None
            if not isinstance(f, str) or not isinstance(b, str):
                raise self._damaged(f"device {i}: fingerprint or backend is not text")
            out.append((i, f, b, description))
        return out

    def kernels(self) -> list[tuple[int, str, str, str, dict]]:
        if self.empty:
            return []
        out = []
        for i, n, b, h, p in self._read(
            "SELECT id, name, backend, source_hash, params FROM kernels"
        ):
            try:
                params = _json_object(p)
            except ValueError as e:
                raise self._damaged(f"kernel {i}: params {e}") from None
            if not all(isinstance(v, str) for v in (n, b, h)):
                raise self._damaged(f"kernel {i}: name, backend or source hash is not text")
            out.append((i, n, b, h, params))
        return out

    def _damaged(self, what: str) -> DatabaseUnavailable:
        return DatabaseUnavailable(
            f"measurement database '{self.path}' has a damaged record ({what}); it is left as it is"
        )

    # -- reading: as stored (the planner validates and skips) -----------------------------------

    def time_column(self, device_time: bool) -> str:
        """The time a planner reads of `measurements m`: the median, or with `device_time` (a
        plan replayed as a CUDA graph) the device's time alone where the record has it."""
        if not device_time:
            return "m.median"
        return f"COALESCE({column_or_default('device_median', self.version, 'm.')}, m.median)"

    def instance_records(
        self, kernel: KernelInfo, device: DeviceInfo, signature: str, device_time: bool = False
    ) -> list:
        """(params, attrs_key, status, time, spread) of every record of one instance, as
        stored (the caller skips damaged values); the time is `time_column`'s."""
        if self.empty:
            return []
        return self._read(
            f"SELECT m.params, m.attrs_key, m.status, {self.time_column(device_time)}, m.spread "
            "FROM measurements m "
            "JOIN kernels k ON k.id = m.kernel_id JOIN devices d ON d.id = m.device_id "
            "WHERE k.name = ? AND k.source_hash = ? AND d.fingerprint = ? AND m.signature = ?",
            (kernel.name, kernel.source_hash, device.fingerprint, signature),
        )

    def curve_records(
        self,
        kernel: KernelInfo,
        device: DeviceInfo,
        params: str,
        dtypes: str,
        device_time: bool = False,
    ):
        """(bytes, flops, time) of the successful records of a kernel on a device with these
        parameters and element types, as stored; the time is `time_column`'s."""
        if self.empty:
            return []
        return self._read(
            f"SELECT m.bytes, m.flops, {self.time_column(device_time)} FROM measurements m "
            "JOIN kernels k ON k.id = m.kernel_id JOIN devices d ON d.id = m.device_id "
            "WHERE k.name = ? AND k.source_hash = ? AND d.fingerprint = ? AND m.params = ? "
            "AND m.dtypes = ? AND m.status = 'ok' ORDER BY m.bytes, m.flops",
            (kernel.name, kernel.source_hash, device.fingerprint, params, dtypes),
        )

    def known_instances(
        self, kernel: KernelInfo, device: DeviceInfo, since: float = 0.0
    ) -> set[tuple]:
        """(signature, params, attrs_key) of every record, ok or failed, of a kernel here made
        at `since` (seconds since the epoch) or later."""
        if self.empty:
            return set()
        rows = self._read(
            "SELECT m.signature, m.params, m.attrs_key FROM measurements m "
            "JOIN kernels k ON k.id = m.kernel_id JOIN devices d ON d.id = m.device_id "
            "WHERE k.name = ? AND k.source_hash = ? AND d.fingerprint = ? AND m.created >= ?",
            (kernel.name, kernel.source_hash, device.fingerprint, since),
        )
        return set(rows)

    # By row ids (kept for callers that hold ids; prefer the keyed reads above).

    def instance_rows(self, kernel_id: int, device_id: int, signature: str) -> list[tuple]:
        """(params, attrs_key, status, median, spread) of every record of one instance."""
        return self._read(
            "SELECT params, attrs_key, status, median, spread FROM measurements "
            "WHERE kernel_id = ? AND device_id = ? AND signature = ?",
            (kernel_id, device_id, signature),
        )

    def curve_points(self, kernel_id: int, device_id: int, params: str, dtypes: str) -> list:
        """(bytes, flops, median) of the successful records of a kernel on a device."""
        return self._read(
            "SELECT bytes, flops, median FROM measurements WHERE kernel_id = ? AND device_id = ? "
            "AND params = ? AND dtypes = ? AND status = 'ok' ORDER BY bytes, flops",
            (kernel_id, device_id, params, dtypes),
        )

    def known(self, kernel_id: int, device_id: int) -> set[tuple[str, str, str]]:
        """(signature, params, attrs_key) of every record, ok or failed, of a kernel here."""
        rows = self._read(
            "SELECT signature, params, attrs_key FROM measurements "
            "WHERE kernel_id = ? AND device_id = ?",
            (kernel_id, device_id),
        )
        return set(rows)


def _json_object(text: Any) -> dict:
    """A stored JSON object; ValueError saying why not."""
    if not isinstance(text, str):
        raise ValueError(f"is {_shown(text)}, not JSON text")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_JSON_DEPTH}") from None
    except ValueError as e:
        raise ValueError(f"is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"is {_shown(value)}, not a JSON object")
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"nests deeper than {MAX_JSON_DEPTH}")
    return value


def _measurement(r: tuple) -> Measurement:
    """A row of `rows` as a Measurement; ValueError for JSON that does not parse."""
    parts = []
    for what, text in (("kernel params", r[3]), ("device description", r[6]), ("params", r[9])):
        try:
            parts.append(_json_object(text))
        except ValueError as e:
            raise ValueError(f"{what} {e}") from None
    kernel = KernelInfo(r[0], r[1], r[2], parts[0])
    device = DeviceInfo(r[4], r[5], parts[1])
    m = Measurement(kernel, device, r[7], r[8], parts[2], *r[10:])
    if m.noisy in (0, 1) and not isinstance(m.noisy, float):  # stored as an integer
        m.noisy = bool(m.noisy)
    return m


def _check_file(path: str) -> bytes | None:
    """The first 100 bytes of `path` (None: no such file). Refuses, before sqlite touches it,
    what is not a regular file (a FIFO would block, a directory or device is no database) and a
    file that is not an SQLite database (sqlite would leave side files beside it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DatabaseUnavailable(f"cannot read '{path}': {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise DatabaseUnavailable(f"'{path}' is a directory, not a measurement database")
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "not a regular file"
        )
        raise DatabaseUnavailable(
            f"'{path}' is {kind}, not a measurement database (only regular files are opened)"
        )
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            head = os.read(fd, 100)
        finally:
            os.close(fd)
    except OSError as e:
        raise DatabaseUnavailable(f"cannot read '{path}': {e.strerror}") from None
    if head and (len(head) < 100 or not head.startswith(SQLITE_HEADER)):
        raise DatabaseUnavailable(
            f"'{path}' is not an SQLite database (corrupt or another kind of file); it is left "
            f"as it is"
        )
    return head


def _judge(con: sqlite3.Connection, path: str, check: bool, readonly: bool) -> int:
    """The schema version of a tgc database on `con`; DatabaseUnavailable for anything else
    (module doc). Reads only."""

    def look() -> tuple[int, int, dict]:
        app = con.execute("PRAGMA application_id").fetchone()[0]
        version = con.execute("PRAGMA user_version").fetchone()[0]
        return app, version, _table_columns(con)

    try:
        app, version, tables = _patiently(path, look)
        foreign = DatabaseUnavailable(
            f"'{path}' is an SQLite database but not a tgc measurement database; it is left as "
            f"it is"
        )
        if app not in (0, APPLICATION_ID):
            raise foreign
        if version > SCHEMA_VERSION:
            if app == 0 and not set(expected_tables(SCHEMA_VERSION)) <= set(tables):
                raise foreign
            raise DatabaseUnavailable(
                f"'{path}' was written by a newer tgc (schema {version}; this tgc reads up to "
                f"{SCHEMA_VERSION}); it is left as it is"
            )
        if app == 0:
            if version == 0 and not tables:
                return 0  # an empty file: nothing recorded yet
            if version == 0 or tables != expected_tables(version):
                raise foreign
        elif tables != expected_tables(version):
            missing = sorted(set(expected_tables(version)) - set(tables))
            what = f"table '{missing[0]}' is missing" if missing else "its tables are not tgc's"
            raise DatabaseUnavailable(
                f"'{path}' is a damaged tgc measurement database ({what}); it is left as it is"
            )
        if check:
            problems = _patiently(path, lambda: con.execute("PRAGMA quick_check(1)").fetchall())
            if problems != [("ok",)]:
                first = str(problems[0][0]) if problems else "no answer"
                raise _corrupt(path, first)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
        if isinstance(e, sqlite3.OperationalError) and "readonly" in str(e).replace(" ", ""):
            raise _unavailable(path, e) from None
        reason = "text that is not UTF-8" if isinstance(e, UnicodeDecodeError) else str(e)
        raise _corrupt(path, reason or type(e).__name__) from None
    if readonly and 0 < version < READABLE_FROM:
        raise DatabaseUnavailable(
            f"'{path}' has schema {version}; open it for writing once (any tgc-profile or "
            f"tgc-db import) to upgrade it to {SCHEMA_VERSION}"
        )
    return version


def _printable(text: str) -> str:
    """`text` on one line: control characters (sqlite quotes damaged bytes) escaped."""
    text = " ".join(text.split())
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _corrupt(path: str, reason: str) -> DatabaseUnavailable:
    reason = _printable(reason)
    reason = reason if len(reason) <= 100 else reason[:97] + "..."
    return DatabaseUnavailable(
        f"'{path}' is a corrupt SQLite database ({reason}); it is left as it is"
    )


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(os.path.abspath(path))


def _connect_reader(path: str, head: bytes) -> sqlite3.Connection:
    """A read-only connection that makes no file: immutable where the file or its folder
    cannot be written (nothing can change it) or where it is in WAL mode with no WAL beside it
    (a plain reader would make -wal and -shm files)."""
    folder = os.path.dirname(os.path.abspath(path))
    writable = os.access(path, os.W_OK) and os.access(folder, os.W_OK)
    wal = len(head) > 19 and head[18] == 2 and head[19] == 2
    immutable = not writable or (wal and not os.path.exists(path + "-wal"))
    uri = f"file:{_uri_path(path)}?mode=ro" + ("&immutable=1" if immutable else "")
    return _connect(uri, path, uri=True)


def _connect(target: str, path: str, uri: bool = False) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(
            target, timeout=POLL_S, isolation_level=None, uri=uri, check_same_thread=False
        )
    except SQLITE_ERRORS as e:
        raise _unavailable(path, e) from None
    con.text_factory = _text  # damaged text decodes, marked, rather than raising
    return con


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _unavailable(path: str, e: Exception) -> DatabaseUnavailable:
    if isinstance(e, UnicodeDecodeError):
        return _corrupt(path, "text that is not UTF-8")
    reason = _printable(str(e) or type(e).__name__)
    return DatabaseUnavailable(f"cannot use measurement database '{path}': {reason}")

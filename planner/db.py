"""The measurement database: every kernel timing tgc has taken, in one sqlite3 file.

What the file holds (tables, migrations, the `Measurement` record) is planner/db_schema.py; the
kernel and device identities a record is keyed by are planner/fingerprints.py. This module opens
the file and reads and writes it (`Database`).

Writers use WAL mode and a busy timeout, so several profilers can write at once, and commit one
measurement per transaction, so a killed profiler loses at most the one in flight. A file that
is not an SQLite database, one that belongs to something else, or one written by a newer tgc is
reported in one line (`DatabaseUnavailable`) and never written to, renamed or deleted.

Where the file is: `--db PATH`, else the environment variable `TGC_DB`, else
`measurements.sqlite` in the user cache directory (`platformdirs`). The choice selects a data
file; it does not change what a pipeline means.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable
from typing import Self

from tgc.diagnostics import TgcError
from tgc.planner.db_schema import (
    FAILED,
    MIGRATIONS,
    OK,
    ORIGINS,
    SCHEMA_VERSION,
    DeviceInfo,
    KernelInfo,
    Measurement,
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
    "BUSY_TIMEOUT_S",
    "DB_FILE",
    "FAILED",
    "FINGERPRINTS",
    "MIGRATIONS",
    "OK",
    "ORIGINS",
    "SCHEMA_VERSION",
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
    "params_text",
    "resolve_path",
    "signature_of",
]

DB_FILE = "measurements.sqlite"
BUSY_TIMEOUT_S = 60.0  # a writer waits this long for another writer's transaction
SQLITE_HEADER = b"SQLite format 3\x00"


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


# -- the file -------------------------------------------------------------------------------------


class Database:
    """An open measurement database. `Database.open(path)` for reading and writing (the file
    and its folder are made when missing), `Database.open(path, readonly=True)` to read."""

    def __init__(self, con: sqlite3.Connection, path: str, readonly: bool) -> None:
        self.con = con
        self.path = path
        self.readonly = readonly
        self._devices: dict[str, int | None] = {}
        self._kernels: dict[tuple[str, str], int | None] = {}

    @classmethod
    def open(cls, path: str, readonly: bool = False) -> Database:
        _check_header(path)
        if readonly:
            if not os.path.exists(path):
                raise DatabaseUnavailable(f"no measurement database at '{path}'")
            con = _connect(f"file:{_uri_path(path)}?mode=ro", path, uri=True)
        else:
            folder = os.path.dirname(os.path.abspath(path))
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise DatabaseUnavailable(f"cannot create '{folder}': {e.strerror}") from None
            con = _connect(path, path)
        db = cls(con, path, readonly)
        try:
            db._prepare()
        except sqlite3.Error as e:
            con.close()
            raise _unavailable(path, e) from None
        except DatabaseUnavailable:
            con.close()
            raise
        return db

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _prepare(self) -> None:
        version = self.con.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise DatabaseUnavailable(
                f"'{self.path}' was written by a newer tgc (schema {version}; this tgc reads up "
                f"to {SCHEMA_VERSION}); it is left as it is"
            )
        if version == 0 and self._tables():
            raise DatabaseUnavailable(
                f"'{self.path}' is an SQLite database but not a tgc measurement database; it is "
                f"left as it is"
            )
        if version < SCHEMA_VERSION:
            if self.readonly:
                if version == 0:
                    return  # an empty file: nothing recorded yet
                raise DatabaseUnavailable(
                    f"'{self.path}' has schema {version}; open it for writing once (any "
                    f"tgc-profile or tgc-db import) to upgrade it to {SCHEMA_VERSION}"
                )
            self._migrate()
        if not self.readonly:
            self.con.execute("PRAGMA journal_mode=WAL")

    def _tables(self) -> list[str]:
        rows = self.con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return [r[0] for r in rows]

    def _migrate(self) -> None:
        """Bring the file to SCHEMA_VERSION in one transaction (a second process that got there
        first leaves nothing to do)."""
        con = self.con
        con.execute("BEGIN IMMEDIATE")
        try:
            version = con.execute("PRAGMA user_version").fetchone()[0]
            for step in MIGRATIONS[version:]:
                step(con)
            if version == 0:
                con.execute("INSERT INTO meta VALUES ('created', ?)", (str(time.time()),))
            con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    @property
    def version(self) -> int:
        return self.con.execute("PRAGMA user_version").fetchone()[0]

    @property
    def empty(self) -> bool:
        return self.version == 0

    # -- ids ---------------------------------------------------------------------------------------

    def device_id(self, device: DeviceInfo, create: bool = False) -> int | None:
        found = self._devices.get(device.fingerprint)
        if found is None and not self.empty:
            row = self.con.execute(
                "SELECT id FROM devices WHERE fingerprint = ?", (device.fingerprint,)
            ).fetchone()
            found = row[0] if row else None
        if found is None and create:
            cur = self.con.execute(
                "INSERT INTO devices (fingerprint, backend, description) VALUES (?, ?, ?) "
                "ON CONFLICT (fingerprint) DO UPDATE SET backend = backend RETURNING id",
                (
                    device.fingerprint,
                    device.backend,
                    json.dumps(device.description, sort_keys=True),
                ),
            )
            found = cur.fetchone()[0]
        if found is not None:
            self._devices[device.fingerprint] = found
        return found

    def kernel_id(self, kernel: KernelInfo, create: bool = False) -> int | None:
        key = (kernel.name, kernel.source_hash)
        found = self._kernels.get(key)
        if found is None and not self.empty:
            row = self.con.execute(
                "SELECT id FROM kernels WHERE name = ? AND source_hash = ?", key
            ).fetchone()
            found = row[0] if row else None
        if found is None and create:
            cur = self.con.execute(
                "INSERT INTO kernels (name, backend, source_hash, params) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name, source_hash) DO UPDATE SET name = name RETURNING id",
                (kernel.name, kernel.backend, kernel.source_hash, params_text(kernel.params)),
            )
            found = cur.fetchone()[0]
        if found is not None:
            self._kernels[key] = found
        return found

    # -- writing ------------------------------------------------------------------------------------

    def record(self, m: Measurement, keep_newer: bool = False) -> bool:
        """Store one measurement in its own transaction (replacing the row of the same instance
        and device; with `keep_newer`, only when `m` is newer). Returns whether it was stored."""
        return self.record_all([m], keep_newer) == 1

    def record_all(self, ms: Iterable[Measurement], keep_newer: bool = False) -> int:
        """Store measurements in one transaction (all or none); returns how many were stored."""
        if self.readonly:
            raise DatabaseUnavailable(f"'{self.path}' is open for reading only")
        con = self.con
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                stored = sum(self._insert(m, keep_newer) for m in ms)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                self._devices.clear()  # ids made inside the rolled-back transaction are gone
                self._kernels.clear()
                raise
        except sqlite3.Error as e:
            raise _unavailable(self.path, e) from None
        return stored

    def _insert(self, m: Measurement, keep_newer: bool) -> bool:
        device = self.device_id(m.device, create=True)
        kernel = self.kernel_id(m.kernel, create=True)
        guard = "WHERE excluded.created > measurements.created" if keep_newer else ""
        cur = self.con.execute(
            f"""
            INSERT INTO measurements (kernel_id, device_id, signature, dtypes, params, attrs_key,
                attrs, bytes, flops, status, median, min, spread, runs, max_error, message,
                created, origin)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (kernel_id, device_id, signature, params, attrs_key) DO UPDATE SET
                dtypes = excluded.dtypes, attrs = excluded.attrs, bytes = excluded.bytes,
                flops = excluded.flops, status = excluded.status, median = excluded.median,
                min = excluded.min, spread = excluded.spread, runs = excluded.runs,
                max_error = excluded.max_error, message = excluded.message,
                created = excluded.created, origin = excluded.origin
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
            ),
        )
        return cur.rowcount > 0

    # -- reading ------------------------------------------------------------------------------------

    def rows(self, where: str = "", args: Iterable = ()) -> list[Measurement]:
        """Measurements joined with their kernel and device, filtered by an SQL condition over
        `m.` (measurements), `k.` (kernels) and `d.` (devices)."""
        if self.empty:
            return []
        sql = f"""
            SELECT k.name, k.backend, k.source_hash, k.params, d.fingerprint, d.backend,
                d.description, m.signature, m.dtypes, m.params, m.attrs_key, m.attrs, m.bytes,
                m.flops, m.status, m.median, m.min, m.spread, m.runs, m.max_error, m.message,
                m.created, m.origin
            FROM measurements m JOIN kernels k ON k.id = m.kernel_id
                JOIN devices d ON d.id = m.device_id
            {"WHERE " + where if where else ""}
            ORDER BY k.name, d.fingerprint, m.bytes, m.flops, m.signature, m.params
        """
        try:
            return [_measurement(r) for r in self.con.execute(sql, tuple(args))]
        except sqlite3.Error as e:
            raise _unavailable(self.path, e) from None

    def instance_rows(self, kernel_id: int, device_id: int, signature: str) -> list[tuple]:
        """(params, attrs_key, status, median, spread) of every record of one instance."""
        return self.con.execute(
            "SELECT params, attrs_key, status, median, spread FROM measurements "
            "WHERE kernel_id = ? AND device_id = ? AND signature = ?",
            (kernel_id, device_id, signature),
        ).fetchall()

    def curve_points(self, kernel_id: int, device_id: int, params: str, dtypes: str) -> list:
        """(bytes, flops, median) of the successful records of a kernel on a device."""
        return self.con.execute(
            "SELECT bytes, flops, median FROM measurements WHERE kernel_id = ? AND device_id = ? "
            "AND params = ? AND dtypes = ? AND status = 'ok' ORDER BY bytes, flops",
            (kernel_id, device_id, params, dtypes),
        ).fetchall()

    def known(self, kernel_id: int, device_id: int) -> set[tuple[str, str, str]]:
        """(signature, params, attrs_key) of every record, ok or failed, of a kernel here."""
        rows = self.con.execute(
            "SELECT signature, params, attrs_key FROM measurements "
            "WHERE kernel_id = ? AND device_id = ?",
            (kernel_id, device_id),
        )
        return set(rows)

    def devices(self) -> list[tuple[int, str, str, dict]]:
        if self.empty:
            return []
        rows = self.con.execute("SELECT id, fingerprint, backend, description FROM devices")
        return [(i, f, b, json.loads(d)) for i, f, b, d in rows]

    def kernels(self) -> list[tuple[int, str, str, str, dict]]:
        if self.empty:
            return []
        rows = self.con.execute("SELECT id, name, backend, source_hash, params FROM kernels")
        return [(i, n, b, h, json.loads(p)) for i, n, b, h, p in rows]

    def delete(self, where: str, args: Iterable = ()) -> int:
        """Delete the measurements matching `where` (over `measurements`), then kernels and
        devices left without any; one transaction. Returns how many measurements went."""
        con = self.con
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                cur = con.execute(f"DELETE FROM measurements WHERE {where}", tuple(args))
                gone = cur.rowcount
                con.execute(
                    "DELETE FROM kernels WHERE id NOT IN (SELECT kernel_id FROM measurements)"
                )
                con.execute(
                    "DELETE FROM devices WHERE id NOT IN (SELECT device_id FROM measurements)"
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise _unavailable(self.path, e) from None
        self._devices.clear()
        self._kernels.clear()
        return gone


def _measurement(r: tuple) -> Measurement:
    kernel = KernelInfo(r[0], r[1], r[2], json.loads(r[3]))
    device = DeviceInfo(r[4], r[5], json.loads(r[6]))
    return Measurement(kernel, device, r[7], r[8], json.loads(r[9]), *r[10:])


def _check_header(path: str) -> None:
    """Refuse, before sqlite touches it, a file that is not an SQLite database (sqlite would
    not overwrite it either, but would leave side files beside it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except IsADirectoryError:
        raise DatabaseUnavailable(f"'{path}' is a directory, not a measurement database") from None
    except OSError as e:
        raise DatabaseUnavailable(f"cannot read '{path}': {e.strerror}") from None
    if head and head != SQLITE_HEADER:
        raise DatabaseUnavailable(
            f"'{path}' is not an SQLite database (corrupt or another kind of file); it is left "
            f"as it is"
        )


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(os.path.abspath(path))


def _connect(target: str, path: str, uri: bool = False) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(
            target, timeout=BUSY_TIMEOUT_S, isolation_level=None, uri=uri, check_same_thread=False
        )
        con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    except sqlite3.Error as e:
        raise _unavailable(path, e) from None
    return con


def _unavailable(path: str, e: sqlite3.Error) -> DatabaseUnavailable:
    reason = str(e) or type(e).__name__
    return DatabaseUnavailable(f"cannot use measurement database '{path}': {reason}")

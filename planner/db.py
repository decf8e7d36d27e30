"""The measurement database: every kernel timing tgc has taken, in one sqlite3 file.

Tables (schema version in `PRAGMA user_version`, upgraded by `MIGRATIONS`):

- `devices`: what a timing was taken on, as a *fingerprint* (a hash of its description: the CPU
  model, numpy and its BLAS for the numpy backend; the GPU name, compute capability, driver and
  CUDA version for a GPU backend; tgc's version for all). A record is used only on a device with
  the same fingerprint.
- `kernels`: name, backend, *source hash* (the kernel's code and reference graphs: a changed
  kernel is a new row, its old timings are not used) and its parameter domains.
- `measurements`: kernel, device, the instance (operand and result types, parameters, op
  attributes), bytes and flops moved, then either a time (median, min, spread, runs) with the
  error against float64, or a failure with its message; when, and what took it (profile, tune,
  import). One row per instance and device: measuring again replaces it.

Writers use WAL mode and a busy timeout, so several profilers can write at once, and commit one
measurement per transaction, so a killed profiler loses at most the one in flight. A file that
is not an SQLite database, one that belongs to something else, or one written by a newer tgc is
reported in one line (`DatabaseUnavailable`) and never written to, renamed or deleted.

Where the file is: `--db PATH`, else the environment variable `TGC_DB`, else
`measurements.sqlite` in the user cache directory (`platformdirs`). The choice selects a data
file; it does not change what a pipeline means.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import platform
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Self

from tgc.diagnostics import TgcError
from tgc.planner.kernel import BACKEND_SPACE, Kernel

SCHEMA_VERSION = 2
DB_FILE = "measurements.sqlite"
BUSY_TIMEOUT_S = 60.0  # a writer waits this long for another writer's transaction
SQLITE_HEADER = b"SQLite format 3\x00"
OK, FAILED = "ok", "failed"
ORIGINS = ("profile", "tune", "import")


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


# MIGRATIONS[i] takes a database from version i to i + 1; a new file runs them all.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2]
assert len(MIGRATIONS) == SCHEMA_VERSION


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


# -- kernels and devices ----------------------------------------------------------------------------


@functools.cache
def kernel_info(kernel: Kernel) -> KernelInfo:
    """The kernel's database identity: its source hash covers its name, backend, op or
    reference texts, parameter domains, stated error and the code of `run` (and of the
    functions and op classes it closes over)."""
    parts = [
        kernel.name,
        kernel.backend,
        str(kernel.op),
        repr(kernel.reference_texts()),
        repr(sorted(kernel.params.items())),
        repr(kernel.max_rel_error),
        _code_text(kernel.run),
    ]
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]
    domains = {k: list(v) for k, v in kernel.params.items()}
    return KernelInfo(kernel.name, kernel.backend, digest, domains)


def _code_text(fn) -> str:
    if fn is None:
        return "None"
    parts = [_source(fn)]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(value):
            parts.append(_source(value))
        elif inspect.isclass(value) and callable(getattr(value, "reference", None)):
            parts.append(value.__qualname__ + _source(value.reference))
    return "\n".join(parts)


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return code.co_code.hex() if code is not None else repr(fn)


def device_backend(kernel: Kernel) -> str:
    """Whose fingerprint a kernel's timings belong to: its backend's; for a copy, that of the
    device end (a host <-> cuda copy is timed on the GPU machine)."""
    if kernel.op == "kernel.copy":
        from tgc.planner.options import COPY_KERNELS

        for (src, dst), name in COPY_KERNELS.items():
            if name == kernel.name:
                space = src or dst
                if space is not None:
                    return next(b for b, s in BACKEND_SPACE.items() if s == space)
    return kernel.backend


def _tgc_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tgc")
    except metadata.PackageNotFoundError:
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas() -> str:
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except Exception:  # noqa: BLE001  (older numpy: no dicts mode; the version still tells)
        return "unknown"


def cpu_description() -> dict:
    import numpy as np

    threads = {
        k: os.environ[k]
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
        if k in os.environ
    }
    return {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "numpy": np.__version__,
        "blas": _blas(),
        "threads": threads,
        "tgc": _tgc_version(),
    }


def cuda_description() -> dict:
    """The GPU (device 0) through PyCUDA, else through torch."""
    try:
        import pycuda.driver as drv

        drv.init()
        dev = drv.Device(0)
        gpu = {
            "gpu": dev.name(),
            "compute_capability": ".".join(map(str, dev.compute_capability())),
            "driver": drv.get_driver_version(),
            "cuda": ".".join(map(str, drv.get_version())),
        }
    except Exception:  # noqa: BLE001  (no PyCUDA: ask torch)
        import torch

        props = torch.cuda.get_device_properties(0)
        gpu = {
            "gpu": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
        }
    return {**gpu, "host": _cpu_model(), "tgc": _tgc_version()}


def _torch_version() -> str:
    import torch

    return torch.__version__


# backend -> its device description (how a timing's machine is recognised); a backend module may
# register a better one.
FINGERPRINTS: dict[str, Callable[[], dict]] = {
    "numpy": cpu_description,
    "torch-cpu": lambda: {**cpu_description(), "torch": _torch_version()},
    "cuda": cuda_description,
    "torch-cuda": lambda: {**cuda_description(), "torch": _torch_version()},
}


@functools.cache
def device_info(backend: str) -> DeviceInfo:
    describe = FINGERPRINTS.get(backend)
    if describe is None:
        raise LookupError(f"no device fingerprint is defined for backend '{backend}'")
    description = {"backend": backend, **describe()}
    text = json.dumps(description, sort_keys=True)
    return DeviceInfo(hashlib.sha256(text.encode()).hexdigest()[:16], backend, description)


def device_of(kernel: Kernel) -> DeviceInfo:
    return device_info(device_backend(kernel))

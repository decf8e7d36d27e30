"""Costs from the measurement database: measured where measured, estimated where not.

`DatabaseCostSource` answers the planner's `cost(kernel, operand_types, result_types, params)`:

1. **measured**: a record of this kernel (same source hash) on this device (same fingerprint)
   for exactly these types and parameters. Its median time, uncertainty its spread. A record of
   a *failure* (the kernel's result was wrong, or it raised) costs infinity: a kernel that
   computed a wrong answer is never chosen. Records differing only in op attributes (a
   transpose's permutation: the interface does not carry attributes) count by the slowest.
2. **estimated**: no record of these types, but the kernel has successful records on this
   device with these parameters and element types: a `Curve` over them predicts the time from
   the bytes moved and the flops (below), with its expected error as the uncertainty.
3. **roofline** (or any `fallback`): nothing measured for this kernel here.

A file that cannot be used (corrupt, another program's, newer schema, a table missing) is
reported once, in one line, and every cost comes from the fallback: tgc goes on with estimates.
A record with a damaged value (a time that is not a positive finite number, negative or
infinite bytes, a status that is neither) is skipped, said once per file; the curve refuses
points that are not finite, and its least squares answers zeros for a system that is not.

**The curve.** Time as a function of (bytes, flops) is `c0 + c1*bytes + c2*flops` (a fixed
cost, an inverse bandwidth, an inverse compute rate; non-negative), but the coefficients change
where real curves have knees (a cache level, a GPU filling up). So the fit is local: for a
query, the `NEIGHBOURS` measured points nearest in log(bytes), log(flops) are fitted by least
squares on relative error, nearer points weighing more (1 / (distance + 0.05)^2), rates kept
non-negative (every subset of the three terms is tried); between measured points the constant
may be negative (the tangent of a curve past a knee), beyond them it may not (extrapolation
follows the physical form). Its *expected error* is measured, not assumed: the median
relative error of predicting each measured point from the others (leave-one-out), grown by the
distance (in decades) from the query to the nearest measured point, so an extrapolation far
from the data says so. Curves are cached per kernel, device, parameters and element types.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tgc.planner.cost import Cost, CostSource, RooflineCostSource, kernel_flops
from tgc.planner.db import (
    FAILED,
    OK,
    SQLITE_ERRORS,
    Database,
    DatabaseUnavailable,
    DeviceInfo,
    KernelInfo,
    device_of,
    dtypes_of,
    kernel_info,
    params_text,
    resolve_path,
    signature_of,
)
from tgc.planner.kernel import Kernel
from tgc.types import TensorType

NEIGHBOURS = 4  # points in each local fit
MIN_ERROR = 0.02  # no curve is trusted beyond 2%
ONE_POINT_ERROR = 1.0  # one point scaled linearly: as unsure as the roofline


def instance_bytes(operand_types: Sequence[TensorType], result_types: Sequence[TensorType]):
    return float(sum(t.nbytes for t in operand_types) + sum(t.nbytes for t in result_types))


def instance_flops(kernel: Kernel, operand_types, result_types) -> float:
    if kernel.op == "kernel.copy":
        return 0.0
    return float(kernel_flops(kernel, tuple(operand_types), tuple(result_types)))


# -- the curve ------------------------------------------------------------------------------------


class Curve:
    """Measured (bytes, flops, seconds) points of one kernel on one device; `predict` gives the
    time at other (bytes, flops) and its expected relative error (module doc)."""

    def __init__(self, points: Sequence[tuple[float, float, float]]) -> None:
        if not points:
            raise ValueError("a curve needs at least one point")
        p = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        if not (np.all(np.isfinite(p)) and np.all(p[:, :2] >= 0) and np.all(p[:, 2] > 0)):
            raise ValueError("a curve's points need finite bytes and flops >= 0 and seconds > 0")
        self.bytes, self.flops, self.seconds = p[:, 0], p[:, 1], p[:, 2]
        self.logs = np.stack([np.log10(self.bytes + 1), np.log10(self.flops + 1)], axis=1)
        self._error: float | None = None

    def __len__(self) -> int:
        return len(self.seconds)

    def predict(self, nbytes: float, flops: float) -> tuple[float, float]:
        """(seconds, expected relative error) at the given bytes and flops."""
        seconds = self._fit_at(nbytes, flops, np.ones(len(self), dtype=bool))
        if len(self) < 3:
            return seconds, ONE_POINT_ERROR
        here = np.array([math.log10(nbytes + 1), math.log10(flops + 1)])
        nearest = float(np.min(np.linalg.norm(self.logs - here, axis=1)))
        return seconds, self.error * (1.0 + nearest)

    @property
    def error(self) -> float:
        """Median leave-one-out relative error (at least MIN_ERROR)."""
        if self._error is None:
            self._error = self._leave_one_out() if len(self) >= 3 else ONE_POINT_ERROR
        return self._error

    def _leave_one_out(self) -> float:
        errors = []
        for i in range(len(self)):
            keep = np.ones(len(self), dtype=bool)
            keep[i] = False
            guess = self._fit_at(self.bytes[i], self.flops[i], keep)
            with np.errstate(all="ignore"):
                errors.append(abs(guess - self.seconds[i]) / self.seconds[i])
        error = float(np.median(errors))
        return max(error, MIN_ERROR) if math.isfinite(error) else ONE_POINT_ERROR

    def _fit_at(self, nbytes: float, flops: float, keep: np.ndarray) -> float:
        idx = np.flatnonzero(keep)
        if len(idx) == 1:
            i = idx[0]
            ratios = [nbytes / self.bytes[i] if self.bytes[i] else 1.0]
            if self.flops[i]:
                ratios.append(flops / self.flops[i])
            with np.errstate(all="ignore"):
                seconds = float(self.seconds[i] * max(ratios))
            return seconds if 0 < seconds < math.inf else float(self.seconds[i])
        here = np.array([math.log10(nbytes + 1), math.log10(flops + 1)])
        dist = np.linalg.norm(self.logs[idx] - here, axis=1)
        order = np.argsort(dist, kind="stable")[:NEIGHBOURS]
        near, d = idx[order], dist[order]
        columns = np.stack([np.ones(len(near)), self.bytes[near], self.flops[near]], axis=1)
        # relative error, the nearest points weighing most
        weight = 1.0 / (self.seconds[near] * (d + 0.05) ** 2)
        # Between measured points the line is a local tangent (its constant may be negative:
        # past a knee the slope is steeper); outside them it is extrapolated as physics says,
        # a non-negative fixed cost plus work over rates.
        inside = bool(np.all(here >= self.logs[near].min(axis=0) - 1e-12)) and bool(
            np.all(here <= self.logs[near].max(axis=0) + 1e-12)
        )
        with np.errstate(all="ignore"):
            coef = nonnegative_lstsq(
                columns * weight[:, None], self.seconds[near] * weight, free_first=inside
            )
            seconds = float(coef @ np.array([1.0, nbytes, flops]))
        return seconds if 0 < seconds < math.inf else float(self.seconds[near].min())


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray, free_first: bool = False) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0 (x[0] free with `free_first`), for a handful of columns:
    the best unconstrained solution over every subset of columns that satisfies the bounds.
    A system that is not finite (or overflows when scaled) has no solution here: zeros."""
    n = a.shape[1]
    best = np.zeros(n)
    with np.errstate(all="ignore"):
        scale = np.max(np.abs(a), axis=0)
        scale[scale == 0] = 1.0
        a = a / scale  # bytes and flops are 1e9 times the constant column: keep lstsq conditioned
        best_residual = float(np.sum(b * b))
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and math.isfinite(best_residual)):
        return best
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = a[:, cols]
            if not np.any(sub):
                continue
            try:
                x, *_ = np.linalg.lstsq(sub, b, rcond=None)
            except np.linalg.LinAlgError:
                continue
            if not np.all(np.isfinite(x)):
                continue
            if any(v < 0 and not (free_first and c == 0) for v, c in zip(x, cols)):
                continue
            residual = float(np.sum((sub @ x - b) ** 2))
            if residual < best_residual * (1 - 1e-12):
                best = np.zeros(n)
                best[list(cols)] = x
                best_residual = residual
    return best / scale


# -- the database as a cost source -----------------------------------------------------------------


_WARNED: set[str] = set()
_DAMAGE_TOLD: set[str] = set()  # files whose damaged records were said


def _warn(message: str) -> None:
    """One line on stderr, once per process and message (a pass runs once per function)."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr)


def _usable_time(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf


def _usable_amount(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf


class DatabaseCostSource:
    """The planner's costs from a measurement database (module doc). `path` None: the default
    database (`TGC_DB` or the user cache). The file is opened for reading only; a missing file
    means no measurements. A file that cannot be used is said once and the fallback answers;
    a record with a damaged value (a time that is not a positive number, a status that is
    neither) is skipped, said once per file. With `device_time` a kernel timed on a device
    costs the device's time alone (`Database.time_column`): the costs of a plan replayed as a
    CUDA graph, whose kernels are launched without the host."""

    def __init__(
        self,
        path: str | None = None,
        fallback: CostSource | None = None,
        database: Database | None = None,
        warn: Callable[[str], None] = _warn,
        device_time: bool = False,
    ) -> None:
        self.path = resolve_path(path) if database is None else database.path
        self.device_time = device_time
        self.fallback = fallback or RooflineCostSource()
        self.warn = warn
        self.problem: str | None = None  # why the database is not used
        self.damaged: str | None = None  # the first damaged record skipped
        self._db = database
        self._opened = database is not None
        self._curves: dict[tuple, Curve | None] = {}

    @property
    def db(self) -> Database | None:
        if not self._opened:
            self._opened = True
            try:
                self._db = Database.open(self.path, readonly=True)
            except DatabaseUnavailable as e:
                if "no measurement database at" not in e.message:
                    self.give_up(e.message)
        return self._db

    def give_up(self, message: str) -> None:
        """Plan without the database from now on, saying why (once)."""
        if self.problem is None:
            self.warn(f"{message}; using estimates without it")
        self.problem = message
        self._db = None

    _give_up = give_up

    def _skip(self, what: str) -> None:
        """A damaged record is skipped; the first one of a file is said."""
        if self.damaged is None:
            self.damaged = what
            if self.path in _DAMAGE_TOLD:
                return
            _DAMAGE_TOLD.add(self.path)
            self.warn(
                f"measurement database '{self.path}' has damaged records (first: {what}); they "
                f"are skipped"
            )

    def cost(
        self,
        kernel: Kernel,
        operand_types: Sequence[TensorType],
        result_types: Sequence[TensorType],
        params: Mapping,
    ) -> Cost:
        db = self.db
        if db is not None:
            try:
                found = self._lookup(db, kernel, operand_types, result_types, params)
            except (*SQLITE_ERRORS, DatabaseUnavailable) as e:
                self.give_up(_reason(self.path, e))
                found = None
            if found is not None:
                return found
        return self.fallback.cost(kernel, operand_types, result_types, params)

    def _keys(self, kernel: Kernel) -> tuple[KernelInfo, DeviceInfo] | None:
        """The kernel's and its device's identities (looked up by key on every read: row ids
        may be reused after a prune)."""
        try:
            device = device_of(kernel)
        except Exception:  # noqa: BLE001  (a backend whose device cannot be described here)
            return None
        return kernel_info(kernel), device

    def _lookup(self, db, kernel, operand_types, result_types, params) -> Cost | None:
        keys = self._keys(kernel)
        if keys is None:
            return None
        signature = signature_of(operand_types, result_types)
        wanted = params_text(dict(params))
        rows = [r for r in self._instance_rows(db, keys, signature) if r[0] == wanted]
        if rows:
            if any(r[2] == FAILED for r in rows):
                return Cost(math.inf, "measured", 0.0)
            slowest = max(rows, key=lambda r: r[3])
            return Cost(slowest[3], "measured", slowest[4] or 0.0)
        curve = self.curve(db, keys, wanted, dtypes_of(operand_types, result_types))
        if curve is None:
            return None
        seconds, error = curve.predict(
            instance_bytes(operand_types, result_types),
            instance_flops(kernel, operand_types, result_types),
        )
        return Cost(seconds, "estimated", error)

    def _instance_rows(self, db: Database, keys, signature: str) -> list[tuple]:
        """(params, attrs_key, status, median, spread) of an instance's usable records."""
        out = []
        for r in db.instance_records(*keys, signature, self.device_time):
            params, _, status, median, spread = r
            if status == FAILED:
                out.append(r)
            elif status != OK:
                self._skip(f"{keys[0].name} {signature}: status {status!a}")
            elif not _usable_time(median):
                self._skip(f"{keys[0].name} {signature}: median {median!a}")
            elif spread is not None and not _usable_amount(spread):
                self._skip(f"{keys[0].name} {signature}: spread {spread!a}")
            else:
                out.append(r)
        return out

    def curve(self, db: Database, keys: tuple, params: str, dtypes: str) -> Curve | None:
        kernel, device = keys
        key = (kernel.name, kernel.source_hash, device.fingerprint, params, dtypes)
        if key not in self._curves:
            points = []
            for b, f, t in db.curve_records(kernel, device, params, dtypes, self.device_time):
                if _usable_amount(b) and _usable_amount(f) and _usable_time(t):
                    points.append((b, f, t))
                else:
                    self._skip(f"{kernel.name} {dtypes}: bytes {b!a}, flops {f!a}, median {t!a}")
            self._curves[key] = Curve(points) if points else None
        return self._curves[key]

    def tuned_params(self, kernel: Kernel, operand_types, result_types) -> dict | None:
        """The parameters with the fastest successful record of exactly this instance here
        (None: nothing measured; the planner then uses the defaults)."""
        db = self.db
        if db is None or not kernel.params:
            return None
        try:
            keys = self._keys(kernel)
            if keys is None:
                return None
            rows = self._instance_rows(db, keys, signature_of(operand_types, result_types))
        except (*SQLITE_ERRORS, DatabaseUnavailable) as e:
            self.give_up(_reason(self.path, e))
            return None
        return best_params(kernel, rows)


def _reason(path: str, e: Exception) -> str:
    if isinstance(e, DatabaseUnavailable):
        return e.message
    return f"cannot read measurement database '{path}': {' '.join(str(e).split())}"


def best_params(kernel: Kernel, rows: list[tuple]) -> dict | None:
    """The fastest parameters among (params, attrs_key, status, median, spread) rows; a point
    with any failed record is out, and so is one outside the kernel's current domains (or with
    parameters that are not a JSON object, or no usable time)."""
    import json

    failed = {r[0] for r in rows if r[2] == FAILED}
    slowest: dict[str, float] = {}
    for params, _, status, median, _ in rows:
        if params not in failed and status == OK and _usable_time(median):
            slowest[params] = max(slowest.get(params, 0.0), median)
    best = None
    for text, seconds in sorted(slowest.items(), key=lambda kv: (kv[1], str(kv[0]))):
        try:
            params = json.loads(text)
        except (TypeError, ValueError, RecursionError):
            continue
        if not isinstance(params, dict):
            continue
        if set(params) == set(kernel.params) and all(
            v in kernel.params[k] for k, v in params.items()
        ):
            best = params
            break
    return best

"""Whole-plan times in the measurement database: the table `plan_times` (schema 4,
planner/db_schema.py), read and written here for planner/plan_memory.py and tgc-db.

A row is one candidate plan of one function on one device (`PlanTime`): the function by its
canonical hash, the plan by the hash of the kernels it calls (and the kernels themselves, which
`tgc-db prune` judges a plan stale by), its time or why it did not run, and whether it was the
one chosen. The rows of one function and device are written together, replacing the earlier
ones, in one transaction (`remember`); `tgc-db import` merges them beside the measurements, in
the same transaction (`merge`). The same promises hold as for measurements (planner/db.py):
devices are looked up by fingerprint inside each write, every value is checked
(`plan_time_problem`) before it is written or imported, and a damaged row is refused in one
line by the reads here (`plan_times`): the route then takes nothing as remembered and times
the plans again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from tgc.planner.db import (
    MAX_JSON_DEPTH,
    Database,
    _json_object,
    _shown,
    json_depth,
    measurement_problem,
    non_negative,
    positive,
)
from tgc.planner.db_schema import (
    FAILED,
    OK,
    PLAN_ORIGINS,
    PLAN_TIMES_SINCE,
    DeviceInfo,
    Measurement,
    PlanTime,
)

MAX_PLAN_KERNELS = 100_000  # kernels a plan may name (a 12-layer model's plan calls hundreds)


def plan_time_problem(p: PlanTime) -> str | None:
    """What makes `p` unfit to store or use (None: nothing), by the rules measurements follow
    (planner/db.py `measurement_problem`)."""
    for what, v in (
        ("function hash", p.function_hash),
        ("candidate", p.candidate),
        ("plan hash", p.plan_hash),
        ("device fingerprint", p.device.fingerprint),
        ("device backend", p.device.backend),
    ):
        if not isinstance(v, str) or not v:
            return f"{what} is {_shown(v)}, not a name"
    if not isinstance(p.device.description, dict):
        return f"device description is {_shown(p.device.description)}, not a JSON object"
    if json_depth(p.device.description) > MAX_JSON_DEPTH:
        return f"device description nests deeper than {MAX_JSON_DEPTH}"
    problem = _kernels_problem(p.kernels)
    if problem is not None:
        return problem
    if p.status not in (OK, FAILED):
        return f"status is {_shown(p.status)}, not '{OK}' or '{FAILED}'"
    if p.origin not in PLAN_ORIGINS:
        return f"origin is {_shown(p.origin)}, not one of {', '.join(PLAN_ORIGINS)}"
    if (p.ok or p.median is not None) and not positive(p.median):  # a time is positive
        return f"median is {_shown(p.median)}, not a positive finite number of seconds"
    if p.spread is not None and not non_negative(p.spread):
        return f"spread is {_shown(p.spread)}, not a finite number >= 0"
    if p.runs is not None and (
        not isinstance(p.runs, int) or isinstance(p.runs, bool) or not 0 < p.runs < 2**53
    ):
        return f"runs is {_shown(p.runs)}, not a positive integer"
    for what in ("noisy", "chosen"):
        if not isinstance(getattr(p, what), bool):
            return f"{what} is {_shown(getattr(p, what))}, not true or false"
    if p.chosen and not p.ok:
        return "a plan that did not run is marked chosen"
    if p.message is not None and not isinstance(p.message, str):
        return f"message is {_shown(p.message)}, not text"
    if not non_negative(p.created):
        return f"created is {_shown(p.created)}, not a time"
    return None


def _kernels_problem(kernels) -> str | None:
    if not isinstance(kernels, list):
        return f"kernels is {_shown(kernels)}, not a list"
    if len(kernels) > MAX_PLAN_KERNELS:
        return f"kernels lists {len(kernels)} kernels (at most {MAX_PLAN_KERNELS})"
    for k in kernels:
        if not (isinstance(k, list) and len(k) == 3 and all(isinstance(x, str) and x for x in k)):
            return f"kernels holds {_shown(k)}, not [name, backend, source hash]"
    return None


def _label(p: PlanTime) -> str:
    text = f"function {p.function_hash} {p.candidate}"
    return text if text.isprintable() else ascii(text)


# -- writing --------------------------------------------------------------------------------------


def remember(db: Database, function_hash: str, device: DeviceInfo, plans: list[PlanTime]) -> None:
    """Store the candidate plans of one function on one device, replacing its earlier rows, in
    one transaction. A bad value is a ValueError (a bug in the caller), and nothing is
    stored."""
    for p in plans:
        problem = plan_time_problem(p)
        if problem is not None:
            raise ValueError(f"plan time of {_label(p)}: {problem}")
        if (p.function_hash, p.device.fingerprint) != (function_hash, device.fingerprint):
            raise ValueError(f"plan time of {_label(p)}: of another function or device")

    def change() -> None:
        device_id = db._device_row(device)
        db.con.execute(
            "DELETE FROM plan_times WHERE function_hash = ? AND device_id = ?",
            (function_hash, device_id),
        )
        for p in plans:
            _insert(db, p, keep_newer=False)

    db._transaction(change)


def merge(db: Database, measurements: list[Measurement], plans: list[PlanTime]) -> tuple[int, int]:
    """`tgc-db import`: store measurements and plan times in one transaction, each replacing a
    row of the same key only when newer. Returns how many of each were stored."""
    for m in measurements:
        problem = measurement_problem(m)
        if problem is not None:
            raise ValueError(f"measurement of {m.kernel.name}: {problem}")
    for p in plans:
        problem = plan_time_problem(p)
        if problem is not None:
            raise ValueError(f"plan time of {_label(p)}: {problem}")

    def change() -> tuple[int, int]:
        stored = sum(db._insert(m, True) for m in measurements)
        return stored, sum(_insert(db, p, keep_newer=True) for p in plans)

    return db._transaction(change)


def _insert(db: Database, p: PlanTime, keep_newer: bool) -> bool:
    # The device is found by its fingerprint inside this transaction (a prune may have
    # deleted an id read before it).
    device_id = db._device_row(p.device)
    guard = "WHERE excluded.created > plan_times.created" if keep_newer else ""
    cur = db.con.execute(
        f"""
        INSERT INTO plan_times (function_hash, device_id, candidate, plan_hash, kernels, status,
            median, spread, runs, noisy, chosen, message, created, origin)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (function_hash, device_id, candidate) DO UPDATE SET
            plan_hash = excluded.plan_hash, kernels = excluded.kernels, status = excluded.status,
            median = excluded.median, spread = excluded.spread, runs = excluded.runs,
            noisy = excluded.noisy, chosen = excluded.chosen, message = excluded.message,
            created = excluded.created, origin = excluded.origin
        {guard}
        """,
        (
            p.function_hash,
            device_id,
            p.candidate,
            p.plan_hash,
            json.dumps(p.kernels, separators=(",", ":")),
            p.status,
            p.median,
            p.spread,
            p.runs,
            int(p.noisy),
            int(p.chosen),
            p.message,
            p.created,
            p.origin,
        ),
    )
    return cur.rowcount > 0


def delete_plans(db: Database, where: str | Callable[[Database], tuple[str, list]]) -> int:
    """Delete the plan times matching `where` (over `plan_times`; a function of the database
    giving (condition, args) is called inside the transaction), then devices left without any
    record. Returns how many went."""
    con = db.con

    def change() -> int:
        condition, values = where(db) if callable(where) else (where, [])
        if not condition:
            return 0
        gone = con.execute(f"DELETE FROM plan_times WHERE {condition}", tuple(values))
        con.execute(
            "DELETE FROM devices WHERE id NOT IN (SELECT device_id FROM measurements) "
            "AND id NOT IN (SELECT device_id FROM plan_times)"
        )
        return gone.rowcount

    return db._transaction(change)


# -- reading: strict (tgc-db, and the route's recall, which then takes nothing) -------------------


def has_plan_times(db: Database) -> bool:
    return db.version >= PLAN_TIMES_SINCE


def count_plans(db: Database, where: str, args: Iterable = ()) -> int:
    if not has_plan_times(db):
        return 0
    return db._read(f"SELECT COUNT(*) FROM plan_times WHERE {where}", args)[0][0]


def plan_times(db: Database, where: str = "", args: Iterable = ()) -> list[PlanTime]:
    """Plan times joined with their device, filtered by an SQL condition over `p.` (plan_times)
    and `d.` (devices), with their row ids. A damaged row is a DatabaseUnavailable."""
    return [p for _, p in plan_rows(db, where, args)]


def plan_rows(db: Database, where: str = "", args: Iterable = ()) -> list[tuple[int, PlanTime]]:
    """(row id, PlanTime) of `plan_times` (see there)."""
    if not has_plan_times(db):
        return []
    sql = f"""
        SELECT p.id, p.function_hash, d.fingerprint, d.backend, d.description, p.candidate,
            p.plan_hash, p.kernels, p.status, p.median, p.spread, p.runs, p.noisy, p.chosen,
            p.message, p.created, p.origin
        FROM plan_times p JOIN devices d ON d.id = p.device_id
        {"WHERE " + where if where else ""}
        ORDER BY p.function_hash, d.fingerprint, p.candidate
    """
    out = []
    for r in db._read(sql, args):
        try:
            p = _plan_time(r[1:])
        except ValueError as e:
            raise db._damaged(f"plan time {r[0]}: {e}") from None
        problem = plan_time_problem(p)
        if problem is not None:
            raise db._damaged(f"plan time {r[0]} ({_label(p)}): {problem}")
        out.append((r[0], p))
    return out


def _plan_time(r: tuple) -> PlanTime:
    """A row of `plan_rows` as a PlanTime; ValueError for JSON that does not parse."""
    try:
        description = _json_object(r[3])
    except ValueError as e:
        raise ValueError(f"device description {e}") from None
    try:
        kernels = json.loads(r[6]) if isinstance(r[6], str) else r[6]
    except (ValueError, RecursionError):
        raise ValueError("kernels is not valid JSON") from None
    flags = [bool(v) if v in (0, 1) and not isinstance(v, float) else v for v in r[11:13]]
    return PlanTime(
        r[0], DeviceInfo(r[1], r[2], description), r[4], r[5], kernels, r[7], *r[8:11], *flags,
        *r[13:],
    )  # fmt: skip

"""tgc-db's handling of whole-plan times (planner/db_plans.py): how `list` shows them, how
`export` writes and `import` reads them (checked like measurements: a bad one names itself and
nothing is imported), and which ones `prune` deletes."""

from __future__ import annotations

import time
from collections.abc import Callable

from tgc.diagnostics import TgcError

GENERATED = "generated"  # planner/plan_memory.py: a generated kernel's source, never stale here
PLAN_FIELDS = (
    "function_hash",
    "candidate",
    "plan_hash",
    "kernels",
    "status",
    "median",
    "spread",
    "runs",
    "noisy",
    "chosen",
    "message",
    "created",
    "origin",
)


# -- list -------------------------------------------------------------------------------------------


def plan_lines(plans: list, number: dict[str, int]) -> list[str]:
    """One line per function and device: each candidate's time, which one ran, which are
    noisy and which did not run."""
    groups: dict[tuple[str, str], list] = {}
    for p in plans:
        groups.setdefault((p.function_hash, p.device.fingerprint), []).append(p)
    lines = []
    for (function, fingerprint), ps in sorted(groups.items()):
        shown = []
        for p in ps:
            if not p.ok:
                shown.append(f"{p.candidate} did not run")
                continue
            marks = [m for m, on in (("chosen", p.chosen), ("noisy", p.noisy)) if on]
            shown.append(
                f"{p.candidate} {p.median * 1e3:.4f} ms" + "".join(f" ({m})" for m in marks)
            )
        lines.append(
            f"  plans of function {function[:16]}  device {number[fingerprint]}: {', '.join(shown)}"
        )
    return lines


# -- export, import ---------------------------------------------------------------------------------


def export_plans(plans: list, devices: dict[str, dict]) -> list[dict]:
    """The plan times as JSON records (their devices added to `devices`)."""
    out = []
    for p in plans:
        devices[p.device.fingerprint] = {
            "fingerprint": p.device.fingerprint,
            "backend": p.device.backend,
            "description": p.device.description,
        }
        record = {k: getattr(p, k) for k in PLAN_FIELDS}
        record["device"] = p.device.fingerprint
        out.append(record)
    return out


def import_plans(data: dict, devices: dict, bad: Callable[[str], TgcError]) -> list:
    """The PlanTimes of an export's optional "plans" list, each checked
    (`plan_time_problem`); `bad(what)` makes the error that names the first bad one."""
    from tgc.planner.db_plans import plan_time_problem
    from tgc.planner.db_schema import PlanTime

    records = data.get("plans", [])
    if not isinstance(records, list):
        raise bad('"plans" is not a list')
    out = []
    for i, r in enumerate(records):
        try:
            if not isinstance(r, dict):
                raise TypeError("not a JSON object")
            unknown = sorted(set(r) - {*PLAN_FIELDS, "device"})
            if unknown:
                raise ValueError(f"unknown field {_shown(unknown[0])}")
            if not isinstance(r.get("device"), str) or r["device"] not in devices:
                raise ValueError(
                    f"device {_shown(r.get('device'))} is not among the file's devices"
                )
            fields = {k: r[k] for k in PLAN_FIELDS if k in r}
            p = PlanTime(device=devices[r["device"]], **fields)
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"plan time {i}: {_error(e)}") from None
        problem = plan_time_problem(p)
        if problem is not None:
            raise bad(f"plan time {i} ({_shown(p.candidate)[1:-1]}): {problem}")
        p.origin = "import"
        out.append(p)
    return out


def _shown(value) -> str:
    text = ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _error(e: Exception) -> str:
    text = " ".join(str(e).split())
    if isinstance(e, TypeError) and "missing" in text and "argument" in text:
        return "no " + text.rsplit(":", 1)[-1].strip()  # a field the record lacks
    return text if text.isprintable() else ascii(text)


# -- prune ------------------------------------------------------------------------------------------


def prune_condition(db, args, here: tuple[set[str], set[tuple[str, str]]]) -> tuple[str, list]:
    """The plan times `prune` deletes (over `plan_times`), read inside its transaction: those
    naming a kernel version that no longer exists here (of a backend loaded here), and with
    `--failures`, `--noisy`, `--older-than` and `--plans` the failed, the noisy, the old and
    every one."""
    from tgc.planner.db_plans import plan_rows

    if getattr(args, "plans", False):
        return "1", []
    backends, current = here
    stale = [
        i
        for i, p in plan_rows(db)
        if any(
            b in backends and source != GENERATED and (name, source) not in current
            for name, b, source in p.kernels
        )
    ]
    conditions, values = [], []
    if stale:
        conditions.append(f"id IN ({','.join('?' * len(stale))})")
        values += stale
    if args.failures:
        conditions.append("status = 'failed'")
    if args.noisy:
        conditions.append("noisy = 1")
    if args.older_than is not None:
        conditions.append("created < ?")
        values.append(time.time() - args.older_than * 86400)
    return " OR ".join(conditions), values

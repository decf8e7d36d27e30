"""Whole-plan choices, remembered (issue 22, item 3): the GPU route times its candidate plans
whole (planner/route.py, step 5) and records every candidate's time, and which one ran, in the
measurement database, so that a later compile of the same function takes the same choice
without timing the plans again.

Keys. A choice is kept per function and device: the function by its canonical hash
(planner/blocks.py `function_hash`: its computation, not its name or value names) and the
device by its fingerprint (`plan_device`: the GPU's, with PyTorch's version where its kernels
can be in a plan). Each candidate (`planned`, `library`, `default`) is recorded with its plan's
hash (`plan_hash`: the kernels it calls and their parameters, in order, with the source hashes
of the registered ones); the cost annotations select-kernels writes on each call (`plan.seconds`,
`plan.source`) are left out, since they change with every measurement while the plan that runs
does not.

A choice is taken from memory (`PlanMemory.recall`) only when the candidates are the same plans
as when it was made (the same names, each with the same plan hash), exactly one of them was
chosen, and no time among them is noisy (its spread stayed large however often it was taken:
a comparison that noisy is not trusted twice). Anything else (a plan changed because the
database learnt something, a new candidate, a damaged row, another device) times the plans
again, and the new times replace the function's rows (`PlanMemory.remember`). `--no-measure`
(`RouteOptions.measure` False) reads a remembered choice but writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.planner.db import Database, DatabaseUnavailable, DeviceInfo, device_info, kernel_info
from tgc.planner.db_plans import plan_times, remember
from tgc.planner.db_schema import FAILED, OK, PlanTime
from tgc.planner.profile import MIN_SECONDS, Timing

# The annotations select-kernels writes on a call that say what it was expected to cost: they
# change whenever the database learns something, while the plan that runs stays the same.
_COST_ANNOTATION = re.compile(r'plan\.(?:seconds|source) = (?:"[^"]*"|[^,}]*)(?:, )?')
GENERATED = "generated"  # a generated kernel's source: its region, which the plan text holds


@dataclass(frozen=True)
class PlanIdentity:
    """What tells one candidate plan from another: `plan_hash`, and the kernels it calls, each
    once, as [name, backend, source hash] (what `tgc-db prune` judges a plan stale by)."""

    plan_hash: str
    kernels: tuple[tuple[str, str, str], ...]


@dataclass
class Recalled:
    """A remembered choice: the candidate chosen, the times (seconds) of those that ran, and
    why the others did not run."""

    chosen: str
    times: dict[str, float]
    failures: dict[str, str]


def identify(func: FuncOp) -> PlanIdentity:
    """The identity of the planned function `func` (module doc)."""
    from tgc.printer import print_op

    kernels = _kernels(func)
    text = "\n".join(_COST_ANNOTATION.sub("", print_op(op)) for op in func.body.ops)
    text += "\n" + json.dumps(kernels)
    return PlanIdentity(hashlib.blake2b(text.encode(), digest_size=16).hexdigest(), kernels)


def _kernels(func: FuncOp) -> tuple[tuple[str, str, str], ...]:
    from tgc.dialects.kernel import CallOp
    from tgc.planner.backends import TEMPLATES
    from tgc.planner.kernel import KERNELS
    from tgc.planner.options import copy_kernel

    found: set[tuple[str, str, str]] = set()
    for op in func.body.ops:
        kernel = None
        if isinstance(op, CallOp):
            callee = op.attr("callee")
            kernel = KERNELS.get(callee)
            template = TEMPLATES.get(callee)
            if kernel is None and template is not None:
                found.add((template.name, template.backend, GENERATED))
        elif op.name == "kernel.copy":
            kernel = copy_kernel(op.operands[0].type.encoding, op.results[0].type.encoding)
        if kernel is not None:
            found.add((kernel.name, kernel.backend, kernel_info(kernel).source_hash))
    return tuple(sorted(found))


def plan_device() -> DeviceInfo:
    """The device whole-plan times belong to: the GPU's fingerprint, PyTorch's version in it
    where PyTorch's GPU kernels are loaded (its kernels are candidates then)."""
    from tgc.planner.backends import BACKENDS

    return device_info("torch-cuda" if "torch-cuda" in BACKENDS else "cuda")


class PlanMemory:
    """The whole-plan times of one function on this device in the database at `path`
    (`write`: record new ones)."""

    def __init__(self, path: str, function_hash: str, device: DeviceInfo, write: bool) -> None:
        self.path, self.function_hash, self.device, self.write = path, function_hash, device, write

    def recall(self, candidates: dict[str, PlanIdentity]) -> Recalled | None:
        """The choice remembered among these candidate plans (module doc), or None."""
        try:
            with Database.open(self.path, readonly=True) as db:
                rows = plan_times(
                    db,
                    "p.function_hash = ? AND d.fingerprint = ?",
                    (self.function_hash, self.device.fingerprint),
                )
        except DatabaseUnavailable:  # no file, or a damaged row: time the plans again
            return None
        recorded = {r.candidate: r.plan_hash for r in rows}
        if not rows or recorded != {k: c.plan_hash for k, c in candidates.items()}:
            return None
        chosen = [r.candidate for r in rows if r.chosen]
        if len(chosen) != 1 or any(r.noisy for r in rows):
            return None
        return Recalled(
            chosen[0],
            {r.candidate: r.median for r in rows if r.ok},
            {r.candidate: r.message or "" for r in rows if not r.ok},
        )

    def remember(
        self,
        candidates: dict[str, PlanIdentity],
        timings: dict[str, Timing],
        failures: dict[str, str],
        chosen: str,
    ) -> str | None:
        """Record the candidates' times (replacing the function's earlier rows); None, or a note
        saying why nothing was recorded."""
        if not self.write or chosen not in timings:
            return None
        rows = []
        for name, plan in candidates.items():
            common = {
                "function_hash": self.function_hash,
                "device": self.device,
                "candidate": name,
                "plan_hash": plan.plan_hash,
                "kernels": [list(k) for k in plan.kernels],
            }
            if name in timings:
                t = timings[name]
                rows.append(
                    PlanTime(
                        **common,
                        status=OK,
                        median=max(t.median, MIN_SECONDS),  # a time is positive
                        spread=t.spread,
                        runs=t.runs,
                        noisy=t.noisy,
                        chosen=name == chosen,
                    )
                )
            else:
                message = failures.get(name, "it did not run")
                rows.append(PlanTime(**common, status=FAILED, message=message))
        try:
            with Database.open(self.path) as db:
                remember(db, self.function_hash, self.device, rows)
        except DatabaseUnavailable as e:
            return f"whole-plan times not recorded: {e.message}"
        return None

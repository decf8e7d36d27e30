"""Tuning: search a kernel's parameters for each instance, storing every point measured.

For an instance whose kernel has parameters (`Kernel.params`: name -> domain, the first value
the default), an evolutionary search, Ansor-lite: the default point first, then, while time and
points are left, a child of one of the best points so far (one parameter moved to another value
of its domain) or, one time in four and whenever nothing has been measured, a random point.
Points the kernel's `param_constraints` refuse on these types are skipped without running;
points already recorded are not measured again. Each point is a measurement like any other:
checked against float64 first (a wrong point is recorded as a failure and never wins), then
timed, and committed on its own (`origin` "tune").

select-kernels then runs each instance with its fastest measured point (the database cost
source's `tuned_params`); an instance never tuned runs with the defaults.

The search is seeded by the instance (its kernel and types), so a run is repeatable given the
same timings; it stops at the profiler's budget, after MAX_POINTS points per instance, or when
MAX_MISSES candidates in a row were known or refused (the space is exhausted).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from typing import TYPE_CHECKING

from tgc.planner.db import OK, params_text
from tgc.planner.profile import Instance, Report, unknown

if TYPE_CHECKING:
    from tgc.planner.profile import Profiler

MAX_POINTS = 32  # measured points per instance
MAX_MISSES = 200  # candidates in a row that were known or refused: the space is exhausted
PARENTS = 3  # children come from the best few points
RANDOM_SHARE = 0.25


def refused(inst: Instance, params: dict) -> str | None:
    """Why the kernel cannot run `params` on the instance's types (None: it can)."""
    return inst.kernel.param_constraints((inst.operand_types, inst.result_types), params)


def random_point(inst: Instance, rng: random.Random) -> dict:
    return {k: rng.choice(domain) for k, domain in inst.kernel.params.items()}


def mutate(point: dict, inst: Instance, rng: random.Random) -> dict:
    """`point` with one parameter (of a domain with a choice) moved to another value."""
    free = [k for k, domain in inst.kernel.params.items() if len(domain) > 1]
    if not free:
        return dict(point)
    name = rng.choice(free)
    others = [v for v in inst.kernel.params[name] if v != point[name]]
    return {**point, name: rng.choice(others)}


def _seed(inst: Instance) -> int:
    return int(hashlib.sha256(repr(inst.key()).encode()).hexdigest()[:12], 16)


class Search:
    """The search state of one instance: the points measured (params text -> seconds, inf for
    a failure) and the candidates to try."""

    def __init__(self, inst: Instance, measured: dict[str, float]) -> None:
        self.inst = inst
        self.measured = dict(measured)
        self.refused: set[str] = set()
        self.rng = random.Random(_seed(inst))

    def candidate(self) -> dict | None:
        """The next point to measure, or None when MAX_MISSES tries found nothing new."""
        default = self.inst.kernel.default_params
        if params_text(default) not in self.measured and refused(self.inst, default) is None:
            return default
        for _ in range(MAX_MISSES):
            point = self._propose()
            text = params_text(point)
            if text in self.measured or text in self.refused:
                continue
            if refused(self.inst, point) is not None:
                self.refused.add(text)
                continue
            return point
        return None

    def _propose(self) -> dict:
        good = sorted((s, t) for t, s in self.measured.items() if math.isfinite(s))
        if not good or self.rng.random() < RANDOM_SHARE:
            return random_point(self.inst, self.rng)
        parent = json.loads(self.rng.choice(good[:PARENTS])[1])
        return mutate(parent, self.inst, self.rng)

    def best(self) -> tuple[dict, float] | None:
        good = [(s, t) for t, s in self.measured.items() if math.isfinite(s)]
        if not good:
            return None
        seconds, text = min(good)
        return json.loads(text), seconds


def measured_points(inst: Instance, profiler: Profiler) -> dict[str, float]:
    """Every parameter point of the instance recorded so far (inf: a failure)."""
    from tgc.planner.db import device_of, kernel_info

    db = profiler.db
    device_id = db.device_id(device_of(inst.kernel))
    kernel_id = db.kernel_id(kernel_info(inst.kernel)) if device_id is not None else None
    if kernel_id is None:
        return {}
    out: dict[str, float] = {}
    for params, attrs_key, status, median, _ in db.instance_rows(
        kernel_id, device_id, inst.signature
    ):
        if attrs_key == inst.attrs_key:
            out[params] = median if status == OK else math.inf
    return out


def tune_instance(inst: Instance, profiler: Profiler, report: Report, deadline: float) -> int:
    """Measure new parameter points of `inst` until `deadline` (monotonic seconds), MAX_POINTS
    or exhaustion; returns how many were measured."""
    search = Search(inst, measured_points(inst, profiler))
    count = 0
    while count < MAX_POINTS and time.monotonic() < deadline and not profiler.out_of_time():
        point = search.candidate()
        if point is None:
            break
        candidate = inst.with_params(point)
        if not unknown([candidate], profiler.db):  # another profiler measured it meanwhile
            search.measured[params_text(point)] = measured_points(inst, profiler).get(
                params_text(point), math.inf
            )
            continue
        m = profiler.measure(candidate, profiler.min_time, origin="tune")
        profiler.db.record(m)
        search.measured[params_text(point)] = m.median if m.ok else math.inf
        if not m.ok:
            report.failures.append(f"{candidate.describe()}: {m.message}")
        count += 1
    return count


def tune_all(insts: list[Instance], profiler: Profiler, report: Report) -> int:
    """Tune every instance of a kernel with parameters, sharing the time left equally."""
    from tgc.planner.profile import Progress

    tunable = [i for i in insts if i.kernel.params]
    bar = Progress(len(tunable), "tuning", profiler.progress)
    total = 0
    try:
        for k, inst in enumerate(tunable):
            left = profiler.deadline - time.monotonic()
            share = left / (len(tunable) - k) if math.isfinite(left) else math.inf
            total += tune_instance(inst, profiler, report, time.monotonic() + share)
            bar.step(inst.kernel.name)
    finally:
        bar.close()
    return total

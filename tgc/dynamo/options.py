"""The options of the `tgc` torch.compile backend: `torch.compile(model, backend="tgc",
options={...})` hands them to the backend with every graph, checked here before any work.

Each option is one field of `BackendOptions`; a name that is none of them, or a value of the
wrong kind, is a TgcError naming it (and, for a name, listing the valid ones), so a typo never
passes silently as a default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from tgc.diagnostics import TgcError

# The GPU route's default (planner.DEFAULT_MEASURE_BUDGET), repeated so that reading the options
# imports no planner module; test_dynamo_backend checks that the two agree.
DEFAULT_MEASURE_BUDGET = 30.0
# A graph met again at new shapes (a new prompt length) is planned from what its first compile
# measured: the database's estimates for unseen shapes, and this many seconds of measuring
DEFAULT_NEW_SHAPES_MEASURE_BUDGET = 3.0


@dataclass(frozen=True)
class BackendOptions:
    """`tolerance`: the largest stated kernel error a plan may use (None: by the function's
    narrowest float type, as the GPU route does, planner/route.py `plan_tolerance`); `db`: the
    measurement database (None: on the CPU the roofline model, as `tgc-run --backend auto`
    without `--db`; on the GPU the default database in the user's cache); `measure_budget`:
    seconds the GPU route may spend measuring unknown kernel instances on first use (the CPU
    route measures nothing), for a graph's first set of shapes; `new_shapes_measure_budget`:
    the same for the graph's later sets of shapes (a new prompt length), planned mostly from the
    database's estimates for unseen shapes; `compare_eager`: time each graph compiled, at each new set of
    shapes, beside the graph run eagerly on the same arguments, and run the faster (a graph
    that updates its inputs is not timed twice: tgc runs it); `whole_graphs`: on the GPU,
    replay each call of a Dynamo graph as one CUDA graph (whole.py: the host's work of a call,
    its copies in and out and the plan's own replay, becomes one replay; on by default since a
    1.1 B Llama's generate() ran its decode steps that way on an H200, faster and with float32
    tokens equal to eager's)."""

    tolerance: float | None = None
    db: str | None = None
    measure_budget: float = DEFAULT_MEASURE_BUDGET
    new_shapes_measure_budget: float = DEFAULT_NEW_SHAPES_MEASURE_BUDGET
    compare_eager: bool = True
    whole_graphs: bool = True


OPTION_NAMES = tuple(f.name for f in fields(BackendOptions))


def parse_options(options: Mapping | None) -> BackendOptions:
    """`options` as given to torch.compile, checked (module doc)."""
    if options is None:
        return BackendOptions()
    if not isinstance(options, Mapping):
        raise TgcError(
            f"torch.compile options for backend 'tgc' must be a dict, got {type(options).__name__}"
        )
    unknown = [str(k) for k in options if k not in OPTION_NAMES]
    if unknown:
        raise TgcError(
            f"unknown torch.compile option '{unknown[0]}' for backend 'tgc' "
            f"(its options: {', '.join(OPTION_NAMES)})"
        )
    values = dict(options)
    if values.get("tolerance") is not None:
        values["tolerance"] = _non_negative("tolerance", values["tolerance"])
    for budget in ("measure_budget", "new_shapes_measure_budget"):
        if budget in values:
            values[budget] = _non_negative(budget, values[budget])
    for flag in ("compare_eager", "whole_graphs"):
        if flag in values and not isinstance(values[flag], bool):
            raise TgcError(
                f"torch.compile option '{flag}' of backend 'tgc' must be True or False, "
                f"got {values[flag]!r}"
            )
    if values.get("db") is not None:
        db = values["db"]
        if not isinstance(db, (str, os.PathLike)):
            raise TgcError(
                f"torch.compile option 'db' of backend 'tgc' must be a path, "
                f"got {type(db).__name__}"
            )
        values["db"] = os.fspath(db)
    return BackendOptions(**values)


def _non_negative(name: str, value) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (0 <= value < math.inf):
        raise TgcError(
            f"torch.compile option '{name}' of backend 'tgc' must be a non-negative number, "
            f"got {value!r}"
        )
    return float(value)

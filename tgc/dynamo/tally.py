"""How much of what Dynamo captured runs in tgc, and the log lines that say so.

Every graph Dynamo hands the backend is compiled once per set of argument shapes; each such
compile is counted here, with the graph's op count (its call nodes), as run in tgc or eagerly.
The tally is the process's (torch.compile keeps no per-model state a backend could hang it on):
`coverage()` reads it and `reset_coverage()` starts it again. Messages go to the logger named
"tgc": a graph that falls back is one WARNING line saying which op (or step) and why, with the
tally so far; a graph compiled is one INFO line with the tally. A compiled graph that fails when
it runs (and runs eagerly from then on) is taken off the count of what runs in tgc.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger("tgc")


@dataclass
class Coverage:
    """Compiled graphs (one per graph and set of shapes) and their ops: all, and in tgc."""

    graphs: int = 0
    graphs_in_tgc: int = 0
    ops: int = 0
    ops_in_tgc: int = 0
    # bytes the backend copied into the caller's tensors for in-place updates: an update a
    # compiled graph wrote elsewhere, copied back whole (a donated cache's rows, written into
    # the cache itself by tgc's kernel, copy nothing: lowering.py)
    bytes_written: int = 0

    def summary(self) -> str:
        return (
            f"{self.graphs_in_tgc} of {self.graphs} graph(s), {self.ops_in_tgc} of {self.ops} "
            "op(s) run in tgc"
        )


_TALLY = Coverage()


def coverage() -> Coverage:
    """A copy of the tally so far."""
    return Coverage(**vars(_TALLY))


def reset_coverage() -> None:
    global _TALLY
    _TALLY = Coverage()


def wrote(nbytes: int) -> None:
    """The backend wrote `nbytes` into a caller's tensor (an in-place update)."""
    _TALLY.bytes_written += nbytes


def compiled(name: str, ops: int, shapes: str, seconds: float, lowering: float) -> None:
    """`name` (with `ops` ops) was compiled by tgc for the arguments `shapes` in `seconds`,
    `lowering` of them exporting and importing it (the rest: planning, measuring, building)."""
    _count(ops, True)
    logger.info(
        "tgc: %s (%d ops) compiled for %s in %.2f s (%.2f s exporting and importing); so far %s",
        name,
        ops,
        shapes,
        seconds,
        lowering,
        _TALLY.summary(),
    )


def fell_back(name: str, ops: int, reason: str) -> None:
    """`name` (with `ops` ops) runs eagerly because of `reason` (one line)."""
    _count(ops, False)
    logger.warning(
        "tgc: %s (%d ops) runs eagerly: %s; so far %s", name, ops, reason, _TALLY.summary()
    )


def failed_when_run(name: str, ops: int, reason: str) -> None:
    """`name` (with `ops` ops), compiled, failed when it ran: it runs eagerly from now on, and
    is counted as such."""
    _TALLY.graphs_in_tgc -= 1
    _TALLY.ops_in_tgc -= ops
    logger.warning(
        "tgc: %s failed when run by tgc and runs eagerly from now on: %s; so far %s",
        name,
        reason,
        _TALLY.summary(),
    )


def slower_than_eager(name: str, ops: int, tgc_s: float, eager_s: float) -> None:
    """`name` (with `ops` ops), compiled, took `tgc_s` a call where eager took `eager_s`: it
    runs eagerly at these shapes, and is counted as such."""
    _TALLY.graphs_in_tgc -= 1
    _TALLY.ops_in_tgc -= ops
    logger.info(
        "tgc: %s runs eagerly at these shapes: %.3g ms a call, against tgc's %.3g ms; so far %s",
        name,
        eager_s * 1e3,
        tgc_s * 1e3,
        _TALLY.summary(),
    )


def needs_autograd(name: str) -> None:
    """`name` was called where autograd records: it runs eagerly while that is so."""
    logger.warning(
        "tgc: %s runs eagerly while autograd records it (grad mode on and an input, such as a "
        "parameter, requires grad): tgc compiles for inference; call the model under "
        "torch.no_grad() or torch.inference_mode()",
        name,
    )


def _count(ops: int, in_tgc: bool) -> None:
    _TALLY.graphs += 1
    _TALLY.ops += ops
    if in_tgc:
        _TALLY.graphs_in_tgc += 1
        _TALLY.ops_in_tgc += ops

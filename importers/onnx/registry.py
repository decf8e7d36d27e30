"""The converter registry: ONNX op type -> the function that builds its tgc ops.

    @converter("Relu")
    def relu(ctx: NodeContext):
        return ctx.b.hl.relu(ctx.input(0))

A converter receives the node's `NodeContext` (importers/onnx/context.py) and returns its
outputs: one value, or a list with one entry per ONNX output. Each entry is a tgc `Value`, a numpy
array (a value known at import time, e.g. a folded shape) or None (an optional output that is
not produced). Converters live in `ops_*.py` modules of this package, one per family; every such
module is imported when the package loads, so a new family needs no registration elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

# ONNX's default operator set; nodes of any other domain (com.microsoft, ...) are unsupported.
DEFAULT_DOMAINS = ("", "ai.onnx")

Converter = Callable[..., object]
CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    """Register the decorated function as the converter of each ONNX op type in `op_types`."""

    def register(fn: Converter) -> Converter:
        for op_type in op_types:
            if op_type in CONVERTERS:
                raise ValueError(f"two ONNX converters for '{op_type}'")
            CONVERTERS[op_type] = fn
        return fn

    return register


def supported_op_types() -> list[str]:
    """The ONNX op types (default domain) that have a converter, sorted."""
    return sorted(CONVERTERS)

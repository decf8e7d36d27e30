"""The planner: every way a graph could run, its cost, and the choice of the fastest one.

See docs/planner.md. Layers: the planner uses the core, the dialects, the passes, codegen and the
runtime; nothing below it imports it.
"""

from __future__ import annotations

import importlib

# The backends besides numpy, each registered only where it can run. A backend module raises
# ImportError when its library is missing (PyCUDA, PyTorch); a module not written yet is
# skipped the same way.
OPTIONAL_BACKENDS = ("tgc.planner.backends.cuda", "tgc.planner.backends.torch")

# backend module -> why it did not load (for `tgc-plan` and the docs to show)
UNAVAILABLE: dict[str, str] = {}


def load_backends() -> list[str]:
    """Register the numpy backend's kernels and those of every optional backend that imports;
    returns the modules loaded. Idempotent (a module registers once, on import)."""
    loaded = [importlib.import_module("tgc.planner.backends.numpy").__name__]
    for name in OPTIONAL_BACKENDS:
        try:
            loaded.append(importlib.import_module(name).__name__)
        except ImportError as e:
            UNAVAILABLE[name] = str(e)
    return loaded

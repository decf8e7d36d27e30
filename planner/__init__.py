"""The planner: every way a graph could run, its cost, and the choice of the fastest one.

See docs/planner.md. Layers: the planner uses the core, the dialects, the passes, codegen and the
runtime; nothing below it imports it.
"""

from __future__ import annotations

import importlib
import os
import sys

from tgc.diagnostics import TgcError

# The backends besides numpy, each registered only where it can run. A backend module raises
# ImportError when its library (or the device it needs) is missing; it registers its kernels
# when its `register()` is called, not on import.
OPTIONAL_BACKENDS = ("tgc.planner.backends.cuda", "tgc.planner.backends.torch")

# Which optional backends to load: a comma-separated list of their short names ("cuda",
# "torch"), or "numpy" for none of them; unset: every one that can run here. Tests and lit set
# it so that their plans do not depend on the libraries installed.
BACKENDS_VARIABLE = "TGC_PLANNER_BACKENDS"

# backend module -> why it did not load (for `tgc-plan` and the docs to show)
UNAVAILABLE: dict[str, str] = {}


def short_name(module: str) -> str:
    return module.rsplit(".", 1)[1]


def requested_backends() -> set[str] | None:
    """The optional backends `TGC_PLANNER_BACKENDS` asks for (None: unset, all of them)."""
    text = os.environ.get(BACKENDS_VARIABLE)
    if text is None:
        return None
    names = {n.strip() for n in text.split(",") if n.strip()}
    known = {short_name(m) for m in OPTIONAL_BACKENDS}
    unknown = sorted(names - known - {"numpy"})
    if unknown:
        raise TgcError(
            f"{BACKENDS_VARIABLE} names unknown backend '{unknown[0]}' (known: numpy, "
            f"{', '.join(sorted(known))})"
        )
    return names - {"numpy"}


def load_backends() -> list[str]:
    """Register the numpy backend's kernels and those of every optional backend that imports
    (and that `TGC_PLANNER_BACKENDS` asks for, when set); returns the modules loaded.
    Idempotent: each backend registers once."""
    loaded = [importlib.import_module("tgc.planner.backends.numpy").__name__]
    wanted = requested_backends()
    for name in OPTIONAL_BACKENDS:
        if wanted is not None and short_name(name) not in wanted:
            UNAVAILABLE[name] = (
                f"not requested ({BACKENDS_VARIABLE}={os.environ[BACKENDS_VARIABLE]})"
            )
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            UNAVAILABLE[name] = str(e)
            continue
        module.register()
        UNAVAILABLE.pop(name, None)
        loaded.append(name)
    return loaded


def unload_backends() -> None:
    """Unregister every optional backend that `load_backends` registered (tests: the next
    `load_backends` registers them again)."""
    for name in OPTIONAL_BACKENDS:
        module = sys.modules.get(name)
        if module is not None:
            module.unregister()

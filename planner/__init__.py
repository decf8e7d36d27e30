"""The planner: every way a graph could run, its cost, and the choice of the fastest one.

See docs/planner.md. Layers: the planner uses the core, the dialects, the passes, codegen and the
runtime; nothing below it imports it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

from tgc.diagnostics import TgcError

# Seconds the GPU route (planner/route.py) measures unknown kernel instances on first use; here,
# where tgc-run's --help reads it without importing the planner's modules.
DEFAULT_MEASURE_BUDGET = 30.0

# The backend families a user names (`select-kernels{backends=...}`, `--planner-backends`), each
# with the kernel backends (keys of planner.kernel.BACKEND_SPACE) it provides. A family is one
# module, tgc.planner.backends.<family>.
FAMILIES: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy",),
    "cuda": ("cuda",),
    "torch": ("torch-cpu", "torch-cuda"),
}

# The families besides numpy, each registered only where it can run. Its module raises
# ImportError when its library (or the device it needs) is missing; it registers its kernels
# when its `register()` is called, not on import.
OPTIONAL_BACKENDS = ("tgc.planner.backends.cuda", "tgc.planner.backends.torch")

# backend module -> why it did not load (for `tgc-plan` and the docs to show)
UNAVAILABLE: dict[str, str] = {}


def short_name(module: str) -> str:
    return module.rsplit(".", 1)[1]


def check_families(names: Iterable[str]) -> tuple[str, ...]:
    """`names` (family names, duplicates dropped, order kept) if every one is known; else a
    TgcError naming the first unknown one and the known ones."""
    out: list[str] = []
    for name in names:
        if name not in FAMILIES:
            raise TgcError(f"unknown planner backend '{name}' (known: {', '.join(FAMILIES)})")
        if name not in out:
            out.append(name)
    return tuple(out)


def parse_families(text: str) -> tuple[str, ...]:
    """A comma-separated list of family names (`--planner-backends numpy,torch`), checked."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise TgcError(
            f"expected a comma-separated list of planner backends ({', '.join(FAMILIES)})"
        )
    return check_families(names)


def kernel_backends(families: Iterable[str]) -> frozenset[str]:
    """The kernel backends (`Kernel.backend`) of the named families ("torch" -> torch-cpu and
    torch-cuda)."""
    return frozenset(b for f in check_families(families) for b in FAMILIES[f])


def family_of(backend: str) -> str | None:
    """The family of a kernel backend ("torch-cuda" -> "torch"); None for an unknown name."""
    return next((f for f, members in FAMILIES.items() if backend in members), None)


def load_backends(names: Iterable[str] | None = None, required: bool = False) -> list[str]:
    """Register the numpy backend's kernels and those of every optional family in `names`
    (None: every one) whose module imports; returns the modules of the families registered. A
    family not named is left as it is (loaded or not), and so is one already registered (by an
    earlier call, or a test's stand-in device). `required`: a named family that does not import
    here is a TgcError saying why. Idempotent: each backend registers once."""
    from tgc.planner.backends import BACKENDS

    wanted = FAMILIES.keys() if names is None else check_families(names)
    loaded = [importlib.import_module("tgc.planner.backends.numpy").__name__]
    for name in OPTIONAL_BACKENDS:
        if short_name(name) not in wanted:
            continue
        if any(b in BACKENDS for b in FAMILIES[short_name(name)]):
            loaded.append(name)
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            UNAVAILABLE[name] = str(e)
            if required:
                raise TgcError(
                    f"planner backend '{short_name(name)}' does not load here: {e}"
                ) from None
            continue
        module.register()
        UNAVAILABLE.pop(name, None)
        loaded.append(name)
    return loaded


def unload_backends(names: Iterable[str] | None = None) -> None:
    """Unregister the optional families in `names` (None: every one) that `load_backends`
    registered (tests: the next `load_backends` registers them again)."""
    wanted = FAMILIES.keys() if names is None else check_families(names)
    for name in OPTIONAL_BACKENDS:
        module = sys.modules.get(name)
        if module is not None and short_name(name) in wanted:
            module.unregister()

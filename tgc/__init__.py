"""tgc: a multi-level tensor-graph compiler.

The Python API in one screen:

    import tgc
    m = tgc.parse(text)                      # or tgc.parse_file("model.tg"); verified
    tgc.run_pipeline(m, "optimize")          # or "builtin.module(func.func(cse,dce))"
    print(tgc.print_ir(m))                   # generic=True for MLIR's generic form
    (y,) = tgc.run(m, [x, w], func="mlp")    # numpy in, numpy out ("f64" for reference runs)

    fb = tgc.FunctionBuilder("f", [tgc.tensor("4x8xf32")], ["x"])
    (x,) = fb.args
    m = fb.ret(fb.hl.softmax(x, axis=-1))    # one builder method per registered op

This module wires the parts together: the core (tgc.parser, tgc.builder, tgc.pass_manager, ...)
knows no dialect or pass, only what is registered. `load_all()` registers tgc's dialects and
passes; every function here calls it first, as every tool does at start. Code that uses the core
modules directly calls `tgc.load_all()` once itself.
"""

from __future__ import annotations

from tgc.builder import Builder, tensor
from tgc.builder import FunctionBuilder as _FunctionBuilder
from tgc.builtin import FuncOp, ModuleOp
from tgc.diagnostics import TgcError
from tgc.parser import parse_file as _parse_file
from tgc.parser import parse_module as _parse_module
from tgc.printer import print_module
from tgc.types import TensorType
from tgc.verifier import verify

__all__ = [
    "Builder",
    "FuncOp",
    "FunctionBuilder",
    "ModuleOp",
    "TensorType",
    "TgcError",
    "load_all",
    "parse",
    "parse_file",
    "print_ir",
    "run",
    "run_pipeline",
    "tensor",
    "verify",
]

_loaded = False


def _eqsat_planner_cost(eg, options):
    """eqsat{cost=planner}: planner/eqsat_cost.py, imported when a pipeline asks for it (the
    tools start without the planner's modules)."""
    from tgc.planner.eqsat_cost import planner_cost

    return planner_cost(eg, options)


def load_all() -> None:
    """Register tgc's dialects (hl, atomic, kernel), its passes, the planner's select-kernels
    pass and eqsat's planner cost model. Idempotent: after the first call it returns at once."""
    global _loaded
    if _loaded:
        return
    # Importing a module registers what it defines.
    import tgc.dialects
    import tgc.passes
    import tgc.planner.select  # noqa: F401  (the select-kernels pass)
    from tgc.passes.eqsat import COST_MODELS

    COST_MODELS["planner"] = _eqsat_planner_cost

    _loaded = True


def parse(text: str, filename: str = "<string>") -> ModuleOp:
    """Parse and verify .tg text. Raises TgcError with file:line:col on bad input."""
    load_all()
    module = _parse_module(text, filename)
    verify(module)
    return module


def parse_file(path) -> ModuleOp:
    load_all()
    module = _parse_file(path)
    verify(module)
    return module


def print_ir(module: ModuleOp, generic: bool = False) -> str:
    return print_module(module, generic)


def run_pipeline(module: ModuleOp, pipeline: str, **instrumentation) -> ModuleOp:
    """Run a textual pipeline (`-p` or `--pass-pipeline` syntax) in place; returns the module."""
    from tgc.pass_manager import PassManager

    load_all()
    return PassManager.from_text(pipeline, **instrumentation).run(module)


def run(module: ModuleOp, inputs, func: str | None = None, precision: str = "native"):
    """Run a function on numpy inputs with the numpy interpreter; returns a list of arrays."""
    from tgc.runtime.interpreter import run_function, select_function

    load_all()
    return run_function(select_function(module, func), list(inputs), precision)


class FunctionBuilder(_FunctionBuilder):
    __doc__ = _FunctionBuilder.__doc__

    def __init__(self, name: str, arg_types: list[TensorType], arg_names: list[str] | None = None):
        load_all()  # the builder offers one method per registered op
        super().__init__(name, arg_types, arg_names)

"""torch.export to tgc: an `ExportedProgram` of aten ops becomes a verified `builtin.module`.

    import torch
    from tgc.importers.torch import import_module, parameter_values
    module = import_module(model.eval(), (x,))          # torch.export.export, then import
    (y,) = tgc.run(module, parameter_values(ep) + [x.numpy()])

PyTorch is an optional extra (`pip install tgc[torch]`): this module imports it only when one of
its functions is called, so `import tgc.importers` works without it.

The program is first brought to PyTorch's core aten opset (`ep.run_decompositions`), except for
the ops that map to one hl op (linear, layer_norm, rms_norm, scaled_dot_product_attention, softmax,
log_softmax, silu, matmul, dropout): those are kept whole so the module keeps the model's
structure (`hl.linear`, `hl.layernorm`, `hl.attention`, ...). Every other composite op reaches the
importer as the core ops it is made of. See docs/torch-import.md for the op table and the limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgc.diagnostics import TgcError
from tgc.importers._weights import DEFAULT_INLINE_LIMIT, WeightFiles

if TYPE_CHECKING:  # only for the annotations: torch is imported when a function is called
    import numpy as np
    import torch

    from tgc.builtin import ModuleOp

__all__ = [
    "core_aten_program",
    "import_exported_program",
    "import_file",
    "import_module",
    "parameter_values",
]


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TgcError(
            "the torch.export importer needs PyTorch, which is not installed "
            "(pip install 'tgc[torch]')"
        ) from None


def import_exported_program(
    ep: torch.export.ExportedProgram,
    *,
    params_as_args: bool = True,
    name: str = "forward",
    decompose: bool = True,
    weights_dir: str | None = None,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    mutations: bool = False,
) -> ModuleOp:
    """The module holding `ep` as the function `@name`.

    Parameters and buffers become the first arguments, marked `{tgc.param}` and named by their
    state-dict key (`fc.weight`), followed by the user inputs; with `params_as_args=False` they
    become constants instead. `decompose=False` imports the graph as it is (no
    `run_decompositions`). weights_dir: constants of more than `inline_limit` elements refer to
    `<weights_dir>/<name>.npy` (relative to the .tg file the module is written to, which the
    writer of the module puts there: `tgc-import` does); None keeps every constant inline.
    mutations: a program that updates a user input or a buffer in place is imported as
    torch.export functionalised it, each updated value a result, in the order of
    `ep.graph_signature.output_specs` (updates first, then the outputs), for a caller that
    writes them back (the torch.compile backend, tgc/dynamo); without it such a program is
    refused. Raises TgcError naming the node for anything tgc cannot express.
    """
    _require_torch()
    from tgc.importers.torch._program import import_program

    return import_program(
        ep,
        params_as_args=params_as_args,
        name=name,
        decompose=decompose,
        weights=WeightFiles(weights_dir, inline_limit),
        mutations=mutations,
    )


def core_aten_program(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`ep` in PyTorch's core aten opset as `import_exported_program` brings it there (the ops
    that are one hl op kept whole), and functionalised: each in-place update of an input or a
    buffer is an output of the kind USER_INPUT_MUTATION or BUFFER_MUTATION in
    `graph_signature.output_specs`. For a caller that reads the signature it imports
    (`import_exported_program(..., decompose=False)`); PyTorch's failure is one TgcError."""
    _require_torch()
    from tgc.importers.torch._program import to_core_aten

    return to_core_aten(ep)


def import_module(
    module: torch.nn.Module, example_args: tuple, example_kwargs: dict | None = None, **kw: Any
) -> ModuleOp:
    """`torch.export.export(module, example_args)`, then `import_exported_program(ep, **kw)`.
    The shapes of the example arguments are the shapes of the function (no dynamic shapes)."""
    _require_torch()
    import torch

    ep = torch.export.export(module, tuple(example_args), example_kwargs)
    return import_exported_program(ep, **kw)


def import_file(path: str | Path, **kw: Any) -> ModuleOp:
    """The program saved by `torch.export.save` at `path` (a `.pt2` file), imported.
    A missing, unreadable or corrupt file is one TgcError naming it."""
    _require_torch()
    from tgc.importers.torch._program import load_program

    return import_exported_program(load_program(Path(path)), **kw)


def parameter_values(ep: torch.export.ExportedProgram) -> list[np.ndarray]:
    """The values of the parameter arguments of the imported function, in their order (the
    parameters and buffers of `ep`): pass them before the user inputs to run it."""
    _require_torch()
    from tgc.importers.torch._program import parameter_arrays

    return parameter_arrays(ep)

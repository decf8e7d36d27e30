"""`torch.compile(model, backend="tgc")`: tgc as a TorchDynamo backend (docs/torch-compile.md).

    import torch
    compiled = torch.compile(model, backend="tgc", options={"tolerance": 1e-5})
    y = compiled(x)                      # torch tensors in, torch tensors out

The backend is registered through the `torch_dynamo_backends` entry point (pyproject.toml), so
the name "tgc" works once tgc is installed. Dynamo captures FX graphs (handling Python control
flow, graph breaks, guards and recompiles) and hands each to `tgc_backend`, which returns a
callable (graph.py) that, per set of argument shapes, exports the graph to core aten ops,
functionalised (lowering.py), imports it with the torch importer, plans it (the CPU route of
`tgc-run --backend auto`, host.py; the GPU route, cuda.py, not yet run) and runs it on the
tensors' memory; in-place updates of inputs are written back, and an input the graph updates
is donated to tgc's function, so that a static KV cache's index_copy_ writes its rows into the
cache itself (lowering.py, tgc/donation.py). A graph tgc cannot compile runs
eagerly, said in one line on the "tgc" logger with a tally of how much runs in tgc
(tally.py).

This package is wiring (docs/architecture.md): it joins the importers and the planner. PyTorch
is imported only when the backend is called, so `import tgc.dynamo` works without it.
"""

from __future__ import annotations

from tgc.diagnostics import TgcError
from tgc.dynamo.tally import Coverage, coverage, reset_coverage
from tgc.dynamo.options import OPTION_NAMES, BackendOptions, parse_options

__all__ = [
    "OPTION_NAMES",
    "BackendOptions",
    "Coverage",
    "coverage",
    "reset_coverage",
    "tgc_backend",
]


def tgc_backend(gm, example_inputs, *, options=None, mode=None):
    """The Dynamo backend: `gm` (a torch.fx.GraphModule Dynamo captured) and its example
    inputs in, a callable running it out. `options` are torch.compile's (options.py); a
    `mode` (torch.compile's mode="...") is refused: tgc has none."""
    if mode is not None:
        raise TgcError(
            f"backend 'tgc' has no modes (got mode={mode!r}); it takes options "
            f"({', '.join(OPTION_NAMES)})"
        )
    parsed = parse_options(options)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise TgcError(
            "the tgc backend of torch.compile needs PyTorch (pip install 'tgc[torch]')"
        ) from None
    import tgc
    from tgc.dynamo.graph import CompiledGraph

    tgc.load_all()
    compile_id = gm.meta.get("dynamo_compile_id")
    name = f"graph {compile_id}" if compile_id is not None else "a graph"
    compiled = CompiledGraph(gm, parsed, name)
    # whole-call replays are CUDA graphs: a graph whose examples are all off the GPU is not
    # wrapped (WholeGraphCalls would only pass its calls through)
    on_gpu = any(getattr(t, "is_cuda", False) for t in example_inputs)
    if parsed.whole_graphs and on_gpu:
        from tgc.dynamo.whole import WholeGraphCalls

        return WholeGraphCalls(compiled, name)
    return compiled

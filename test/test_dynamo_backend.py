"""torch.compile(model, backend="tgc", options=IN_TGC) on the CPU (tgc/dynamo, docs/torch-compile.md).

Skipped where PyTorch is not installed (CI); the options' checks that need no PyTorch are in
test_dynamo_options.py. Each model is compiled, run on fresh random inputs (not the ones it was
first compiled at) and compared with the same model run eagerly in float64: a float32 result
passes within F32_TOL * max(1, largest |reference|). Every test also checks, from the backend's
tally, that the graphs it expects ran in tgc, so a fallback to eager (when compiling, or when a
compiled graph fails as it runs) fails it.
"""

from __future__ import annotations

import logging
import re

import pytest

torch = pytest.importorskip(
    "torch", reason="the torch.compile backend needs PyTorch, which is not installed"
)

import copy  # noqa: E402

import tgc.dynamo  # noqa: E402
from tgc.dynamo import coverage, reset_coverage, tgc_backend  # noqa: E402

# float32 plans against the float64 eager model: a few ulp per op over a dozen ops, and the
# check's own f32 tolerance (tgc-run --check's) for the deeper GPT-2
F32_TOL = 1e-5
GPT2_TOL = 2e-4
# What these tests check is tgc's own run of each graph: not handed back to eager where eager is
# faster (compare_eager; test_dynamo_options.py tests that choice).
IN_TGC = {"compare_eager": False}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with Dynamo's caches and the backend's tally empty."""
    torch._dynamo.reset()
    reset_coverage()
    yield
    torch._dynamo.reset()


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float = F32_TOL) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    want = want.double()
    scale = max(1.0, want.abs().max().item())
    err = (got.double() - want).abs().max().item()
    assert err <= tol * scale, f"max abs error {err:.3g} > {tol * scale:.3g}"


def reference(model: torch.nn.Module) -> torch.nn.Module:
    """The model in float64, run eagerly: what the compiled float32 model is compared with."""
    return copy.deepcopy(model).double()


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class MLP(torch.nn.Module):
    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 8) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).softmax(-1)


def spy_backend(found: list, options: dict = IN_TGC):
    """A backend that is tgc's and keeps what it returned (to look at the compiled graphs)."""

    def backend(gm, example_inputs, **kw):
        compiled = tgc_backend(gm, example_inputs, **{"options": options, **kw})
        found.append(compiled)
        return compiled

    return backend


# -- registration --------------------------------------------------------------------------------


def test_the_backend_is_found_by_its_entry_point():
    """torch finds "tgc" through the torch_dynamo_backends entry point (pyproject.toml); if this
    fails in a checkout, reinstall it (pip install -e .) so that the entry point is written."""
    from torch._dynamo.backends.registry import lookup_backend

    assert "tgc" in torch._dynamo.list_backends()
    assert lookup_backend("tgc") is tgc_backend


def test_measure_budget_default_is_the_routes():
    from tgc.planner import DEFAULT_MEASURE_BUDGET

    assert tgc.dynamo.BackendOptions().measure_budget == DEFAULT_MEASURE_BUDGET


# -- models --------------------------------------------------------------------------------------


def test_mlp_matches_eager_on_fresh_inputs():
    torch.manual_seed(0)
    model = MLP().eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    for seed in (1, 2, 3):
        x = randn(4, 16, seed=seed)
        with torch.no_grad():
            assert_close(compiled(x), want_model(x.double()))
    assert coverage().graphs == coverage().graphs_in_tgc == 1


def block(x, w, b):
    """A layer with its weights as arguments, as Dynamo hands a model's layers over."""
    return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)) + x


def test_graphs_alike_are_exported_once_and_each_runs_with_its_own_weights(monkeypatch):
    """Exporting and decomposing a graph was 0.85 s of each of a 16-layer Llama's 34 decode
    and prefill pieces on a 2-core CPU; graphs of one structure at one set of argument shapes
    now share one export (lowering.exported). Four graphs of one layer's structure, each
    compiled by the backend with its own weights: one export, and each graph's results are
    its own layer's in float64."""
    from tgc.dynamo import lowering

    exports = []
    monkeypatch.setattr(lowering, "_EXPORTED", type(lowering._EXPORTED)())
    real = lowering.core_aten_program
    monkeypatch.setattr(lowering, "core_aten_program", lambda ep: exports.append(1) or real(ep))
    layers = [(randn(16, 16, seed=i), randn(16, seed=10 + i)) for i in range(4)]
    x = randn(3, 16, seed=20)
    with torch.no_grad():
        for w, b in layers:
            gm = torch.fx.symbolic_trace(block)  # a graph object of its own each time
            run = tgc_backend(gm, [x, w, b], options=IN_TGC)
            assert_close(run(x, w, b), block(x.double(), w.double(), b.double()))
    assert coverage().graphs == coverage().graphs_in_tgc == 4
    assert len(exports) == 1
    other = randn(5, 16, seed=21)  # other shapes: an export of their own
    gm = torch.fx.symbolic_trace(block)
    with torch.no_grad():
        assert_close(
            tgc_backend(gm, [other, w, b], options=IN_TGC)(other, w, b), block(other, w, b)
        )
    assert len(exports) == 2


def test_a_graph_reading_its_own_tensors_is_exported_for_itself():
    """get_attr (a constant, a buffer of the graph module) or a submodule call: two graphs alike
    in structure may hold other values, so no export is shared."""
    from tgc.dynamo.lowering import _structure

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            return x * self.scale

    x = torch.ones(2)
    assert _structure(torch.fx.symbolic_trace(Scaled()), [x]) is None
    plain = torch.fx.symbolic_trace(lambda x: x * 2.0)
    assert _structure(plain, [x]) == _structure(torch.fx.symbolic_trace(lambda y: y * 2.0), [x])
    assert _structure(plain, [x]) != _structure(plain, [torch.ones(3)])  # other shapes


def test_gpt2_matches_eager():
    """A Hugging Face GPT-2 (random weights, from its config): one graph, all of it in tgc."""
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    generator = torch.Generator().manual_seed(1)
    for _ in range(2):
        ids = torch.randint(0, config.vocab_size, (2, 8), generator=generator)
        with torch.no_grad():
            got = compiled(input_ids=ids, use_cache=False).logits
            want = want_model(input_ids=ids, use_cache=False).logits
        assert_close(got, want, GPT2_TOL)
    tally = coverage()
    assert tally.graphs == tally.graphs_in_tgc == 1
    assert tally.ops_in_tgc > 100  # the whole model, not a fragment


def hf_model(name: str):
    """A tiny Hugging Face model with random weights, and its extra arguments."""
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    torch.manual_seed(0)
    if name == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=128, max_position_embeddings=32, bos_token_id=0,
            eos_token_id=0, pad_token_id=0,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config), {"use_cache": False}
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=128, max_position_embeddings=32, pad_token_id=0,
    )  # fmt: skip
    return transformers.BertModel(config), {}


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_hf_llama_and_bert_match_eager(name):
    """Both run whole in tgc, BERT's padding mask too (Hugging Face's masking_utils reads it at
    [batch, position]: two index tensors, one gather)."""
    model, kw = hf_model(name)
    model.eval()
    want_model = reference(model)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    if name == "bert":
        kw["attention_mask"] = torch.ones_like(ids)
    with torch.no_grad():
        got = torch.compile(model, backend="tgc", options=IN_TGC)(input_ids=ids, **kw)
        want = want_model(input_ids=ids, **kw)
    key = "logits" if name == "llama" else "last_hidden_state"
    assert_close(got[key], want[key], GPT2_TOL)
    assert coverage().graphs == 1
    assert coverage().graphs_in_tgc == 1


def test_bfloat16_goes_in_and_out_through_its_bits():
    torch.manual_seed(0)
    model = MLP().eval().to(torch.bfloat16)
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    x = randn(4, 16, seed=1).to(torch.bfloat16)
    with torch.no_grad():
        got = compiled(x)
    assert got.dtype == torch.bfloat16
    assert_close(got, want_model(x.double()), 3e-2)  # tgc-run --check's bf16 tolerance
    assert coverage().graphs_in_tgc == 1


# -- state ---------------------------------------------------------------------------------------


class Accumulate(torch.nn.Module):
    """Updates a buffer and its input in place, as a running statistic or a cache would."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        y = self.fc(x)
        self.total.add_(y.sum(0))
        x.mul_(2)
        return torch.tanh(y)


def check_accumulate(model, options, seeds) -> None:
    """Accumulate `model` compiled by tgc with `options` against its float64 twin over calls
    with inputs of `seeds`: the outputs, x.mul_(2) made once a call, the buffer accumulated."""
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=options)
    for seed in seeds:
        x = randn(3, 8, seed=seed)
        x_want = x.double()
        with torch.no_grad():
            got = compiled(x)
            want = want_model(x_want)
        assert_close(got, want)
        assert_close(x, x_want)  # doubled once
        assert_close(model.total, want_model.total)  # added once a call


def test_input_and_buffer_updates_are_written_back():
    torch.manual_seed(0)
    model = Accumulate().eval()
    check_accumulate(model, IN_TGC, (1, 2, 3))
    assert model.total.abs().max() > 0
    assert coverage().graphs == coverage().graphs_in_tgc == 1


def test_an_output_that_views_an_updated_input_keeps_the_value_read():
    """`counter + zeros(1)` is the counter reshaped (canonicalize: a view, no kernel), and the
    graph then advances the counter in place, as a StaticCache's cache position and
    `cumulative_length`: the position handed back must be the value before the update. Before,
    the update was written first and the output, sharing the counter's memory, read after it."""

    def step(counter, x):
        position = counter + torch.zeros(1, dtype=torch.int64)
        counter.add_(1)
        return position, x * 2

    compiled = torch.compile(step, backend="tgc", options=IN_TGC)
    counter, x = torch.tensor(5), randn(3, seed=1)
    for start in (5, 6, 7):
        position, doubled = compiled(counter, x)
        assert position.tolist() == [start] and counter.item() == start + 1
        assert_close(doubled, x.double() * 2)
    assert coverage().graphs_in_tgc == coverage().graphs == 1


def test_parameters_are_packed_once_and_an_update_is_seen():
    """The plan's once steps (weights packed) run on the first call only, and again after a
    weight is changed in place (its version changes); the result follows the new weight."""
    torch.manual_seed(0)
    model = MLP().eval()
    found: list = []
    compiled = torch.compile(model, backend=spy_backend(found))
    with torch.no_grad():
        for seed in (1, 2, 3):
            compiled(randn(4, 16, seed=seed))
        (graph,) = found
        (runner,) = graph.runners.values()
        assert runner.planned.once_runs == 1
        model.fc1.weight.mul_(2)
        x = randn(4, 16, seed=4)
        got = compiled(x)
    assert runner.planned.once_runs == 2
    assert_close(got, reference(model)(x.double()))


def test_weights_made_under_inference_mode_are_read_on_every_call(caplog):
    """Inference tensors count no versions: their views are made again on every call, so an
    update made under inference_mode is seen (and nothing fails for want of a version)."""
    caplog.set_level(logging.WARNING, logger="tgc")
    with torch.inference_mode():
        torch.manual_seed(0)
        model = MLP().eval()
        compiled = torch.compile(model, backend="tgc", options=IN_TGC)
        x = randn(4, 16, seed=1)
        compiled(x)
        model.fc1.weight.mul_(2)
        got = compiled(x)
    assert model.fc1.weight.is_inference()
    assert_close(got, reference(model)(x.double()))
    assert coverage().graphs == coverage().graphs_in_tgc == 1
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # ran in tgc, twice


class ReturnsWeights(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w, self.w * 2


def test_a_result_the_plan_keeps_is_handed_out_as_a_copy():
    """`self.w * 2` is computed once per set of weights and kept between calls: writing into
    the tensor returned must not change what the next call returns."""
    torch.manual_seed(0)
    model = ReturnsWeights()
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    x = randn(2, 4, seed=1)
    with torch.no_grad():
        _, doubled = compiled(x)
        doubled.add_(100)
        _, again = compiled(x)
    assert_close(again, model.w.detach().double() * 2)
    assert coverage().graphs_in_tgc == 1


# -- Dynamo's graphs -----------------------------------------------------------------------------


class Printing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        print("halfway")  # a graph break: two graphs
        return self.b(h)


def test_a_graph_break_gives_two_graphs_both_in_tgc(capsys):
    torch.manual_seed(0)
    model = Printing().eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    x = randn(5, 8, seed=1)
    with torch.no_grad():
        assert_close(compiled(x), want_model(x.double()))
    assert "halfway" in capsys.readouterr().out
    assert coverage().graphs == coverage().graphs_in_tgc == 2


class Branching(torch.nn.Module):
    """A branch on a tensor's value (`.item()`): Dynamo breaks the graph there."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = torch.nn.Linear(8, 4)
        self.neg = torch.nn.Linear(8, 4)

    def forward(self, x):
        if x.sum().item() > 0:
            return self.pos(x)
        return self.neg(x)


def test_a_data_dependent_branch_takes_both_ways():
    torch.manual_seed(0)
    model = Branching().eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    x = randn(3, 8, seed=1).abs()
    with torch.no_grad():
        assert_close(compiled(x), want_model(x.double()))
        assert_close(compiled(-x), want_model(-x.double()))
    tally = coverage()
    assert tally.graphs == tally.graphs_in_tgc >= 2


@pytest.mark.parametrize("dynamic", [None, True, False])
def test_a_new_shape_is_compiled_once(dynamic):
    """None: Dynamo's default (a second shape makes the batch size symbolic, and that graph,
    tried first from then on, is compiled by tgc for the first shape too); True: symbolic from
    the start; False: a static recompile. tgc compiles each graph once per set of shapes: after
    two rounds of both shapes, a third compiles nothing."""
    torch.manual_seed(0)
    model = MLP().eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", dynamic=dynamic, options=IN_TGC)
    seeds = iter(range(1, 100))
    compiles = []
    with torch.no_grad():
        for _ in range(3):
            for rows in (3, 5):
                x = randn(rows, 16, seed=next(seeds))
                assert_close(compiled(x), want_model(x.double()))
            compiles.append(coverage().graphs)
    assert compiles[1] == compiles[2] >= 2
    assert coverage().graphs_in_tgc == compiles[2]


def test_a_graph_met_at_new_shapes_is_planned_with_the_new_shapes_budget(monkeypatch):
    """A graph's first set of shapes is compiled with measure_budget; the same graph at another
    set (a symbolic graph at a new prompt length) with new_shapes_measure_budget (graph.py's
    doc: planned from the database's estimates)."""
    from tgc.dynamo import host

    seen = []
    make = host.HostGraph.__init__

    def spy(self, lowered, options):
        seen.append(options.measure_budget)
        make(self, lowered, options)

    monkeypatch.setattr(host.HostGraph, "__init__", spy)
    options = {**IN_TGC, "measure_budget": 7.0, "new_shapes_measure_budget": 0.5}
    compiled = torch.compile(MLP().eval(), backend="tgc", dynamic=True, options=options)
    with torch.no_grad():
        for rows in (3, 5, 3, 7):
            compiled(randn(rows, 16, seed=rows))
    assert seen == [7.0, 0.5, 0.5]


# -- fallback ------------------------------------------------------------------------------------


@torch.library.custom_op("tgc_dynamo_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class WithCustomOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(twice(h))


def test_a_graph_with_an_op_tgc_cannot_import_runs_eagerly(caplog):
    caplog.set_level(logging.INFO, logger="tgc")
    torch.manual_seed(0)
    model = WithCustomOp().eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    x = randn(5, 8, seed=1)
    with torch.no_grad():
        assert_close(compiled(x), want_model(x.double()))
        assert_close(compiled(-x), want_model(-x.double()))  # eager again, not compiled again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    (line,) = warnings
    assert "runs eagerly" in line
    assert "tgc_dynamo_test.twice" in line and "not an aten op" in line
    assert "test_dynamo_backend.py:" in line  # the model's line that called it
    assert line.endswith("so far 1 of 2 graph(s), 2 of 4 op(s) run in tgc"), line
    tally = coverage()
    assert (tally.graphs, tally.graphs_in_tgc) == (2, 1)
    # the graph tgc compiled: one INFO line with its time, and how much of it was exporting
    compiled = [r.getMessage() for r in caplog.records if " compiled for " in r.getMessage()]
    assert len(compiled) == 1
    assert re.search(
        r" in \d+\.\d\d s \(\d+\.\d\d s exporting and importing\); so far", compiled[0]
    )


@torch.library.custom_op("tgc_dynamo_test::positive", mutates_args=())
def positive(x: torch.Tensor) -> torch.Tensor:
    if (x < 0).any():
        raise ValueError("negative input")
    return x.clone()


@positive.register_fake
def _(x):
    return torch.empty_like(x)


def test_the_models_own_error_in_an_eager_graph_is_raised_as_eager_raises_it(caplog):
    """A graph that runs eagerly raises what the model raises, once, not taken for tgc's own
    failure."""
    caplog.set_level(logging.WARNING, logger="tgc")

    def model(x):
        return positive(x) + 1

    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    x = randn(4, seed=1).abs()
    assert_close(compiled(x), x.double() + 1)
    with pytest.raises(ValueError, match="negative input"):
        compiled(-x)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "runs eagerly" in messages[0], messages


def test_compiled_shapes_are_bounded(monkeypatch):
    """At most MAX_SHAPES compiled forms per graph, the least recently used dropped first."""
    import tgc.dynamo.graph

    monkeypatch.setattr(tgc.dynamo.graph, "MAX_SHAPES", 2)
    torch.manual_seed(0)
    model = MLP().eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", dynamic=True, options=IN_TGC)
    counts = []
    with torch.no_grad():
        for seed, rows in enumerate((2, 3, 2, 4, 3)):  # 3 was dropped when 4 came
            x = randn(rows, 16, seed=seed)
            assert_close(compiled(x), want_model(x.double()))
            counts.append(coverage().graphs)
    assert counts == [1, 2, 2, 3, 4]


def test_a_failure_when_running_falls_back_to_eager(caplog, monkeypatch):
    from tgc.dynamo.host import HostGraph

    def broken(self, args):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(HostGraph, "__call__", broken)
    caplog.set_level(logging.WARNING, logger="tgc")
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    x = randn(4, 16, seed=1)
    with torch.no_grad():
        assert_close(compiled(x), reference(model)(x.double()))
        compiled(x)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.endswith(
        "failed when run by tgc and runs eagerly from now on: RuntimeError: kernel exploded; "
        "so far 0 of 1 graph(s), 0 of 4 op(s) run in tgc"
    ), line
    assert (coverage().graphs, coverage().graphs_in_tgc) == (1, 0)


def test_a_call_autograd_records_runs_eagerly_and_can_be_differentiated(caplog):
    """Outside torch.no_grad() the parameters require grad: the call runs eagerly (said once),
    so that its result has a graph to differentiate; under no_grad it is compiled."""
    caplog.set_level(logging.WARNING, logger="tgc")
    torch.manual_seed(0)
    model = MLP().eval()
    want_model = reference(model)
    compiled = torch.compile(model, backend="tgc", options=IN_TGC)
    for seed in (1, 2):
        x = randn(4, 16, seed=seed)
        got = compiled(x)
        assert got.requires_grad
        got[:, 0].sum().backward()
        want_model(x.double())[:, 0].sum().backward()
        assert_close(model.fc1.weight.grad, want_model.fc1.weight.grad)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "runs eagerly while autograd records it" in line and "torch.no_grad()" in line
    assert coverage().graphs == 0
    with torch.no_grad():
        assert_close(compiled(x), want_model(x.double()))
    assert coverage().graphs_in_tgc == 1


# -- on the GPU (marker cuda): tgc/dynamo/cuda.py --------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-4), (torch.bfloat16, 3e-2)])
def test_cuda_tensors_go_through_the_gpu_route_and_come_back(tmp_path, dtype, tol):
    """A model on the GPU: planned on the route (measured on first use into `db`), its
    results CUDA tensors of the model's dtype, equal to float64 eager within the dtype's
    tolerance, fresh tensors on every call (a replayed graph's buffers are not handed out)."""
    torch.manual_seed(0)
    model = MLP().eval()
    want_model = reference(model)
    cuda_model = copy.deepcopy(model).to("cuda", dtype)
    options = {**IN_TGC, "db": str(tmp_path / "m.sqlite"), "measure_budget": 5}
    options["whole_graphs"] = False  # the route's own replays, piece by piece, are the subject
    found: list = []
    compiled = torch.compile(cuda_model, backend=spy_backend(found, options))
    outs = []
    with torch.no_grad():
        for seed in (1, 2, 3, 4, 5):
            x = randn(4, 16, seed=seed)
            got = compiled(x.to("cuda", dtype))
            assert got.is_cuda and got.dtype == dtype
            assert_close(got.cpu(), want_model(x.double()), tol)
            outs.append(got)
    assert outs[0].data_ptr() != outs[1].data_ptr()
    assert coverage().graphs == coverage().graphs_in_tgc == 1
    # a new input tensor every call, and still replays: the inputs keep their addresses
    ((runner,),) = [list(graph.runners.values()) for graph in found]
    assert runner.compiled.runner.replays >= 2


@pytest.mark.cuda
def test_whole_calls_replay_as_one_cuda_graph(tmp_path):
    """whole_graphs: after its warm-up calls, each call of the graph is one replay
    (tgc/dynamo/whole.py); the results still match float64 eager, and each is a new tensor:
    checked after the last call, so a result that a later replay overwrote would fail."""
    torch.manual_seed(0)
    model = MLP().eval()
    want_model = reference(model)
    options = {**IN_TGC, "whole_graphs": True, "db": str(tmp_path / "m.sqlite")}
    found: list = []
    compiled = torch.compile(copy.deepcopy(model).cuda(), backend=spy_backend(found, options))
    calls = []
    with torch.no_grad():
        for seed in range(7):
            x = randn(4, 16, seed=seed)
            calls.append((x, compiled(x.cuda())))
    for x, got in calls:
        assert_close(got.cpu(), want_model(x.double()), 2e-4)
    ((shapes,),) = [list(w.shapes.values()) for w in found]
    assert len(shapes.graphs) == 1 and not shapes.failed  # one capture, replayed
    assert len({got.data_ptr() for _, got in calls}) == len(calls)


@pytest.mark.cuda
def test_a_weight_changed_after_the_whole_call_was_captured_is_seen(tmp_path):
    """The replay of a whole call holds no once steps (the weights packed before the capture):
    a weight changed in place after it must still reach the results (whole.py). Before, the
    replays read the old packing."""
    torch.manual_seed(0)
    model = MLP().eval().cuda()
    options = {**IN_TGC, "whole_graphs": True, "db": str(tmp_path / "m.sqlite")}
    compiled = torch.compile(model, backend=spy_backend([], options))
    with torch.no_grad():
        for seed in range(6):
            compiled(randn(4, 16, seed=seed).cuda())
        model.fc1.weight.mul_(2)
        want_model = reference(model).cpu()
        for seed in range(6, 10):  # the call as it is, the capture anew, replays
            x = randn(4, 16, seed=seed)
            assert_close(compiled(x.cuda()).cpu(), want_model(x.double()), 2e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("whole_graphs", [False, True])
def test_a_callers_stream_is_followed(tmp_path, whole_graphs):
    """Called inside `torch.cuda.stream(s)`, tgc's work waits for what the caller queued on s
    and s waits for tgc's work. Before, kernel-by-kernel calls went on the legacy default
    stream, which does not wait for PyTorch's streams (made non-blocking): here the input is
    written on s after the GPU has spun for about 50 ms, and a call that did not wait read
    the input before that write."""
    torch.manual_seed(0)
    model = MLP().eval()
    want_model = reference(model)
    options = {**IN_TGC, "db": str(tmp_path / "m.sqlite"), "whole_graphs": whole_graphs}
    compiled = torch.compile(copy.deepcopy(model).cuda(), backend="tgc", options=options)
    side = torch.cuda.Stream()
    with torch.no_grad():
        for seed in range(6):  # past the warm-up calls: kernel by kernel, captures, replays
            x = randn(4, 16, seed=seed)
            source, given = x.cuda(), torch.zeros(4, 16, device="cuda")
            torch.cuda.synchronize()
            with torch.cuda.stream(side):
                torch.cuda._sleep(50_000_000)  # cycles: tens of milliseconds
                given.copy_(source)  # queued behind the sleep; the host goes on at once
                got = compiled(given)
                got_host = got.cpu()  # on s: after tgc's work, which waited for the write
            torch.cuda.synchronize()
            assert_close(got_host, want_model(x.double()), 2e-4)
    assert coverage().graphs_in_tgc == coverage().graphs == 1


@pytest.mark.cuda
def test_the_plans_pytorch_kernels_run_on_the_routes_stream_under_a_callers_stream(tmp_path):
    """Under `torch.cuda.stream(s)`, a plan's PyTorch kernels (torch-cuda) must be queued where
    its generated kernels are (the legacy default stream), not on s: before, they followed s,
    unordered with the generated ones, and test_a_callers_stream_is_followed failed on an H200
    where the plan mixed the two (error 0.13)."""
    torch.manual_seed(0)
    options = {**IN_TGC, "db": str(tmp_path / "m.sqlite"), "whole_graphs": False}
    found: list = []
    compiled = torch.compile(MLP().eval().cuda(), backend=spy_backend(found, options))
    x = randn(4, 16, seed=1).cuda()
    with torch.no_grad():
        compiled(x)
        ((cuda_graph,),) = [list(g.runners.values()) for g in found]
        route, streams = cuda_graph.compiled, []

        def recording(values):
            streams.append(torch.cuda.current_stream())
            return route(values)

        cuda_graph.compiled = recording
        with torch.cuda.stream(torch.cuda.Stream()):
            compiled(x)
    assert streams == [torch.cuda.default_stream()]


@pytest.mark.cuda
def test_cuda_input_updates_are_written_back(tmp_path):
    torch.manual_seed(0)
    model = Accumulate().eval()
    want_model = reference(model)
    cuda_model = copy.deepcopy(model).to("cuda")
    options = {**IN_TGC, "db": str(tmp_path / "m.sqlite"), "measure_budget": 5}
    compiled = torch.compile(cuda_model, backend="tgc", options=options)
    for seed in (1, 2):
        x = randn(3, 8, seed=seed)
        x_want, x_gpu = x.double(), x.to("cuda")
        with torch.no_grad():
            assert_close(compiled(x_gpu).cpu(), want_model(x_want), 2e-4)
        assert_close(x_gpu.cpu(), x_want, 2e-4)  # x.mul_(2), on the device
        assert_close(cuda_model.total.cpu(), want_model.total, 2e-4)
    assert coverage().graphs_in_tgc == 1


def test_inputs_keep_their_addresses_so_that_calls_can_be_replayed():
    """A CUDA graph replays at the addresses it was captured with (planner/graphs.py): inputs
    that are new tensors on every call are copied into one buffer of the graph's own from the
    second call on; one passed as the same tensor every call (a KV cache) is never copied. The
    logic is the device's and the CPU's alike (tgc/dynamo/cuda.py StableInputs)."""
    from tgc.dynamo.cuda import StableInputs

    inputs = StableInputs()
    cache = randn(4, 8, seed=0)
    fresh = [randn(2, 3, seed=s) for s in (1, 2, 3, 4)]
    seen = []
    for x in fresh:
        assert inputs.view(7, cache).data_ptr() == cache.data_ptr()  # never copied
        got = inputs.view(3, x)
        assert torch.equal(got, x)
        seen.append(got.data_ptr())
    assert seen[0] == fresh[0].data_ptr()  # the first call reads the tensor where it is
    assert len(set(seen[1:])) == 1 and seen[1] != fresh[1].data_ptr()  # then one buffer
    strided = randn(3, 2, seed=5).t()  # not contiguous: read through a contiguous copy
    got = StableInputs().view(0, strided)
    assert got.is_contiguous() and torch.equal(got, strided)


def test_an_input_or_parameter_not_16_byte_aligned_is_read_through_an_aligned_copy():
    """A view starting 2 bytes into its tensor: the kernels that read through TMA tensor maps
    refuse it at launch, so the graph reads a copy at aligned memory (the same values); an
    aligned view is read where it is."""
    from tgc.dynamo.cuda import AS_GIVEN, StableInputs, _device_view

    base = randn(2, 17, seed=0).to(torch.bfloat16)
    odd = base.view(-1)[1:33].view(4, 8)  # starts 2 bytes in
    assert odd.data_ptr() % 16 == 2
    inputs = StableInputs()
    for view in (inputs.view, AS_GIVEN.view, lambda slot, t: _device_view(t)):
        for _ in range(2):  # the first call and a later one
            got = view(0, odd)
            assert got.data_ptr() % 16 == 0 and torch.equal(got, odd)
    aligned = base.view(-1)[8:24]
    assert aligned.data_ptr() % 16 == 0
    assert StableInputs().view(1, aligned).data_ptr() == aligned.data_ptr()


def test_an_input_at_new_memory_twice_is_read_where_it_is_again():
    """The next generate()'s KV cache: new memory, then the same new memory on every step. It
    is copied on the first call that brings it and read where it is from the second on (before,
    it was copied on every call from then on: every layer's whole cache, every token)."""
    from tgc.dynamo.cuda import StableInputs

    inputs = StableInputs()
    first, second = randn(4, 8, seed=0), randn(4, 8, seed=1)
    assert inputs.view(0, first).data_ptr() == first.data_ptr()
    copied = inputs.view(0, second)
    assert copied.data_ptr() != second.data_ptr() and torch.equal(copied, second)
    for _ in range(3):  # the generate()'s later steps
        assert inputs.view(0, second).data_ptr() == second.data_ptr()
    # memory that alternates is never "the same twice": copied on each call
    a, b = randn(4, 8, seed=2), randn(4, 8, seed=3)
    for x in (a, b, a, b):
        got = inputs.view(0, x)
        assert got.data_ptr() == copied.data_ptr() and torch.equal(got, x)


# -- compare_eager: the faster of tgc and eager runs --------------------------------------------


def _timed_as(monkeypatch, tgc_s: float, eager_s: float) -> list:
    """graph._seconds_per_call made to say `tgc_s` for tgc's runner and `eager_s` for eager;
    the calls it got, in order ("tgc" or "eager")."""
    from tgc.dynamo import graph

    calls: list = []

    def seconds(run, args):
        eager = getattr(run, "__name__", "") == "_run_eagerly"
        calls.append("eager" if eager else "tgc")
        run(args)
        return eager_s if eager else tgc_s

    monkeypatch.setattr(graph, "_seconds_per_call", seconds)
    return calls


@pytest.mark.parametrize("tgc_s, eager_s, in_tgc", [(2e-3, 1e-3, 0), (1e-3, 2e-3, 1)])
def test_the_faster_of_tgc_and_eager_runs_at_each_shape(
    monkeypatch, caplog, tgc_s, eager_s, in_tgc
):
    """compare_eager (the default): a graph compiled for new shapes is timed beside eager on its
    first call, and the faster runs from then on, said in the log and the tally."""
    torch.manual_seed(0)
    model = MLP().eval()
    calls = _timed_as(monkeypatch, tgc_s, eager_s)
    compiled = torch.compile(model, backend="tgc")
    with caplog.at_level(logging.INFO, logger="tgc"), torch.no_grad():
        for seed in (1, 2, 3):
            x = randn(4, 16, seed=seed)
            assert_close(compiled(x), reference(model)(x.double()))
    assert calls == ["tgc", "eager"]  # timed once, at the first call
    assert coverage().graphs == 1 and coverage().graphs_in_tgc == in_tgc
    said = "runs eagerly at these shapes: 1 ms a call, against tgc's 2 ms"
    assert (said in caplog.text) is (in_tgc == 0), caplog.text


@pytest.mark.parametrize("limit, timed", [(1 << 20, True), (0, False)])
def test_a_graph_that_updates_its_inputs_is_timed_with_them_put_back(monkeypatch, limit, timed):
    """A graph that writes its inputs in place (a decode step's position counters) is timed
    beside eager too, its updated inputs saved and put back around each timed call, so the
    call's own updates are made once; where those inputs are more than RACE_RESTORE_BYTES (a
    KV cache) it is not timed and runs in tgc. Before, every graph that updated an input ran
    in tgc, however much slower than eager."""
    from tgc.dynamo import graph

    monkeypatch.setattr(graph, "RACE_RESTORE_BYTES", limit)
    calls = _timed_as(monkeypatch, 2.0, 1.0)  # eager faster
    check_accumulate(Accumulate().eval(), None, (1, 2))
    assert calls == (["tgc", "eager"] if timed else [])
    assert coverage().graphs_in_tgc == (0 if timed else 1)


# -- options -------------------------------------------------------------------------------------


def test_options_reach_the_plan(tmp_path):
    """A tolerance of 0 (exact kernels only) and a database file that does not exist yet (no
    measurements: the roofline) still plan the whole model."""
    torch.manual_seed(0)
    model = MLP().eval()
    options = {"tolerance": 0.0, "db": tmp_path / "none.db", "measure_budget": 1, **IN_TGC}
    compiled = torch.compile(model, backend="tgc", options=options)
    x = randn(4, 16, seed=1)
    with torch.no_grad():
        assert_close(compiled(x), reference(model)(x.double()))
    assert coverage().graphs_in_tgc == 1


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"options": {"tolerence": 1e-3}},
            "unknown torch.compile option 'tolerence' for backend 'tgc' "
            "(its options: tolerance, db, measure_budget, new_shapes_measure_budget, "
            "compare_eager, whole_graphs)",
        ),
        (
            {"options": {"tolerance": -1}},
            "torch.compile option 'tolerance' of backend 'tgc' must be a non-negative number, "
            "got -1",
        ),
        ({"mode": "reduce-overhead"}, "backend 'tgc' has no modes (got mode='reduce-overhead')"),
    ],
)
def test_bad_options_are_one_clear_error(kw, message):
    from torch._dynamo.exc import BackendCompilerFailed

    compiled = torch.compile(MLP(), backend="tgc", **kw)
    with pytest.raises(BackendCompilerFailed) as info:
        compiled(randn(2, 16, seed=1))
    assert message in str(info.value)


# -- the importer's side -------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")  # PyTorch's own, in export
def test_the_importer_returns_updates_first_when_asked():
    """import_exported_program(mutations=True): each in-place update is a result, before the
    outputs, in the order of the program's output specs; without it the program is refused."""
    import tgc
    from tgc.diagnostics import TgcError
    from tgc.importers.torch import core_aten_program, import_exported_program

    class Update(torch.nn.Module):
        def forward(self, x, y):
            y.add_(1)
            x.mul_(3)
            return x + y

    x, y = randn(2, 3, seed=1), randn(2, 3, seed=2)
    ep = core_aten_program(torch.export.export(Update(), (x.clone(), y.clone())))
    kinds = [spec.kind.name for spec in ep.graph_signature.output_specs]
    targets = [spec.target for spec in ep.graph_signature.output_specs]
    module = import_exported_program(ep, decompose=False, mutations=True)
    results = tgc.run(module, [x.numpy(), y.numpy()])
    by_target = {"x": x.numpy() * 3, "y": y.numpy() + 1, None: x.numpy() * 3 + y.numpy() + 1}
    assert kinds[-1] == "USER_OUTPUT" and set(kinds[:-1]) == {"USER_INPUT_MUTATION"}
    for got, target in zip(results, targets):
        assert abs(got - by_target[target]).max() <= 1e-6
    with pytest.raises(TgcError, match="user input mutation"):
        import_exported_program(ep, decompose=False)

"""Hugging Face generate() with a static KV cache through torch.compile(backend="tgc") on the
CPU (docs/torch-compile.md, "Generation").

Skipped where PyTorch or transformers is not installed (CI has neither). The model is a tiny
Llama (2 layers, hidden 64, 4 heads, 2 key-value heads, vocabulary 256) with random weights;
`model.forward` is compiled, as the Hugging Face docs do for a static cache. Each test checks,
from the backend's tally, that the prefill and the decode step ran in tgc (a fallback to eager
fails it). Greedy tokens must be eager's exactly (float32); the logits of every step are
compared with the float64 model's within LOGITS_TOL * max(1, largest |reference|), and the
cache left after generation with eager's float32 cache within CACHE_TOL.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip(
    "torch", reason="the torch.compile backend needs PyTorch, which is not installed"
)
transformers = pytest.importorskip(
    "transformers", reason="generation through torch.compile needs transformers"
)

from tgc.dynamo import coverage, reset_coverage, tgc_backend  # noqa: E402

# float32 plans against the float64 model over two layers (a few ulp per op, softmax and
# rmsnorm over 64 values): as test_dynamo_backend's Hugging Face models
LOGITS_TOL = 2e-4
# the cache holds k and v projections (one linear, rotary): float32 against eager float32
CACHE_TOL = 1e-5
NEW_TOKENS = 4


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with Dynamo's caches, its counters and the backend's tally empty."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    reset_coverage()
    yield
    torch._dynamo.reset()


def tiny_llama(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config).eval()


def prompt(length: int, seed: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def greedy(model, ids: torch.Tensor, new_tokens: int, **kw):
    """Greedy generate() of `new_tokens` after prompt `ids`, `kw` the cache and output keywords."""
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            **kw,
        )


def generate(model, ids: torch.Tensor, new_tokens: int = NEW_TOKENS, **kw):
    """With a static cache generate() makes, and the logits of every step."""
    return greedy(
        model,
        ids,
        new_tokens,
        cache_implementation="static",
        return_dict_in_generate=True,
        output_logits=True,
        **kw,
    )


def compiled(model):
    """`model` with its forward compiled by tgc, as the Hugging Face docs compile it."""
    model.forward = torch.compile(model.forward, backend="tgc", options={"compare_eager": False})
    return model


def cache_of(out):
    """The cache generate() returned (transformers names it `cache` or `past_key_values`)."""
    return getattr(out, "past_key_values", None) or out.cache


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str = "") -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    want = want.double()
    scale = max(1.0, want.abs().max().item())
    err = (got.double() - want).abs().max().item()
    assert err <= tol * scale, f"{what}: max abs error {err:.3g} > {tol * scale:.3g}"


def dynamo_recompiles() -> int:
    """Frames Dynamo compiled beyond the first of each graph: counters['recompiles'] where
    this PyTorch keeps it, else the frames compiled less the unique graphs."""
    counters = torch._dynamo.utils.counters
    if counters["recompiles"]:
        return sum(counters["recompiles"].values())
    return counters["frames"]["ok"] - counters["stats"]["unique_graphs"]


# -- the cache update's lowering -------------------------------------------------------------------


class CacheWrite(torch.nn.Module):
    """A static cache written in place as transformers' StaticLayer writes it (index_copy_), by
    a slice assignment with negative indices (index_put_), and then read."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(2, 3, 8, 4))

    def forward(self, k, pos, v, where):
        self.keys.index_copy_(2, pos, k)
        self.keys[:, :, where] = v
        return self.keys.sum(-1) * 2


def test_index_copy_and_index_put_write_rows_as_eager():
    model, twin = CacheWrite(), CacheWrite()
    run = torch.compile(model, backend="tgc", options={"compare_eager": False})
    for step, (pos, where) in enumerate([([5, 1], [-1]), ([0, 6], [2]), ([3, 3], [-8])]):
        k = torch.randn(2, 3, 2, 4, generator=torch.Generator().manual_seed(step))
        v = torch.randn(2, 3, 1, 4, generator=torch.Generator().manual_seed(10 + step))
        args = (k, torch.tensor(pos), v, torch.tensor(where))
        with torch.no_grad():
            got, want = run(*args), twin(*args)
        # rows are copied, not computed: exactly eager's (a repeated index: the last wins)
        assert torch.equal(model.keys, twin.keys)
        assert_close(got, want, 1e-6)
    tally = coverage()
    assert tally.graphs >= 1 and tally.graphs_in_tgc == tally.graphs, tally
    # the buffer is donated: its rows were written into it, nothing copied back whole
    assert tally.bytes_written == 0


class CacheThenWeights(torch.nn.Module):
    """A cache written in place and read after, beside a value computed from weights alone
    (`w1 + w2`: a once step of the plan of the piece after the write)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, 8, 4))
        self.w1 = torch.nn.Parameter(torch.randn(4, 4))
        self.w2 = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, k, pos):
        self.keys.index_copy_(2, pos, k)
        return self.keys.mean(2) @ (self.w1 + self.w2)


def test_a_written_cache_is_no_parameter_and_the_weights_are_packed_once():
    """Dynamo marks the cache static as it marks the weights; the plan must not take it for a
    parameter (it is donated), or its once steps (the weights' `w1 + w2` with them) run again
    on every call, the cache's version having changed."""
    from tgc.dynamo.graph import CompiledGraph

    torch.manual_seed(0)
    model, twin = CacheThenWeights(), CacheThenWeights()
    twin.load_state_dict(model.state_dict())
    found = []

    def backend(gm, example_inputs):
        found.append(tgc_backend(gm, example_inputs, options={"compare_eager": False}))
        return found[-1]

    run = torch.compile(model, backend=backend)
    for step in range(4):
        k = torch.randn(1, 2, 1, 4, generator=torch.Generator().manual_seed(step))
        pos = torch.tensor([step])
        with torch.no_grad():
            got, want = run(k, pos), twin(k, pos)
        assert_close(got, want.double(), 1e-5)
    (graph,) = found
    assert isinstance(graph, CompiledGraph)
    (runner,) = graph.runners.values()
    func = runner.planned.func
    donated = [i for i in range(len(func.body.args)) if func.is_donated(i)]
    assert len(donated) == 1 and not func.is_param(donated[0])
    planned = runner.planned
    assert len(planned.steps) != len(planned.per_call), "the weights' sum is a once step"
    assert planned.once_runs == 1


# -- generate() --------------------------------------------------------------------------------

LAYERS = 2


def test_generate_with_a_static_cache_matches_eager():
    model = tiny_llama()
    ids = prompt(7, seed=1)
    want = generate(model, ids)
    exact = generate(copy.deepcopy(model).double(), ids)
    got = generate(compiled(model), ids)
    assert torch.equal(got.sequences, want.sequences)
    assert torch.equal(got.sequences, exact.sequences)
    assert len(got.logits) == NEW_TOKENS
    for step, (g, e) in enumerate(zip(got.logits, exact.logits)):
        assert_close(g, e, LOGITS_TOL, f"logits of new token {step}")
    # the prefill and the decode step, each compiled once and run in tgc
    tally = coverage()
    assert (tally.graphs, tally.graphs_in_tgc) == (2, 2), tally
    assert tally.ops_in_tgc == tally.ops
    # the cache tgc's in-place writes filled holds what eager's holds
    for mine, theirs in zip(cache_of(got).layers, cache_of(want).layers):
        assert_close(mine.keys, theirs.keys, CACHE_TOL, "keys")
        assert_close(mine.values, theirs.values, CACHE_TOL, "values")


def fixed_cache(model, length: int = 32) -> dict:
    """A static cache of `length` positions, as generate()'s keyword: its shape, and so the
    decode step's, does not depend on the prompt or the number of new tokens. The keyword is
    `past_key_values`, which every transformers version takes (5.24 also names it `cache`;
    5.17, the GPU machine's, refuses that)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=length)
    return {"past_key_values": cache}


def generate_into(model, ids, new_tokens: int, cache: dict):
    return greedy(model, ids, new_tokens, **cache)


def bytes_per_decode_token(model, ids, cache_length: int) -> float:
    """What the backend writes into the caller's tensors per decode step: the bytes of a
    generate() of 6 new tokens less those of one of 2, over the 4 decode steps between."""
    before = coverage().bytes_written
    generate_into(model, ids, 2, fixed_cache(model, cache_length))
    two = coverage().bytes_written
    generate_into(model, ids, 6, fixed_cache(model, cache_length))
    six = coverage().bytes_written
    return ((six - two) - (two - before)) / 4


def test_the_cache_update_writes_only_the_new_rows(monkeypatch):
    import tgc.planner.backends.numpy

    cache_length, kv_heads, head_dim, f32 = 32, 2, 16, 4
    ids = prompt(6, seed=3)
    counter = 8  # each layer's cumulative_length (an int64 scalar) is written back whole
    row = kv_heads * head_dim * f32  # one position of one layer's keys or values
    model = compiled(tiny_llama())
    # the cache is donated: its rows are written into it, nothing of it copied back
    assert bytes_per_decode_token(model, ids, cache_length) == LAYERS * counter
    # the cache after generation is eager's (greedy tokens too)
    mine, theirs = fixed_cache(model), fixed_cache(model)
    got = generate_into(model, ids, 5, mine)
    want = generate_into(tiny_llama(), ids, 5, theirs)
    assert torch.equal(got, want)
    (name,) = mine
    for a, b in zip(mine[name].layers, theirs[name].layers):
        assert_close(a.keys, b.keys, CACHE_TOL, "keys")
        assert_close(a.values, b.values, CACHE_TOL, "values")
    # without the cache's memory to write into, each update is a new cache copied back whole
    torch._dynamo.reset()
    monkeypatch.setattr(tgc.planner.backends.numpy, "may_overwrite", lambda op, index: False)
    model = compiled(tiny_llama())
    whole = bytes_per_decode_token(model, ids, cache_length)
    assert whole == LAYERS * (2 * row * cache_length + counter)
    # the same tokens and cache
    mine = fixed_cache(model)
    assert torch.equal(generate_into(model, ids, 5, mine), want)
    for a, b in zip(mine[name].layers, theirs[name].layers):
        assert_close(a.keys, b.keys, CACHE_TOL, "keys, written whole")
        assert_close(a.values, b.values, CACHE_TOL, "values, written whole")
    tally = coverage()
    assert tally.graphs == tally.graphs_in_tgc, tally


def test_decode_compiled_once_for_every_token_and_prefill_once_per_prompt_length():
    """The decode step is compiled once and reused for every token, by tgc and by Dynamo.
    Prefill is compiled per prompt length (Dynamo makes the length symbolic after the second
    one; tgc compiles each length it is called with); with one fixed-size cache the decode
    step keeps its shape, and is not compiled again for another prompt length."""
    model = compiled(tiny_llama())
    eager = tiny_llama()
    ids = prompt(5, seed=2)
    generate_into(model, ids, 2, fixed_cache(model))
    after_two = coverage()
    assert (after_two.graphs, after_two.graphs_in_tgc) == (2, 2), after_two
    got = generate_into(model, ids, 9, fixed_cache(model))
    assert torch.equal(got, generate_into(eager, ids, 9, fixed_cache(eager)))
    # 8 decode calls more, nothing compiled: not by tgc, not by Dynamo
    assert coverage().graphs == after_two.graphs, coverage()
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert dynamo_recompiles() == 0
    # another prompt length, then the first again
    for length, seed in ((9, 5), (5, 6)):
        ids = prompt(length, seed=seed)
        got = generate_into(model, ids, 3, fixed_cache(model))
        assert torch.equal(got, generate_into(eager, ids, 3, fixed_cache(eager))), length
    tally = coverage()
    assert tally.graphs == tally.graphs_in_tgc, tally
    # Dynamo recompiled the prefill once, its length symbolic, and tgc compiled that graph at
    # 9 and at 5; the decode step, its shapes the cache's, was compiled by neither again
    assert tally.graphs == after_two.graphs + 2, tally
    assert counters["stats"]["unique_graphs"] == 3, dict(counters["stats"])


def test_the_decode_steps_attention_reads_the_grouped_cache_by_index(monkeypatch):
    """What the GPU's attention kernels get from a decode step (4 query heads over 2 key-value
    heads, a static cache): after lower-for-planning, one query row per head against the
    whole cache with its additive mask, k and v the cache's heads repeated as repeat_kv writes
    it, which the kernels read by index (`head_grouped_layout`: the head dim's divisor is the
    group, 2), never a copy."""
    import tgc.dynamo.graph as graph
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager
    from tgc.views import head_grouped_layout

    imported = []  # each graph's module as imported (the backend then plans it in place)

    def keep(gm, args, statics):
        found = lower_graph(gm, args, statics)
        imported.append(str(found.module))
        return found

    lower_graph = graph.lower_graph
    monkeypatch.setattr(graph, "lower_graph", keep)
    generate(compiled(tiny_llama()), prompt(9, seed=1), 2)
    decode = []
    for text in imported:
        module = parse_module(text)
        PassManager.from_text("lower-for-planning").run(module)
        for op in module.funcs[0].walk():
            if op.name == "hl.attention" and op.operands[0].type.shape[-2] == 1:
                decode.append(op)
    assert decode, "no decode attention was compiled"
    for att in decode:
        assert len(att.operands) == 4, "the decode step's attention lost its cache mask"
        for kv in att.operands[1:3]:
            found = head_grouped_layout(kv)
            assert found is not None and found[3][-3] == 2, kv.type


@pytest.mark.cuda
def test_decode_pieces_reading_a_cpu_scalar_run_in_tgc_on_the_gpu():
    """A StaticCache layer keeps `cumulative_length` as a 0-d CPU tensor that each layer's piece
    of the decode step reads beside its GPU tensors (every layer of a 1.1 B Llama ran eagerly
    for it: bench/results/generate-*): it is moved to the device as a scalar, every graph runs in
    tgc, and the greedy tokens equal eager's (float32)."""
    model = tiny_llama().to("cuda")
    ids = prompt(8, 1).to("cuda")
    want = greedy(copy.deepcopy(model), ids, 4, **fixed_cache(model))
    got = greedy(compiled(model), ids, 4, **fixed_cache(model))
    assert torch.equal(got, want)
    tally = coverage()
    assert tally.graphs and tally.graphs_in_tgc == tally.graphs, tally.summary()


@pytest.mark.cuda
def test_a_decode_step_captured_whole_reads_its_pieces_inputs_where_they_are(monkeypatch):
    """Captured whole (whole.py), the decode step's pieces read the previous pieces' outputs
    where they are: before, each piece copied them into buffers of its own (`StableInputs`),
    95 copy nodes in a 1.1 B Llama's step. The tokens stay eager's (float32) over steps that
    are replayed."""
    from tgc.dynamo import cuda, whole

    copied_while_capturing = []
    view = cuda.StableInputs.view

    def counting(self, slot, tensor):
        copied_while_capturing.append(torch.cuda.is_current_stream_capturing())
        return view(self, slot, tensor)

    monkeypatch.setattr(cuda.StableInputs, "view", counting)
    read_as_given = []

    class Counting:
        @staticmethod
        def view(slot, tensor):
            read_as_given.append(slot)
            return cuda.AsGiven.view(slot, tensor)

    monkeypatch.setattr(cuda, "AS_GIVEN", Counting())
    model = tiny_llama().to("cuda")
    ids = prompt(8, 1).to("cuda")
    new_tokens = whole.WARMUP + 5  # decode steps past the warm-up: a capture, then replays
    want = greedy(copy.deepcopy(model), ids, new_tokens, **fixed_cache(model))
    got = greedy(compiled(model), ids, new_tokens, **fixed_cache(model))
    assert torch.equal(got, want)
    assert copied_while_capturing and not any(copied_while_capturing)
    assert read_as_given  # the decode step was captured
    tally = coverage()
    assert tally.graphs and tally.graphs_in_tgc == tally.graphs, tally.summary()


def test_generate_replayed_whole_matches_eager_across_new_caches():
    """whole.py's bookkeeping under a real generate(): each call of Dynamo's graphs wrapped in
    WholeGraphCalls with test_dynamo_whole's stand-in capture (on the CPU, the "device" is every
    tensor of rank > 0), three generate() calls each making a new StaticCache. The layers'
    0-d `cumulative_length` counters travel in one staged buffer and come back; the decode step
    is captured again for each new cache (at once: the graph before was replayed); the tokens
    are eager's exactly."""
    from test_dynamo_whole import Recorded

    import tgc.dynamo
    from tgc.dynamo import whole

    capture = Recorded()

    def backend(gm, example_inputs, **kw):
        inner = tgc.dynamo.tgc_backend(gm, example_inputs, options={"compare_eager": False})
        return whole.WholeGraphCalls(
            inner, "g", capture=capture, on_device=lambda t: t.dim() > 0, to_device=torch.clone
        )

    model = tiny_llama()
    ids = prompt(8, seed=3)
    want = [greedy(model, ids, 6, cache_implementation="static") for _ in range(3)]
    model.forward = torch.compile(model.forward, backend=backend)
    got = [greedy(model, ids, 6, cache_implementation="static") for _ in range(3)]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    # the decode step: captured in the first generate() and again for each new cache
    assert capture.captures == 3 and capture.replays >= 3 * 2
    assert coverage().graphs == coverage().graphs_in_tgc

"""Each call of a Dynamo graph replayed as one CUDA graph (tgc/dynamo/whole.py, the option
`whole_graphs`), its bookkeeping driven on the CPU: a stand-in capture that records what a
graph would (each replay runs the call on the captured arguments, its outputs written into the
buffers the capture made) and a stand-in "device" that is the CPU. What a real capture does on
the GPU is test_dynamo_backend.py's GPU test."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch", reason="the torch.compile backend needs PyTorch")

from torch.utils import _pytree as pytree  # noqa: E402

from tgc.dynamo import whole  # noqa: E402


class Recorded:
    """A stand-in capture: replays run the call on the arguments the capture was given and
    write its outputs into the buffers made at the capture (a graph's outputs are fixed
    buffers); capturing runs nothing on the arguments, as capturing a CUDA graph runs nothing on
    the device, but counts the in-place writes of the capture's Python in their versions, as a
    real capture does."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.replays = 0
        self.captures = 0

    def __call__(self, run, static_args):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        clones = [a.clone() if isinstance(a, torch.Tensor) else a for a in static_args]
        versions = [getattr(a, "_version", None) for a in clones]
        shapes = run(*clones)
        for a, c, v in zip(static_args, clones, versions):
            if v is not None and c._version != v:
                torch.autograd.graph.increment_version(a)
        outputs = pytree.tree_map(torch.zeros_like, shapes)

        def replay():
            self.replays += 1
            new = run(*static_args)
            for o, n in zip(pytree.tree_leaves(outputs), pytree.tree_leaves(new)):
                o.copy_(n)

        return replay, outputs


class Step:
    """A decode step's shape of work: reads a weight, writes a row of a cache in place, doubles
    its input in place, returns a value; counts its plain calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, w, cache, x, row):
        self.calls += 1
        cache[row] = x.sum(0)
        x.mul_(2)
        return (x @ w, cache.sum())


def wrapped(step, capture):
    return whole.WholeGraphCalls(step, "graph 0/0", capture=capture, on_device=lambda t: True)


def test_calls_replay_after_the_warmup_and_match_plain_calls():
    step, capture = Step(), Recorded()
    calls = wrapped(step, capture)
    w = torch.randn(4, 3)
    cache, want_cache = torch.zeros(8, 4), torch.zeros(8, 4)
    outputs = []
    for i in range(6):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(i))
        want_x = x.clone()
        row = torch.tensor(i)
        want = Step()(w, want_cache, want_x, row)
        got = calls(w, cache, x, row)
        for g, e in zip(got, want):
            assert torch.allclose(g, e)
        assert torch.equal(x, want_x)  # the moving argument's update reached the caller
        assert torch.equal(cache, want_cache)  # the fixed one was written where it is
        outputs.append(got[0])
    assert step.calls - capture.replays == whole.WARMUP + 1  # the capture's shape probe too
    assert capture.replays == 6 - whole.WARMUP
    assert outputs[-1].data_ptr() != outputs[-2].data_ptr()  # cloned, not the graph's buffer


def test_a_fixed_argument_at_new_addresses_twice_is_captured_again_and_each_graph_kept():
    """Hugging Face's generate() brings a new StaticCache each call: before, every call with
    the new cache ran as it is, never replayed (10.3 ms a decode step against a replay's, on
    an H200). Now, where the graph captured last was replayed fewer than REUSED times (here
    once, or not at all), the first call with new addresses runs as it is and the second,
    bringing them again, captures a graph for them; the first cache's graph is replayed again
    when it comes back; at most CAPTURES are kept."""
    step, capture = Step(), Recorded()
    calls = wrapped(step, capture)
    w, cache = torch.randn(4, 3), torch.zeros(8, 4)
    for i in range(whole.WARMUP + 2):
        calls(w, cache, torch.randn(2, 4), torch.tensor(i))
    assert capture.captures == 1
    caches = [cache] + [torch.zeros(8, 4) for _ in range(whole.CAPTURES)]
    for n, other in enumerate(caches[1:], start=2):
        want_cache = other.clone()
        for row in (n, n + 1):  # two decode steps into the new cache
            x = torch.randn(2, 4)
            want = Step()(w, want_cache, x.clone(), torch.tensor(row))
            replays = capture.replays
            got = calls(w, other, x, torch.tensor(row))
            assert torch.allclose(got[0], want[0]) and torch.equal(other, want_cache)
        # the first step ran as it is, the second was captured and replayed
        assert capture.captures == n and capture.replays == replays + 1
    # CAPTURES kept: the first cache's graph, the least recently used, was dropped
    replays = capture.replays
    calls(w, caches[-1], torch.randn(2, 4), torch.tensor(0))
    assert capture.captures == whole.CAPTURES + 1 and capture.replays == replays + 1
    for _ in range(2):
        calls(w, cache, torch.randn(2, 4), torch.tensor(0))
    assert capture.captures == whole.CAPTURES + 2  # the first cache's captured anew


def test_a_weight_written_in_place_after_the_capture_is_seen():
    """A replay runs no Python, so the plan's once steps (weights packed) are not in it: a
    weight changed in place after the capture makes the next call run as it is, where the once
    steps see it, and the one after is captured anew. The cache the call writes itself changes
    on every call and is not watched, nor are the 0-d CPU scalars' buffers (otherwise every
    call would run as it is)."""
    step, capture = Step(), Recorded()
    calls = wrapped(step, capture)
    w, cache = torch.randn(4, 3), torch.zeros(8, 4)
    for i in range(whole.WARMUP + 3):
        calls(w, cache, torch.randn(2, 4), torch.tensor(i))
    assert capture.captures == 1 and capture.replays == 3
    plain = step.calls - capture.replays
    with torch.no_grad():
        w.mul_(2)
    x = torch.randn(2, 4)
    want = Step()(w, cache.clone(), x.clone(), torch.tensor(0))
    got = calls(w, cache, x, torch.tensor(0))
    assert torch.allclose(got[0], want[0])
    assert step.calls - capture.replays == plain + 1 and capture.captures == 1  # as it is
    calls(w, cache, torch.randn(2, 4), torch.tensor(1))
    assert capture.captures == 2  # captured anew, and replayed from then on
    for i in range(3):
        calls(w, cache, torch.randn(2, 4), torch.tensor(i))
    assert capture.captures == 2 and step.calls - capture.replays == plain + 2


def test_after_a_graph_was_replayed_new_addresses_are_captured_at_once():
    """A generate() after one whose cache's graph was replayed (REUSED times or more): its
    first decode step with the new cache is already captured and replayed, not run as it is."""
    step, capture = Step(), Recorded()
    calls = wrapped(step, capture)
    w, cache = torch.randn(4, 3), torch.zeros(8, 4)
    for i in range(whole.WARMUP + 1 + whole.REUSED):  # captured, then replayed REUSED times
        calls(w, cache, torch.randn(2, 4), torch.tensor(i))
    plain, replays = step.calls - capture.replays, capture.replays
    other, want_cache = torch.zeros(8, 4), torch.zeros(8, 4)
    x = torch.randn(2, 4)
    want = Step()(w, want_cache, x.clone(), torch.tensor(1))
    got = calls(w, other, x, torch.tensor(1))
    assert capture.captures == 2 and capture.replays == replays + 1
    assert step.calls - capture.replays == plain + 1  # the capture's probe alone
    assert torch.allclose(got[0], want[0]) and torch.equal(other, want_cache)


def test_a_fixed_argument_at_new_addresses_every_call_is_not_captured_for():
    """An argument that kept its memory through the warm-up but brings new memory on every
    call after: each call runs as it is (a capture per call would cost more than the call)."""
    step, capture = Step(), Recorded()
    calls = wrapped(step, capture)
    w, cache = torch.randn(4, 3), torch.zeros(8, 4)
    for i in range(whole.WARMUP + 1):
        calls(w, cache, torch.randn(2, 4), torch.tensor(i))
    plain = step.calls - capture.replays
    for i in range(6):
        fresh = torch.zeros(8, 4)
        x = torch.randn(2, 4)
        want = x @ w * 2
        assert torch.allclose(calls(w, fresh, x, torch.tensor(i))[0], want)
    assert capture.captures == 1 and step.calls - capture.replays == plain + 6


def test_a_failed_capture_is_said_once_and_the_calls_run_as_they_are(caplog):
    step = Step()
    calls = wrapped(step, Recorded(fail=True))
    w, cache = torch.randn(4, 3), torch.zeros(8, 4)
    with caplog.at_level(logging.WARNING, logger="tgc"):
        for i in range(whole.WARMUP + 3):
            x = torch.randn(2, 4)
            want = x @ w * 2
            got = calls(w, cache, x, torch.tensor(i))
            assert torch.allclose(got[0], want)
    said = [r for r in caplog.records if "not replayed as one CUDA graph" in r.getMessage()]
    assert len(said) == 1 and "operation not permitted" in said[0].getMessage()
    assert step.calls == whole.WARMUP + 3


def test_calls_off_the_device_or_recording_autograd_pass_through():
    step, capture = Step(), Recorded()
    calls = whole.WholeGraphCalls(step, "g", capture=capture)  # the real test: t.is_cuda
    w, cache = torch.randn(4, 3), torch.zeros(8, 4)
    for i in range(whole.WARMUP + 2):
        calls(w, cache, torch.randn(2, 4), torch.tensor(i))
    assert capture.replays == 0 and step.calls == whole.WARMUP + 2


class CountedStep:
    """A decode step that reads its position from 0-d tensors and advances them in place, as
    each StaticCache layer's cumulative_length (a CPU tensor among GPU ones) is read and
    advanced; one int64 position per layer and a float32 scale."""

    def __call__(self, w, cache, x, position, other, scale):
        cache[position] = x.sum(0) * scale
        position.add_(1)
        other.add_(2)
        return x @ w


def test_0d_cpu_tensors_move_to_the_device_and_back_and_calls_still_replay():
    """Before, a call with a CPU tensor among its arguments ran as it is, never replayed: every
    decode step of a 1.1 B Llama did (bench/results/generate-*). Here the "device" is every
    tensor of rank > 0 and a move to it a copy: the calls replay after the warm-up, the positions
    advance in the caller's tensors and the cache rows land where plain calls put them. The
    scalars travel in one device buffer per element type, made once and at the same address
    every call (before: one copy each way per scalar, every call), so they are read where they
    are, not copied again into the graph's own buffers."""
    capture = Recorded()
    made = []
    calls = whole.WholeGraphCalls(
        CountedStep(),
        "g",
        capture=capture,
        on_device=lambda t: t.dim() > 0,
        to_device=lambda t: made.append(t.dtype) or t.clone(),
    )
    w = torch.randn(4, 3)
    cache, want_cache = torch.zeros(8, 4), torch.zeros(8, 4)
    position, other, scale = torch.tensor(0), torch.tensor(5), torch.tensor(0.5)
    want_position, want_other = torch.tensor(0), torch.tensor(5)
    for i in range(6):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(i))
        want = CountedStep()(w, want_cache, x, want_position, want_other, scale)
        got = calls(w, cache, x, position, other, scale)
        assert torch.allclose(got, want)
        assert int(position) == int(want_position) == i + 1
        assert int(other) == int(want_other) == 5 + 2 * (i + 1)
    assert torch.equal(cache, want_cache)
    assert capture.replays == 6 - whole.WARMUP
    assert sorted(made, key=str) == [torch.float32, torch.int64]  # one buffer per type, once
    (state,) = calls.shapes.values()
    assert state.moving == [2]  # x alone: the scalars' buffers are read where they are

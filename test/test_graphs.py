"""CUDA-graph replay (planner/graphs.py), its keying and fallbacks, with the capture stood in:
no GPU needed. The capture on a GPU is tested in test_cuda.py (results identical to plain
launches)."""

from __future__ import annotations

import pytest

from tgc.planner import graphs


class FakeBuffer:
    """A device value as the executor sees one: only its `__cuda_array_interface__`."""

    def __init__(self, ptr: int, shape=(4,), typestr="<f4") -> None:
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": shape,
            "typestr": typestr,
            "version": 3,
        }


class FakePlanned:
    """A planned function: counts its plain runs; its results name the call."""

    func = None
    returned = (0,)

    def __init__(self, on_device: bool = True) -> None:
        self.runs = 0
        self.forgot = 0
        self.on_device = on_device

    def __call__(self, values):
        self.runs += 1
        return [("plain", self.runs)]

    def host_step(self):
        return None if self.on_device else "'atomic.exp' at f.tg:2:3"

    def forget_params(self) -> None:
        self.forgot += 1


class FakeGraph:
    def __init__(self, key) -> None:
        self.key = key
        self.replays = 0
        self.results = [("graph", key)]

    def replay(self) -> None:
        self.replays += 1


@pytest.fixture
def captures(monkeypatch):
    """The capture stood in: each returns a FakeGraph of the arguments' key; the list of them."""
    made: list[FakeGraph] = []

    def capture(planned, values):
        graph = FakeGraph(graphs._key(values))
        made.append(graph)
        return graph

    monkeypatch.setattr(graphs, "_capture", capture)
    monkeypatch.setattr(graphs, "_graph_api_problem", lambda: None)
    return made


def test_the_first_call_runs_plain_the_second_captures_and_later_calls_replay(captures):
    planned = FakePlanned()
    replay = graphs.GraphReplay(planned)
    args = [FakeBuffer(256), FakeBuffer(512)]
    assert replay(args) == [("plain", 1)]
    assert not captures
    second = replay(args)
    assert len(captures) == 1 and second == captures[0].results
    third = replay(list(args))
    assert third is captures[0].results  # the same result buffers, overwritten
    assert captures[0].replays == 2 and planned.runs == 1
    assert (replay.captures, replay.replays) == (1, 2)


@pytest.mark.parametrize(
    "other",
    [
        [FakeBuffer(256), FakeBuffer(768)],  # another buffer
        [FakeBuffer(256), FakeBuffer(512, shape=(2, 2))],  # the same buffer in another shape
        [FakeBuffer(256), FakeBuffer(512, typestr="<f2")],  # or another element type
    ],
)
def test_a_graph_is_keyed_by_the_arguments_buffers_shapes_and_types(captures, other):
    replay = graphs.GraphReplay(FakePlanned())
    args = [FakeBuffer(256), FakeBuffer(512)]
    replay(args), replay(args)
    assert replay(other) == [("plain", 2)]  # first seen: a plain run, not the graph of args
    assert replay(other) is captures[1].results
    assert replay(args) is captures[0].results


def test_the_least_recently_used_graph_is_dropped_beyond_max_graphs(captures):
    replay = graphs.GraphReplay(FakePlanned())
    keys = [[FakeBuffer(256 * (i + 1))] for i in range(graphs.MAX_GRAPHS + 1)]
    replay(keys[0]), replay(keys[0])
    for args in keys[1:]:
        replay(args), replay(args)
    assert len(replay._graphs) == graphs.MAX_GRAPHS
    assert graphs._key(keys[0]) not in replay._graphs
    assert graphs._key(keys[-1]) in replay._graphs


def test_a_failed_capture_says_why_and_runs_plain_from_then_on(monkeypatch):
    def fail(planned, values):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(graphs, "_capture", fail)
    monkeypatch.setattr(graphs, "_graph_api_problem", lambda: None)
    planned = FakePlanned()
    replay = graphs.GraphReplay(planned)
    args = [FakeBuffer(256)]
    assert [replay(args) for _ in range(3)] == [[("plain", 1)], [("plain", 2)], [("plain", 3)]]
    assert replay.reason == (
        "the capture failed: RuntimeError: operation not permitted when stream is capturing"
    )


def test_host_steps_and_values_that_are_not_device_buffers_run_plain(captures):
    planned = FakePlanned(on_device=False)
    replay = graphs.GraphReplay(planned)
    assert replay.reason == "a step of each call runs on the host: 'atomic.exp' at f.tg:2:3"
    args = [FakeBuffer(256)]
    replay(args), replay(args), replay(args)
    assert planned.runs == 3 and not captures
    on_device = graphs.GraphReplay(FakePlanned())
    host = [object()]  # not a device buffer
    assert on_device(host) == [("plain", 1)] and on_device(host) == [("plain", 2)]
    assert not captures


def test_forget_drops_the_graphs_and_the_once_results(captures):
    planned = FakePlanned()
    replay = graphs.GraphReplay(planned)
    args = [FakeBuffer(256)]
    replay(args), replay(args)
    replay.forget()
    assert planned.forgot == 1
    assert replay(args) == [("plain", 2)]  # plain again, then a new capture
    assert replay(args) is captures[1].results


def test_a_plan_is_on_the_device_per_call_only_when_no_step_of_a_call_is_on_the_host():
    import tgc
    from tgc.planner.executor import PlannedFunction

    host = tgc.parse(
        "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>\n"
        "  func.return %y : tensor<4xf32>\n"
        "}\n"
    ).funcs[0]
    planned = PlannedFunction(host)
    assert not planned.on_device_per_call()
    reason = graphs.GraphReplay(planned).reason
    assert reason.startswith("a step of each call runs on the host: 'atomic.exp' at ")
    assert reason.endswith(":2:8")  # the op name on line 2

"""bench/generate.py (issue 26, item 3) on the CPU: its dry run, a tiny Llama in float32.

The benchmark times Hugging Face generate() with a static KV cache in eager, torch.compile and
tgc modes on a GPU; its dry run is the same code on the CPU at a tiny size (eager and tgc,
prompt 8, 4 new tokens) and fails unless tgc's greedy tokens are eager's exactly and every graph
tgc compiled ran in tgc. Run in-process here (about 10 s on a 2-core machine, tgc's compiles of
the prefill and the decode step most of it): the report it writes under --out has the tgc row
with tokens 100% eager's, Dynamo's two graphs and no recompile; a mode that fails (out of
memory, say) is a note in its row and the run goes on. Also the decode step's bytes for the
bandwidth floor and the bandwidth by device name, as pure functions. Skipped without PyTorch or
transformers (optional extras; CI has neither).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch", reason="bench/generate.py times torch.compile modes and needs PyTorch"
)
transformers = pytest.importorskip(
    "transformers", reason="bench/generate.py builds its Llama with transformers"
)

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "bench" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run(tmp_path: Path) -> tuple[dict, str]:
    """The one run the dry run wrote under `tmp_path`, and its markdown report."""
    (json_path,) = tmp_path.glob("generate-dry-run-*.json")
    (run,) = json.loads(json_path.read_text())["runs"]
    return run, json_path.with_suffix(".md").read_text()


def test_dry_run_tgc_tokens_are_eagers(tmp_path, capsys):
    profiles = tmp_path / "profiles"
    argv = ["--dry-run", "--out", str(tmp_path), "--reps", "2", "--profile", str(profiles)]
    assert bench.main([*argv, "--profile-first-call", str(profiles)]) == 0
    run, md = _run(tmp_path)
    rows = {r["mode"]: r for r in run["rows"]}
    assert list(rows) == ["eager", "tgc"]
    tgc = rows["tgc"]
    assert tgc["note"] == "" and tgc["running"] == ""
    assert tgc["agree"] == 1.0 and tgc["agree_tokens"] == "4/4"
    assert tgc["first_difference"] is None
    # the prefill and the decode step: two Dynamo graphs, no recompile; tgc compiled each
    # once, both in tgc
    assert (tgc["dynamo_graphs"], tgc["dynamo_recompiles"]) == (2, 0)
    assert tgc["tgc_graphs"] == tgc["tgc_graphs_in_tgc"] == 2
    for r in rows.values():
        assert r["first_s"] > 0 and r["ttft_ms"] > 0 and r["total_ms"] > 0
        assert r["floor_ms"] is None  # no bandwidth on the CPU unless --bandwidth says
    assert run["device"] == "cpu (dry run)" and run["new_tokens"] == 4 and run["prompt"] == 8
    # the prefill warmed up before it is timed: three untimed generate() calls of one token
    assert run["warm_prefills"] == 3 and "and 3 untimed ones of 1 token" in md
    assert "| 1 | tgc |" in md and "100.0% (4/4)" in md and "| 2 / 0 | 2 of 2 |" in md
    assert "| 1 | tgc |" in capsys.readouterr().out  # the table is printed too
    # --profile: one more generate() per mode under cProfile, tgc's executor in tgc's
    tgc_profile = (profiles / "profile-generate-tgc-b1.txt").read_text()
    assert "Ordered by: cumulative time" in tgc_profile and "planner/executor.py" in tgc_profile
    assert "planner/executor.py" not in (profiles / "profile-generate-eager-b1.txt").read_text()
    assert "planner/executor.py" in (profiles / "profile-ttft-tgc-b1.txt").read_text()
    # --profile-first-call: each mode's first call, tgc's compile of every graph in it
    first = (profiles / "profile-first-call-tgc-b1.txt").read_text()
    assert "Ordered by: internal time" in first and "tgc/dynamo/lowering.py" in first
    assert "tgc/dynamo" not in (profiles / "profile-first-call-eager-b1.txt").read_text()
    # and the tgc logger's lines of tgc's mode: each graph it compiled, with its shapes
    log = (profiles / "tgc-log-tgc-b1.txt").read_text()
    assert log.count(" compiled for ") == 2 and not (profiles / "tgc-log-eager-b1.txt").exists()


def test_a_failing_mode_is_a_note_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    compile_forward = bench.compile_forward

    def out_of_memory(model, mode, args):
        if mode == "tgc":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\n..")
        compile_forward(model, mode, args)

    monkeypatch.setattr(bench, "compile_forward", out_of_memory)
    argv = ["--dry-run", "--out", str(tmp_path), "--batches", "1,2", "--reps", "1"]
    assert bench.main(argv) == 1  # the dry run's check: tgc did not run
    run, md = _run(tmp_path)
    got = [(r["batch"], r["mode"], r["total_ms"] is not None) for r in run["rows"]]
    assert got == [(1, "eager", True), (1, "tgc", False), (2, "eager", True), (2, "tgc", False)]
    failed = run["rows"][1]
    assert failed["note"] == (
        "compile failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert "| 1 | tgc | - | - | - |" in md and "compile failed: OutOfMemoryError" in md
    assert "FAILED batch 1 tgc: compile failed" in capsys.readouterr().err


def test_decode_step_bytes_are_weights_and_the_cache_so_far():
    size = bench.DRY_SIZE
    model = bench.build_model(size, 16, torch.float32, "cpu")
    batch, prompt, new = 2, 8, 4
    params = sum(p.numel() for p in model.parameters())
    # weights once, but the (untied) input embedding table's batch rows only
    weights = (params - size.vocab * size.hidden + batch * size.hidden) * 4
    head_dim = size.hidden // size.heads
    position = size.layers * 2 * size.kv_heads * head_dim * 4  # k and v of every layer
    want = weights + batch * position * (prompt + new / 2)
    assert bench.decode_step_bytes(model, batch, prompt, new) == want


def test_bandwidth_by_device_name_and_usage_errors(capsys):
    assert bench.device_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert bench.device_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert bench.device_bandwidth("NVIDIA H200") == 4.8e12
    assert bench.device_bandwidth("NVIDIA A10G") is None
    args = bench.parse(["--dry-run"])
    assert (args.batches, args.prompt, args.new_tokens, args.dtype) == ([1], 8, 4, "f32")
    assert args.modes == ["eager", "tgc"] and args.size == bench.DRY_SIZE
    args = bench.parse(["--layers", "4", "--batches", "1,16"])
    assert args.size.layers == 4 and args.size.hidden == 2048 and args.batches == [1, 16]
    assert args.modes == ["eager", "tgc", "default", "reduce-overhead"]
    for argv, message in (
        (["--modes", "eager,max-autotune"], "unknown mode(s) ['max-autotune']"),
        (["--batches", "1,x"], "--batches takes comma-separated integers"),
    ):
        with pytest.raises(SystemExit):
            bench.parse(argv)
        assert message in capsys.readouterr().err


def test_reduce_overhead_steps_and_hands_back_copies(monkeypatch):
    """The reduce-overhead forward starts a CUDA-graph step per call and returns copies of its
    output tensors (the replay's own buffers are overwritten by the next call); what is not a
    tensor (the cache) is handed back as it is."""
    steps = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append(1))
    buffer, cache = torch.randn(2, 3), object()

    def replay(ids):
        buffer.add_(ids)  # as a replay writes its static output
        return transformers.modeling_outputs.CausalLMOutputWithPast(
            logits=buffer, past_key_values=cache
        )

    forward = bench._fresh_outputs(replay)
    first = forward(torch.ones(2, 3))
    kept = first.logits.clone()
    second = forward(torch.ones(2, 3))
    assert len(steps) == 2
    assert first.logits.data_ptr() != buffer.data_ptr() and torch.equal(first.logits, kept)
    assert torch.equal(second.logits, kept + 1) and second.past_key_values is cache


def test_isolated_modes_run_in_their_own_processes(tmp_path):
    """--isolate (the GPU's default): each mode a child process of this script, its row and
    tokens handed back through files: the same checks as in one process pass."""
    argv = ["--dry-run", "--isolate", "--out", str(tmp_path), "--reps", "1"]
    assert bench.main(argv) == 0
    run, _ = _run(tmp_path)
    rows = {r["mode"]: r for r in run["rows"]}
    assert list(rows) == ["eager", "tgc"]
    assert rows["tgc"]["agree_tokens"] == "4/4" and rows["tgc"]["note"] == ""
    assert rows["tgc"]["tgc_graphs"] == rows["tgc"]["tgc_graphs_in_tgc"] == 2


def test_a_child_that_dies_is_a_note_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A mode whose process dies of a signal (reduce-overhead's segmentation fault on the H200)
    leaves its row failed with the signal named; the next mode still runs."""

    class Died:
        def wait(self):
            return -11

    spawn = bench.spawn

    def spawn_or_die(command):
        return Died() if command[command.index("--modes") + 1] == "tgc" else spawn(command)

    monkeypatch.setattr(bench, "spawn", spawn_or_die)
    argv = ["--dry-run", "--isolate", "--out", str(tmp_path), "--reps", "1"]
    argv += ["--modes", "eager,tgc,eager"]
    assert bench.main(argv) == 1
    run, md = _run(tmp_path)
    got = [(r["mode"], r["total_ms"] is not None, r["note"]) for r in run["rows"]]
    assert got == [
        ("eager", True, ""),
        ("tgc", False, "the process died of SIGSEGV"),
        ("eager", True, ""),
    ]
    assert "FAILED batch 1 tgc: the process died of SIGSEGV" in capsys.readouterr().err


def test_hf_compile_lets_generate_compile_the_decode_step_and_other_modes_do_not():
    """`hf-compile`: transformers' own compile of the decode step (disable_compile=False);
    every other mode passes disable_compile=True, or `eager` would not be eager on a GPU."""
    seen = []

    class Model:
        config = transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=16, num_attention_heads=2, vocab_size=32
        )

        def generate(self, ids, max_new_tokens, **kwargs):
            seen.append(kwargs["disable_compile"])
            return torch.zeros(ids.shape[0], ids.shape[1] + max_new_tokens, dtype=torch.long)

    ids = torch.zeros(1, 3, dtype=torch.long)
    bench.generate(Model(), ids, 2, 5, auto_compile=True)
    bench.generate(Model(), ids, 2, 5)
    assert seen == [False, True]
    model = Model()
    bench.compile_forward(model, "hf-compile", None)  # nothing replaced: generate() compiles
    assert "forward" not in vars(model)
    assert "hf-compile" in bench.EXTRA_MODES


def test_the_decode_steps_device_time_is_n_tokens_less_one_over_n_minus_one(monkeypatch, tmp_path):
    """GPU ms / step: the device time of generate() of N tokens less that of one token (the
    prefill), over N - 1; reported beside the bandwidth floor. With --profile the N tokens'
    kernel table is written beside the other profiles."""

    class Averages:
        def table(self, **how):
            return f"kernels by {how['sort_by']}"

    lengths = []
    monkeypatch.setattr(bench, "generate", lambda model, ids, n, *rest: lengths.append(n))
    monkeypatch.setattr(
        bench, "device_ms", lambda call: (call(), (2.0 + 0.5 * lengths[-1], Averages()))[1]
    )
    args = argparse.Namespace(new_tokens=9, prompt=11, profile=None)
    assert bench.gpu_step_ms(None, None, args, "tgc-b1", False) == pytest.approx(0.5)
    assert lengths == [1, 9]
    args.profile = str(tmp_path)
    bench.gpu_step_ms(None, None, args, "tgc-b1", False)
    written = (tmp_path / "kernels-tgc-b1.txt").read_text()
    assert "one generate() of 9 tokens" in written and "kernels by self_cuda_time_total" in written
    row = {**vars(bench.Row(1, "tgc")), "floor_ms": 0.25, "gpu_step_ms": 0.5}
    assert "0.500 ms (2.0x)" in bench._cells(row)
    assert "-" in bench._cells({**row, "gpu_step_ms": None})

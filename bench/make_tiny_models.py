"""Make the tiny GPT-2 and BERT ONNX test folders under test/models/ (issue 9, item 4).

Random weights from a config (nothing is downloaded), exported by PyTorch, saved in the layout
of the ONNX backend tests so that CI, which has no PyTorch, can import and run them:

    test/models/<name>/model.onnx
    test/models/<name>/test_data_set_0/input_<i>.pb     the inputs (int64 ids and masks)
    test/models/<name>/test_data_set_0/output_<i>.pb    PyTorch's outputs, model run in float32
    test/models/<name>/test_data_set_0/reference_f64_<i>.pb
                                                        the same model run in float64 (the better
                                                        reference; not named output_* so that ONNX
                                                        backend runners, which glob output_*.pb,
                                                        ignore it)
    test/models/<name>/README.md                        config, exporter, op counts, recipe

Recipe (where PyTorch is installed; the versions these folders were made with):

    .venv/bin/pip install transformers==5.23.0 onnxscript==0.7.2   # torch 2.13.0+cpu, onnx 1.22.0
    .venv/bin/python bench/make_tiny_models.py                      # all four folders
    .venv/bin/python bench/make_tiny_models.py --only tiny_gpt2 --out /tmp/models

transformers and onnxscript must not change torch (pip leaves torch 2.13.0+cpu alone). Four
folders, two architectures by two exporters:

- tiny_gpt2, tiny_bert: the TorchScript exporter (`dynamo=False`, opset 17), the form of most
  ONNX files in the wild (shape arithmetic for the masks: Shape, ConstantOfShape, Expand, Flatten
  and Gather on static values, which an importer folds);
- tiny_gpt2_dynamo, tiny_bert_dynamo: the torch.export-based exporter (`dynamo=True`, opset 18,
  its optimiser on), the default since PyTorch 2.9 (fewer ops; the padding mask as a GatherND).

Both architectures use transformers' "eager" attention (MatMul, Softmax, MatMul; "sdpa" exports
add IsNaN guards and nothing else of interest). GPT-2 is pre-LN with tanh GELU and a causal plus
padding mask, its LM head tied to the token embedding; BERT is post-LN with erf GELU, token-type
embeddings, a padding mask and the pooler (Gather of the first token, Gemm, Tanh). Every bias and
LayerNorm parameter is drawn at random (the library initialises them to 0 and 1, which would hide
a dropped bias or gamma), and the weights are drawn with a larger spread than the library's 0.02
so that attention is far from uniform. Inputs: batch 2, 16 tokens, the second sequence padded
after 11 tokens (right padding, so that no query row is fully masked).

Each export is checked before it is written: onnx.checker, then onnx's reference evaluator on the
stored inputs against PyTorch's float32 outputs (rtol 1e-4, atol 1e-5 times the largest output).
The output is byte for byte the same on every run with these versions (the torch.export-based
exporter's node metadata, stack traces with local paths, is dropped).
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "test" / "models"

BATCH, SEQ, VOCAB, PAD_FROM = 2, 16, 512, 11
SEED = 0
# Spread of the random weights (transformers uses 0.02, under which attention is nearly uniform).
WEIGHT_STD = 0.15


@dataclass(frozen=True)
class Spec:
    """One test folder: which model, which exporter, what goes in and what comes out."""

    name: str
    arch: str  # "gpt2" or "bert"
    dynamo: bool
    opset: int


SPECS = (
    Spec("tiny_gpt2", "gpt2", dynamo=False, opset=17),
    Spec("tiny_bert", "bert", dynamo=False, opset=17),
    Spec("tiny_gpt2_dynamo", "gpt2", dynamo=True, opset=18),
    Spec("tiny_bert_dynamo", "bert", dynamo=True, opset=18),
)


def gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
        initializer_range=WEIGHT_STD,
    )


def bert_config():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=32,
        type_vocab_size=2,
        attn_implementation="eager",
        initializer_range=WEIGHT_STD,
    )


def build(arch: str):
    """The model in eval mode behind a wrapper whose forward takes and returns plain tensors
    (the exporters take no caches or output dictionaries), with its input and output names."""

    torch.manual_seed(SEED)
    if arch == "gpt2":
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel(gpt2_config())
        wrapper = _Gpt2(model)
        names = (["input_ids", "attention_mask"], ["logits"])
    else:
        from transformers import BertModel

        model = BertModel(bert_config(), add_pooling_layer=True)
        wrapper = _Bert(model)
        names = (["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state", "pooler"])
    randomize_vectors(model)
    return wrapper.eval(), names


def randomize_vectors(model) -> None:
    """Biases and LayerNorm parameters at random: 1 + N(0, 0.1) for gammas, N(0, 0.1) else."""

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 1:
                continue
            noise = 0.1 * torch.randn_like(p)
            is_gamma = name.endswith("weight")  # 1-d weights are LayerNorm gammas
            p.copy_(1 + noise if is_gamma else noise)


class _Gpt2(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        # Passing the mask also keeps transformers off its packed-sequence check (torch.diff,
        # which the TorchScript exporter does not have).
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits


class _Bert(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        return out.last_hidden_state, out.pooler_output


def make_inputs(arch: str) -> list[np.ndarray]:
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64)
    mask = np.ones((BATCH, SEQ), dtype=np.int64)
    mask[1, PAD_FROM:] = 0
    if arch == "gpt2":
        return [ids, mask]
    token_types = np.zeros((BATCH, SEQ), dtype=np.int64)
    token_types[:, SEQ // 2 :] = 1
    return [ids, mask, token_types]


def run_torch(model, inputs: list[np.ndarray], dtype) -> list[np.ndarray]:
    import copy

    m = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        outs = m(*(torch.tensor(x) for x in inputs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [o.numpy() for o in outs]


def export(model, inputs: list[np.ndarray], spec: Spec, names) -> bytes:
    args = tuple(torch.tensor(x) for x in inputs)
    input_names, output_names = names
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings, expected here
        if not spec.dynamo:
            import io

            buf = io.BytesIO()
            torch.onnx.export(
                model,
                args,
                buf,
                dynamo=False,
                opset_version=spec.opset,
                input_names=input_names,
                output_names=output_names,
            )
            return buf.getvalue()
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            opset_version=spec.opset,
            input_names=input_names,
            output_names=output_names,
            optimize=True,
        )
        return without_debug_info(program.model_proto).SerializeToString()


def without_debug_info(model):
    """The model without the node metadata the torch.export-based exporter adds (stack traces
    with this machine's paths, FX nodes, module hierarchies): debug information that would make
    the committed file depend on where and from which line it was made."""
    for graph in [model.graph, *(f for f in model.functions)]:
        for node in graph.node:
            del node.metadata_props[:]
    return model


def check_export(data: bytes, inputs: list[np.ndarray], want: list[np.ndarray], name: str) -> None:
    """The export must compute what PyTorch computed: onnx's checker, then its reference
    evaluator on the same inputs."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    feeds = {i.name: x for i, x in zip(model.graph.input, inputs)}
    got = ReferenceEvaluator(model).run(None, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        atol = 1e-5 * float(np.abs(w).max())
        if not np.allclose(g, w, rtol=1e-4, atol=atol):
            err = float(np.abs(g - w).max())
            sys.exit(f"{name}: output {i} of the export differs from PyTorch by {err:.3g}")


def op_counts(data: bytes) -> dict[str, int]:
    import onnx

    model = onnx.load_from_string(data)
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def write_folder(
    out: Path, spec: Spec, data: bytes, inputs, f32: list, f64: list, counts: dict
) -> None:
    from onnx import numpy_helper

    folder = out / spec.name
    case = folder / "test_data_set_0"
    case.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(data)
    import onnx

    graph = onnx.load_from_string(data).graph
    for i, (x, info) in enumerate(zip(inputs, graph.input)):
        _save(case / f"input_{i}.pb", numpy_helper.from_array(x, info.name))
    for i, (y, info) in enumerate(zip(f32, graph.output)):
        _save(case / f"output_{i}.pb", numpy_helper.from_array(y, info.name))
    for i, (y, info) in enumerate(zip(f64, graph.output)):
        _save(case / f"reference_f64_{i}.pb", numpy_helper.from_array(y, info.name))
    (folder / "README.md").write_text(readme(spec, graph, counts))


def _save(path: Path, tensor) -> None:
    path.write_bytes(tensor.SerializeToString())


def readme(spec: Spec, graph, counts: dict) -> str:
    import onnx
    import transformers

    exporter = (
        f"torch.onnx.export(dynamo=True, optimize=True), opset {spec.opset}"
        if spec.dynamo
        else f"torch.onnx.export(dynamo=False) (TorchScript), opset {spec.opset}"
    )
    config = gpt2_config() if spec.arch == "gpt2" else bert_config()
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    extra = "n_inner=4*hidden" if spec.arch == "gpt2" else "intermediate_size=256"
    cfg = ", ".join(f"{k}={getattr(config, k)}" for k in keys) + f", {extra}"

    def sig(values) -> str:
        return ", ".join(f"{v.name}: {_type_text(v)}" for v in values)

    ops = ", ".join(f"{op} {n}" for op, n in counts.items())
    return "\n".join(
        [
            f"# {spec.name}",
            "",
            f"Made by `bench/make_tiny_models.py` (see its docstring for the recipe): {spec.arch} "
            f"with random weights (seed {SEED}), {cfg}.",
            "",
            f"- exporter: {exporter}",
            f"- versions: torch {torch.__version__}, transformers {transformers.__version__}, "
            f"onnx {onnx.__version__}",
            f"- inputs: {sig(graph.input)}",
            f"- outputs: {sig(graph.output)}",
            f"- ops ({sum(counts.values())} nodes): {ops}",
            "- test_data_set_0: output_<i>.pb from PyTorch in float32, reference_f64_<i>.pb from "
            "the same model in float64",
            "",
        ]
    )


def _type_text(value) -> str:
    import onnx

    t = value.type.tensor_type
    dims = "x".join(str(d.dim_value) for d in t.shape.dim)
    return f"{onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name}[{dims}]"


def make(spec: Spec, out: Path, log: Callable[[str], None] = print) -> dict[str, int]:
    model, names = build(spec.arch)
    inputs = make_inputs(spec.arch)
    f32 = run_torch(model, inputs, torch.float32)
    f64 = run_torch(model, inputs, torch.float64)
    data = export(model, inputs, spec, names)
    check_export(data, inputs, f32, spec.name)
    counts = op_counts(data)
    write_folder(out, spec, data, inputs, f32, f64, counts)
    log(f"{spec.name}: {len(data)} bytes, ops {counts}")
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the test folders")
    ap.add_argument("--only", default="", help="comma-separated folder names (default: all)")
    args = ap.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    unknown = only - {s.name for s in SPECS}
    if unknown:
        ap.error(f"unknown model(s) {sorted(unknown)}; known: {[s.name for s in SPECS]}")
    union: collections.Counter = collections.Counter()
    for spec in SPECS:
        if not only or spec.name in only:
            union.update(make(spec, args.out))
    print("all ops:", ", ".join(sorted(union)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

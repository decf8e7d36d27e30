"""Real models through tgc's GPU route, beside PyTorch (issue 22, item 6; issue 25, item 5).

On the GPU machine (PyTorch, transformers, PyCUDA and nvcc there; torchvision and diffusers for
the vision rows), from the repository root:

    python3 bench/real_models.py [--only gpt2,llama,...] [--vision] [--dtypes bf16,f32]
        [--batch 4 | --batch 1,8] [--seq 512] [--resnet auto|torchvision|hf]
        [--modes eager,default,max-autotune-no-cudagraphs,reduce-overhead] [--db PATH]
        [--keep-db] [--measure-budget 30] [--llama-hidden 2048] [--commit HASH]
        [--out bench/results]

The models (`--only` names; default all):
- text, by Hugging Face transformers: gpt2, llama, bert, qwen2, mistral (SPECS). Each is built
  from its config, wrapped to return one tensor (the logits of a causal LM, the last hidden
  state of an encoder; `use_cache=False`), fed token ids (batch 4 x 512 tokens unless given).
- vision and diffusion (VISION; `--vision` selects them all): resnet50 (torchvision's
  `resnet50(weights=None)` where torchvision imports, else transformers'
  `ResNetForImageClassification(ResNetConfig())`, 1000 labels; `--resnet` picks), vit
  (transformers' `ViTModel(ViTConfig())`, ViT-base/16, no pooler, the last hidden state), unet
  (diffusers' `UNet2DConditionModel`, small: block_out_channels (64, 128), one layer per block,
  cross-attention to 77 x 64 text states, latents 4 x 32 x 32, int64 timesteps) and vae
  (diffusers' `AutoencoderKL(block_out_channels=(64, 128, 256)).decode`: latents 4 x 32 x 32 to
  images 3 x 128 x 128). Images are 224 x 224; each model runs at batch 1 and 8 (the UNet 2
  and 8) unless `--batch` says, a row each. Batch norm statistics are drawn (a fresh one is the
  identity and would hide a mistake).

Every model is built with random weights (seed 0; nothing is downloaded), cast with
`.to(dtype)` and exported with `torch.export` on the CPU, then imported with
`tgc.importers.torch.import_exported_program` (parameters as `{tgc.param}` arguments). Then, on
one GPU in one process:

- tgc: `compile_module` (planner/route.py: lower for planning, measure on first use within
  `--measure-budget` seconds, plan, check the whole plan) and a first call; its *first run* is
  import + compile + first call, wall clock. The measurement database is a fresh one in a
  temporary folder unless `--db` names one, so the first run is a real first use. Then
  `compile_module` again on a fresh import with the same database: its *second plan* time (what a
  user's second run pays, nothing left to measure). `--keep-db` copies the database, as it is
  after each row (what earlier rows of the same run measured included), into the report folder
  as measurements-<model>-<dtype>-b<batch>.sqlite. The plan that runs is broken down by its own
  annotations (`plan.seconds`, `plan.source`, planner/materialise.py): its kernel calls summed
  per callee (count, planned seconds, how many costs measured and how many guessed) and the
  dearest calls one by one, the 12 largest of each, into plan-<model>-<dtype>-b<batch>.txt and
  the row's `tgc_plan`, so that a kernel chosen on a guessed or wrong cost can be seen. The
  steady state is the median of 30 calls timed with CUDA events after 3 warm-ups, a sleep
  kernel queued first so the host runs ahead (bench/gpu_suite.py's `time_ms`), on the inputs
  and parameters as torch CUDA tensors.
- PyTorch: eager, `torch.compile` (default mode), `mode="max-autotune-no-cudagraphs"` and
  `mode="reduce-overhead"` (CUDA graphs) on the same inputs: first call (compile) and steady
  state timed alike. Asked for by name, `tgc-backend`: `torch.compile(model, backend="tgc")`,
  tgc as a PyTorch user meets it (tgc/dynamo), timed alike, its note how many of Dynamo's
  graphs ran in tgc.

Every result is measured against a reference, max |result - reference| / max |reference|. A
bf16 row's reference is float32: the same model, its bf16 weights and buffers upcast to float32
(the same numbers), run eagerly on the GPU on the same inputs (`reference_output`), before the
row's own runs. Eager bf16 is measured against it like the others: its error is what bf16
rounding costs PyTorch itself (tiny BERT on the CPU: 1.1e-2; on an H200 BERT-base's
torch.compile modes were 2.6e-2 from eager, tgc 2.63e-2, and the old check against eager with
0.02 refused tgc). tgc's time is kept only for a result whose error is at most `error_limit`:
max(`TOLERANCE[dtype]` (bf16 2e-2, f32 1e-3), 2 x eager's own error), so that tgc is refused
for being clearly less accurate than PyTorch in the same dtype, not for rounding otherwise than
eager does. An f32 row's reference is eager f32 itself (eager's error is 0, the
limit 1e-3 as before; a float64 reference would cost a second model on the GPU and f64
convolutions, for a check f32 already passes by two orders of magnitude). cuDNN's TF32 is off
(`torch.backends.cudnn.allow_tf32 = False`), so that an f32 convolution (the reference's
included) is f32 in every mode (PyTorch's default runs them in TF32; matmuls it does not). The
compiled modes' errors are reported beside tgc's.
Rows go to bench/results/real-models-<device>-<date>.json (keyed by model, dtype and input
shape, so that runs with `--only` / `--dtypes` / `--batch` add to one report) and the report,
with the device, date, commit and versions, to the .md of the same name. A model that fails
(export, import, tgc or a PyTorch mode) gets its one-line error in its row; the others still run.

Without a GPU, `--dry-run` builds, exports and imports each model (`--tiny`: small configs, text
models 2 layers wide 64, vision models 32 x 32 images and few channels), runs the imported
module through tgc's numpy interpreter (`tgc.run`) on fresh inputs (not the export's) and checks
it against PyTorch's CPU output: text models in f32 (batch 2 x 16 tokens unless given) within
`DRY_TOLERANCE` of max |PyTorch|, vision models in float64 (batch 1 and 2 unless given) within
their `f64_tolerance` (1e-10; the UNet 1e-6: diffusers computes the timestep embedding in
float32); `--dry-dtype` sets the dtype for all: `bf16` checks against the float32 reference on
the CPU, by the GPU rows' rule (`error_limit`, PyTorch's CPU bf16 in eager's place). Then it
plans the module on the numpy backend (lower-for-planning, select-kernels) and runs that plan,
checked alike. It writes no file unless `--out` is given (then the report and each plan's
breakdown, plan-<model>-<dtype>-b<batch>.txt, roofline costs all). test/test_bench_real_models.py
runs the tiny vision builders the same way, and a tiny text model in bf16.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_suite import time_ms  # noqa: E402  (bench/ is on the path only now; the house method)

TOLERANCE = {"bf16": 2e-2, "f32": 1e-3}  # tgc vs the reference, relative to max |reference|
# The dtype a row's reference runs in where it is not the row's own: bf16 rounding moves eager
# itself ~1e-2 off the exact result, so bf16 results are compared with float32's, not eager's
REFERENCE = {"bf16": "f32"}
DRY_TOLERANCE = 1e-4  # numpy interpreter (f32) vs PyTorch on the CPU (f32)
PLAN_TOP = 12  # callees and calls a plan breakdown lists
MODES = ("eager", "default", "max-autotune-no-cudagraphs", "reduce-overhead")
# torch.compile(model, backend="tgc"), asked for by name: tgc as a PyTorch user meets it, Dynamo's
# graphs through tgc/dynamo (whole-call CUDA graphs, the faster of tgc and eager per graph)
BACKEND_MODE = "tgc-backend"
DTYPES = ("bf16", "f32")


# -- the models ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A model: how transformers builds it (class name and config) and what it returns."""

    name: str
    title: str
    model_class: str
    config_class: str
    full: dict
    tiny: dict
    output: str  # "logits" or "last_hidden_state"

    def config(self, tiny: bool, overrides: dict):
        import transformers

        values = {**(self.tiny if tiny else self.full), **overrides}
        return getattr(transformers, self.config_class)(**values)


_TINY_DECODER = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "max_position_embeddings": 128,
}

SPECS = {
    s.name: s
    for s in (
        Spec(
            "gpt2",
            "GPT-2 small (12 layers, 768 hidden, 12 heads, LM head of 50257)",
            "GPT2LMHeadModel",
            "GPT2Config",
            {},  # GPT2Config's defaults are GPT-2 small
            {"vocab_size": 256, "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 4},
            "logits",
        ),
        Spec(
            "llama",
            "Llama-family (4 layers, GQA 32 q / 4 kv heads, RoPE, RMSNorm, SiLU MLP)",
            "LlamaForCausalLM",
            "LlamaConfig",
            {
                "vocab_size": 32000,
                "hidden_size": 2048,
                "intermediate_size": 5632,
                "num_hidden_layers": 4,
                "num_attention_heads": 32,
                "num_key_value_heads": 4,
                "max_position_embeddings": 2048,
            },
            {**_TINY_DECODER, "num_key_value_heads": 2},
            "logits",
        ),
        Spec(
            "bert",
            "BERT-base (12 layers, 768 hidden, 12 heads), last hidden state",
            "BertModel",
            "BertConfig",
            {},  # BertConfig's defaults are BERT-base
            {
                "vocab_size": 256,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 128,
            },
            "last_hidden_state",
        ),
        Spec(
            "qwen2",
            "Qwen2-1.5B-shaped (4 layers, 1536 hidden, GQA 12 q / 2 kv, q/k/v biases, "
            "vocab 151936, tied embeddings)",
            "Qwen2ForCausalLM",
            "Qwen2Config",
            {
                "vocab_size": 151936,
                "hidden_size": 1536,
                "intermediate_size": 8960,
                "num_hidden_layers": 4,
                "num_attention_heads": 12,
                "num_key_value_heads": 2,
                "max_position_embeddings": 4096,
                "tie_word_embeddings": True,
            },
            {**_TINY_DECODER, "num_key_value_heads": 2, "tie_word_embeddings": True},
            "logits",
        ),
        Spec(
            "mistral",
            "Mistral-shaped (4 layers, 2048 hidden, GQA 32 q / 8 kv, sliding window 4096)",
            "MistralForCausalLM",
            "MistralConfig",
            {
                "vocab_size": 32000,
                "hidden_size": 2048,
                "intermediate_size": 7168,
                "num_hidden_layers": 4,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "max_position_embeddings": 4096,
                "sliding_window": 4096,
            },
            {**_TINY_DECODER, "num_key_value_heads": 4, "sliding_window": 64},
            "logits",
        ),
    )
}


def build(spec: Spec, tiny: bool, overrides: dict, dtype):
    """The model in eval mode, weights drawn with seed 0, cast to `dtype`, on the CPU."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = spec.config(tiny, overrides)
    config.use_cache = False
    model = getattr(transformers, spec.model_class)(config)
    return model.to(dtype).eval()


def wrap(model, output: str):
    """`model` as a module of `input_ids` returning the one tensor `output`."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return getattr(self.model(input_ids=input_ids, use_cache=False), output)

    return Wrapped().eval()


def token_ids(vocab: int, batch: int, seq: int, seed: int):
    import torch

    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def export_and_import(module, inputs):
    """(the exported program, the imported tgc module, seconds of export, seconds of import);
    `inputs` is one tensor (a text model's ids) or a tuple of them."""
    import torch

    from tgc.importers.torch import import_exported_program

    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(module, inputs)
    t1 = time.perf_counter()
    imported = import_exported_program(ep)
    return ep, imported, t1 - t0, time.perf_counter() - t1


def parameter_tensors(ep) -> list:
    """The parameters and buffers of `ep` in the order of the imported function's parameter
    arguments (importers/torch `parameter_values`' order), as torch tensors."""
    from torch.export.graph_signature import InputKind

    out = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            found = ep.state_dict.get(spec.target)
            out.append(found if found is not None else ep.constants[spec.target])
    return out


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}"[:300]


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def error_limit(tolerance: float, eager_error: float | None) -> float:
    """The largest error (against the reference, relative to max |reference|) a tgc result may
    have: the dtype's `tolerance`, or twice eager's own error in the row's dtype where that is
    larger. On BERT bf16 eager's rounding alone comes near 0.02, and torch.compile's modes as
    far from eager as tgc; held to eager's accuracy, tgc is refused only for being clearly
    worse than PyTorch in the same dtype. A non-finite eager error (eager overflowed) says
    nothing about what the dtype can do: the tolerance alone then."""
    if eager_error is None or not np.isfinite(eager_error):
        return tolerance
    return max(tolerance, 2 * eager_error)


def reference_output(module, inputs, device: str = "cpu") -> np.ndarray:
    """The float32 reference of a low-precision row: a copy of `module` with its weights and
    buffers upcast to float32 (the same numbers, exactly), run eagerly on `inputs` (floating
    ones upcast, token ids and timesteps as they are) on `device`, as a float64 host array.
    The copy is made where `module` is (on the CPU before a GPU row moves it) and freed after."""
    import copy

    import torch

    model = copy.deepcopy(module).float().to(device)
    args = tuple((t.float() if t.is_floating_point() else t).to(device) for t in inputs)
    with torch.no_grad():
        out = as_host(model(*args))
    del model, args
    return out


def count_ops(module) -> int:
    return sum(1 for f in module.funcs for _ in f.body.ops)


# -- vision and diffusion models (issue 25, item 5) -----------------------------------------------


@dataclass(frozen=True)
class VisionSpec:
    """A vision or diffusion model: how it is built (random weights, seed 0, nothing downloaded)
    and what it takes. `build(tiny, resnet)` gives (the model in eval mode, wrapped to return one
    tensor, on the CPU in float32; a line saying what was built); `inputs(batch, tiny, dtype,
    seed)` the forward's tensors on the CPU; `shape(batch, tiny)` them in words."""

    name: str
    title: str
    build: Callable
    inputs: Callable
    shape: Callable
    batches: tuple[int, ...] = (1, 8)  # on the GPU, unless --batch
    # float64 dry run: numpy against PyTorch, relative to max |PyTorch|
    f64_tolerance: float = 1e-10


def _randomise_batch_norms(model, seed: int) -> None:
    """Batch norm statistics and affine parameters drawn: means and shifts N(0, 0.01), variances
    and scales in [0.5, 1.5) (a fresh module has mean 0, variance 1, scale 1, shift 0: the norm
    would hide a mistake in any of them)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(0.1 * torch.randn(n, generator=g))
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(0.1 * torch.randn(n, generator=g))


def _one_tensor(model, call: Callable, inputs: str):
    """`model` as a module returning the one tensor `call(model, *args)`; its forward's arguments
    (the imported function's input names) are `inputs`: "pixel_values", "latents" or "unet"
    (sample, timestep, encoder_hidden_states)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

    class Images(Wrapped):
        def forward(self, pixel_values):
            return call(self.model, pixel_values)

    class Latents(Wrapped):
        def forward(self, latents):
            return call(self.model, latents)

    class Denoiser(Wrapped):
        def forward(self, sample, timestep, encoder_hidden_states):
            return call(self.model, sample, timestep, encoder_hidden_states)

    return {"pixel_values": Images, "latents": Latents, "unet": Denoiser}[inputs]().eval()


def _resnet50(tiny: bool, impl: str = "auto"):
    """torchvision's `resnet50(weights=None)` where torchvision imports (`impl` "auto" or
    "torchvision"), else Hugging Face's `ResNetForImageClassification` from `ResNetConfig()`
    (its defaults are ResNet-50: bottlenecks [3, 4, 6, 3], widths 256-2048; 1000 labels as
    torchvision's). Tiny: one bottleneck per stage, 10 classes; Hugging Face's at widths 16-128
    (torchvision's widths are fixed)."""
    import torch

    if impl not in ("auto", "torchvision", "hf"):
        raise ValueError(f"--resnet must be auto, torchvision or hf, not {impl!r}")
    tv = None
    if impl != "hf":
        try:
            import torchvision
            from torchvision.models.resnet import Bottleneck, ResNet

            tv = torchvision
        except ImportError:
            if impl == "torchvision":
                raise
    torch.manual_seed(0)
    if tv is not None:
        if tiny:
            model = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10)
            what = "torchvision ResNet(Bottleneck, [1, 1, 1, 1], 10 classes)"
        else:
            model = tv.models.resnet50(weights=None)
            what = f"torchvision {tv.__version__} resnet50(weights=None)"
        call = _call_plain
    else:
        import transformers

        values = {"num_labels": 1000}
        if tiny:
            values = {
                "embedding_size": 8,
                "hidden_sizes": [16, 32, 64, 128],
                "depths": [1, 1, 1, 1],
                "num_labels": 10,
            }
        model = transformers.ResNetForImageClassification(transformers.ResNetConfig(**values))
        what = "Hugging Face ResNetForImageClassification(ResNetConfig(" + (
            "tiny: widths 16-128, one bottleneck per stage, 10 labels))"
            if tiny
            else "), 1000 labels; torchvision absent)"
        )
        call = _call_logits
    _randomise_batch_norms(model, seed=0)
    return _one_tensor(model.eval(), call, "pixel_values"), what


def _call_plain(model, x):
    return model(x)


def _call_logits(model, pixel_values):
    return model(pixel_values=pixel_values).logits


def _call_hidden(model, pixel_values):
    return model(pixel_values=pixel_values).last_hidden_state


def _call_unet(model, sample, timestep, encoder_hidden_states):
    return model(sample, timestep, encoder_hidden_states, return_dict=False)[0]


def _call_decode(model, latents):
    return model.decode(latents, return_dict=False)[0]


def _vit(tiny: bool, impl: str = "auto"):
    """Hugging Face `ViTModel(ViTConfig())`: ViT-base, 224 x 224 images in 16 x 16 patches (197
    tokens), 12 layers, 768 wide, 12 heads; no pooler; the last hidden state. Tiny: 32 x 32 images
    in 8 x 8 patches, 2 layers, 32 wide, 4 heads."""
    import torch
    import transformers

    torch.manual_seed(0)
    values = {}
    if tiny:
        values = {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "image_size": 32,
            "patch_size": 8,
        }
    model = transformers.ViTModel(transformers.ViTConfig(**values), add_pooling_layer=False)
    what = "Hugging Face ViTModel(ViTConfig(" + ("tiny))" if tiny else ")), ViT-base/16 at 224")
    return _one_tensor(model.eval(), _call_hidden, "pixel_values"), what


def _image_size(tiny: bool) -> int:
    """Images of the ResNet and the ViT: 224 x 224 (ViT-base's config); tiny 32 x 32."""
    return 32 if tiny else 224


def _images(batch: int, tiny: bool, dtype, seed: int):
    import torch

    size = _image_size(tiny)
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, size, size, generator=g).to(dtype),)


def _image_shape(batch: int, tiny: bool) -> str:
    size = _image_size(tiny)
    return f"{batch} x 3 x {size} x {size}"


# The UNet: diffusers' UNet2DConditionModel at a small config, two resolutions with
# cross-attention on the first and in the middle (the arrangement of diffusers' own tests and of
# Stable Diffusion's, fewer and narrower blocks): latents 4 x 32 x 32, 77 text tokens of 64.
_UNET = {
    "full": {
        "block_out_channels": (64, 128),
        "cross_attention_dim": 64,
        "attention_head_dim": 8,  # diffusers reads it as the number of heads
        "norm_num_groups": 32,
        "sample_size": 32,
        "tokens": 77,
    },
    "tiny": {
        "block_out_channels": (16, 32),
        "cross_attention_dim": 16,
        "attention_head_dim": 4,
        "norm_num_groups": 8,
        "sample_size": 8,
        "tokens": 5,
    },
}


def _unet(tiny: bool, impl: str = "auto"):
    import diffusers
    import torch

    c = _UNET["tiny" if tiny else "full"]
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=c["sample_size"],
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=c["block_out_channels"],
        layers_per_block=1,
        cross_attention_dim=c["cross_attention_dim"],
        attention_head_dim=c["attention_head_dim"],
        norm_num_groups=c["norm_num_groups"],
    )
    what = (
        f"diffusers {diffusers.__version__} UNet2DConditionModel(block_out_channels="
        f"{c['block_out_channels']}, layers_per_block=1, cross_attention_dim="
        f"{c['cross_attention_dim']}, {c['attention_head_dim']} heads)"
    )
    return _one_tensor(model.eval(), _call_unet, "unet"), what


def _unet_inputs(batch: int, tiny: bool, dtype, seed: int):
    """Latents and text states N(0, 1), timesteps drawn from 0..999 (int64: diffusers computes
    their sinusoidal embedding in float32 whatever the model's dtype)."""
    import torch

    c = _UNET["tiny" if tiny else "full"]
    g = torch.Generator().manual_seed(seed)
    size = c["sample_size"]
    sample = torch.randn(batch, 4, size, size, generator=g).to(dtype)
    timestep = torch.randint(0, 1000, (batch,), generator=g)
    text = torch.randn(batch, c["tokens"], c["cross_attention_dim"], generator=g).to(dtype)
    return sample, timestep, text


def _unet_shape(batch: int, tiny: bool) -> str:
    c = _UNET["tiny" if tiny else "full"]
    size = c["sample_size"]
    return f"{batch} x 4 x {size} x {size}, {c['tokens']} tokens"


# The VAE decoder: diffusers' AutoencoderKL at a small config, its `decode` (post-quant 1x1
# convolution, then the decoder: mid block with self-attention, up blocks of res-nets and
# nearest upsampling, GroupNorm, SiLU): latents 4 x 32 x 32 to images 3 x 128 x 128.
_VAE = {
    "full": {"block_out_channels": (64, 128, 256), "norm_num_groups": 32, "latent": 32},
    "tiny": {"block_out_channels": (8, 16), "norm_num_groups": 4, "latent": 8},
}


def _vae(tiny: bool, impl: str = "auto"):
    import diffusers
    import torch

    c = _VAE["tiny" if tiny else "full"]
    blocks = len(c["block_out_channels"])
    torch.manual_seed(0)
    model = diffusers.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks,
        block_out_channels=c["block_out_channels"],
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=c["norm_num_groups"],
        sample_size=c["latent"] * 2 ** (blocks - 1),
    )
    what = (
        f"diffusers {diffusers.__version__} AutoencoderKL(block_out_channels="
        f"{c['block_out_channels']}, layers_per_block=1).decode"
    )
    return _one_tensor(model.eval(), _call_decode, "latents"), what


def _vae_inputs(batch: int, tiny: bool, dtype, seed: int):
    import torch

    size = _VAE["tiny" if tiny else "full"]["latent"]
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 4, size, size, generator=g).to(dtype),)


def _vae_shape(batch: int, tiny: bool) -> str:
    size = _VAE["tiny" if tiny else "full"]["latent"]
    return f"{batch} x 4 x {size} x {size}"


VISION = {
    s.name: s
    for s in (
        VisionSpec(
            "resnet50",
            "ResNet-50 (torchvision resnet50(weights=None), else Hugging Face ResNetConfig()), "
            "224 x 224 images, logits of 1000",
            _resnet50,
            _images,
            _image_shape,
        ),
        VisionSpec(
            "vit",
            "ViT-base/16 (Hugging Face ViTModel(ViTConfig())), 224 x 224 images, last hidden state",
            _vit,
            _images,
            _image_shape,
        ),
        VisionSpec(
            "unet",
            "diffusers UNet2DConditionModel, small (block_out_channels (64, 128), one layer per "
            "block, cross-attention to 77 x 64 text states), latents 4 x 32 x 32",
            _unet,
            _unet_inputs,
            _unet_shape,
            batches=(2, 8),
            # the timestep embedding is float32 in diffusers (sin and cos of float32
            # arguments), so a float64 model carries float32 rounding: numpy's and PyTorch's
            # float32 sin/cos differ in the last bit
            f64_tolerance=1e-6,
        ),
        VisionSpec(
            "vae",
            "diffusers AutoencoderKL decode, small (block_out_channels (64, 128, 256), one layer "
            "per block), latents 4 x 32 x 32 to images 3 x 128 x 128",
            _vae,
            _vae_inputs,
            _vae_shape,
        ),
    )
}
MODELS = (*SPECS, *VISION)  # every name --only takes, in report order


@dataclass
class Built:
    """A model ready to export: `module` (eval mode, on the CPU, in its dtype) returns one tensor;
    `inputs(seed)` are its forward's tensors on the CPU."""

    module: object
    inputs: Callable
    shape: str
    params: int
    title: str


def make(
    name: str,
    dtype,
    batch: int,
    *,
    tiny: bool,
    seq: int = 512,
    resnet: str = "auto",
    llama_hidden: int | None = None,
) -> Built:
    """Model `name` (a text model of SPECS or a vision model of VISION) built in `dtype`."""
    if name in SPECS:
        spec = SPECS[name]
        extra = overrides(name, tiny, llama_hidden)
        model = build(spec, tiny, extra, dtype)
        vocab = model.config.vocab_size
        return Built(
            wrap(model, spec.output),
            lambda seed: (token_ids(vocab, batch, seq, seed),),
            f"{batch} x {seq}",
            sum(p.numel() for p in model.parameters()),
            spec.title if not tiny else f"{name} (tiny config)",
        )
    spec = VISION[name]
    module, what = spec.build(tiny, resnet)
    module = module.to(dtype).eval()
    return Built(
        module,
        lambda seed: spec.inputs(batch, tiny, dtype, seed),
        spec.shape(batch, tiny),
        sum(p.numel() for p in module.parameters()),
        what,
    )


# -- where a plan's time goes --------------------------------------------------------------------


GUESSED = ("estimated", "roofline")  # planner/cost.py's sources other than "measured"


def plan_calls(func) -> list[dict]:
    """Each kernel call and copy of planned function `func` (select-kernels' output: every op a
    `kernel.call` or `kernel.copy` annotated by planner/materialise.py), in program order:
    `callee` (a copy: "kernel.copy <from>-><to>"), `what` (the op it runs or its region's ops,
    operand and result types, the `param.` choices it runs with), its planned `seconds` and
    their `source` ("measured", "estimated", "roofline"; "none" for a call with no annotation),
    and whether it is a `once` step (planner/fixed.py: it reads only parameters and constants,
    so it runs when the parameters change, not on every call: packing weights, copying a
    constant made on the host to the device)."""
    from tgc.planner.fixed import Fixed

    fixed = Fixed()
    calls = []
    for op in func.walk():
        if op.name == "kernel.call":
            callee = str(op.attributes.get("callee"))
            what = op.attributes.get("op") or _region_ops(op)
        elif op.name == "kernel.copy":
            src, dst = op.operands[0].type.encoding, op.results[0].type.encoding
            callee, what = f"kernel.copy {src or 'host'}->{dst or 'host'}", "copy"
        else:
            continue
        operands = ", ".join(str(v.type) for v in op.operands)
        results = ", ".join(str(r.type) for r in op.results)
        params = " ".join(
            f"{k[len('param.') :]}={v}" for k, v in op.attributes.items() if k.startswith("param.")
        )
        calls.append(
            {
                "callee": callee,
                "what": f"{what} ({operands}) -> {results}" + (f" [{params}]" if params else ""),
                "seconds": float(op.attributes.get("plan.seconds", 0.0)),
                "source": str(op.attributes.get("plan.source", "none")),
                "once": op.block is func.body and fixed.runs_once(op),
            }
        )
    return calls


def _region_ops(call) -> str:
    """A generated kernel's region in a few words: its distinct ops, constants aside."""
    names = [
        op.name
        for region in call.regions
        for block in region.blocks
        for op in block.ops
        if op.name not in ("atomic.constant", "kernel.yield")
    ]
    distinct = list(dict.fromkeys(names))
    shown = "+".join(distinct[:4]) + ("+..." if len(distinct) > 4 else "")
    return f"region of {len(names)} ops ({shown})"


def plan_breakdown(func, top: int = PLAN_TOP) -> dict:
    """Where planned function `func` expects its time to go, by its own annotations: the number
    of calls, their planned seconds in all, how many costs came from each source; per callee
    (the `top` dearest) the calls, seconds, and how many were measured and how many guessed
    (estimated from other measurements, or the roofline); and the `top` dearest calls one by
    one. A kernel planned on a guess that runs slower than guessed shows here as a large call
    with a guessed source; one planned on a measurement that runs slower shows as a
    measured cost below its profile's time (GPT-2's LM head on an H200 ran tgc's generated
    matmul at 773 µs where padded cuBLAS takes ~230, and nothing said on what cost it was
    chosen: bench/results/real-models-profile-gpt2-bf16-NVIDIA-H200-2026-11-28-b.txt).
    Once steps are counted apart (`once_calls`, `once_seconds`): a call does not run them
    (BERT's twelve attention masks, made on the host and copied to the device, were 4.7 of its
    6.4 planned ms when they were summed with the rest)."""
    everything = plan_calls(func)
    calls = [c for c in everything if not c["once"]]
    once = [c for c in everything if c["once"]]
    by_callee: dict[str, dict] = {}
    sources: dict[str, int] = {}
    for c in calls:
        sources[c["source"]] = sources.get(c["source"], 0) + 1
        entry = by_callee.setdefault(
            c["callee"], {"callee": c["callee"], "calls": 0, "seconds": 0.0, "measured": 0}
        )
        entry["calls"] += 1
        entry["seconds"] += c["seconds"]
        entry["measured"] += c["source"] == "measured"
    for entry in by_callee.values():
        entry["guessed"] = entry["calls"] - entry["measured"]
    return {
        "calls": len(calls),
        "seconds": sum(c["seconds"] for c in calls),
        "once_calls": len(once),
        "once_seconds": sum(c["seconds"] for c in once),
        "sources": dict(sorted(sources.items())),
        "callees": sorted(by_callee.values(), key=lambda e: -e["seconds"])[:top],
        "largest": sorted(calls, key=lambda c: -c["seconds"])[:top],
    }


def _callee_line(e: dict) -> str:
    return (
        f"{e['callee']}: {e['calls']} call(s), {e['seconds'] * 1e6:.1f} µs planned, "
        f"{e['measured']} measured / {e['guessed']} guessed"
    )


def _call_line(c: dict) -> str:
    return f"{c['seconds'] * 1e6:.1f} µs {c['source']}: {c['callee']} {c['what']}"


def plan_summary(breakdown: dict, chosen: str = "") -> dict:
    """`breakdown` (plan_breakdown) as a row's JSON field: totals as numbers, the callees and
    calls as one line each (the lines of plan_text)."""
    return {
        "chosen": chosen,
        "calls": breakdown["calls"],
        "planned_ms": round(breakdown["seconds"] * 1e3, 4),
        "once_calls": breakdown["once_calls"],
        "once_planned_ms": round(breakdown["once_seconds"] * 1e3, 4),
        "sources": breakdown["sources"],
        "callees": [_callee_line(e) for e in breakdown["callees"]],
        "largest": [_call_line(c)[:200] for c in breakdown["largest"]],
    }


def plan_text(breakdown: dict, title: str) -> str:
    sources = ", ".join(f"{n} {s}" for s, n in breakdown["sources"].items()) or "none"
    return "\n".join(
        [
            f"# {title}",
            "",
            f"{breakdown['calls']} kernel calls and copies, {breakdown['seconds'] * 1e3:.3f} ms "
            f"planned in all (the sum of the planner's costs, not a timing); costs: {sources}",
            f"and {breakdown['once_calls']} once steps, {breakdown['once_seconds'] * 1e3:.3f} ms "
            "planned, run when the parameters change, not on every call",
            "(guessed = estimated from other measurements, or the roofline model: planner/cost.py)",
            "",
            f"## by callee, the {len(breakdown['callees'])} dearest",
            "",
            *[_callee_line(e) for e in breakdown["callees"]],
            "",
            f"## the {len(breakdown['largest'])} dearest calls",
            "",
            *[_call_line(c) for c in breakdown["largest"]],
            "",
        ]
    )


# -- the dry run (no GPU) ---------------------------------------------------------------------------


DRY_DTYPES = {"f32": "float32", "f64": "float64", "bf16": "bfloat16"}


def dry_tolerance(name: str, dtype_name: str) -> float:
    """The dry run's check: numpy against PyTorch on the CPU, relative to max |PyTorch| (bf16:
    against the float32 reference, the GPU rows' rule, `error_limit`)."""
    if dtype_name == "f32":
        return DRY_TOLERANCE
    if dtype_name in REFERENCE:
        return TOLERANCE[dtype_name]
    return VISION[name].f64_tolerance if name in VISION else 1e-10


def dry_dtype(name: str, given: str | None) -> str:
    """The dry run's dtype: `given`, else f32 for a text model (as the GPU's f32 row) and f64 for
    a vision model (its float64 check against PyTorch's)."""
    return given or ("f64" if name in VISION else "f32")


@dataclass
class DryCase:
    """A model exported and imported on the CPU, and what to check it with: `arguments` are the
    imported function's (parameters, then fresh inputs, seed 2, not the export's), `want` is
    the reference output on them: PyTorch's in the case's dtype, or for bf16 the float32
    reference (`reference_output`), against which PyTorch's bf16 output is `eager_error` off."""

    built: Built
    imported: object
    arguments: list
    want: np.ndarray
    export_s: float
    import_s: float
    eager_error: float = 0.0


def dry_case(
    name: str,
    dtype_name: str,
    batch: int,
    *,
    tiny: bool,
    seq: int = 16,
    resnet: str = "auto",
    llama_hidden: int | None = None,
) -> DryCase:
    import torch

    dtype = getattr(torch, DRY_DTYPES[dtype_name])
    built = make(name, dtype, batch, tiny=tiny, seq=seq, resnet=resnet, llama_hidden=llama_hidden)
    ep, imported, export_s, import_s = export_and_import(built.module, built.inputs(1))
    fresh = built.inputs(2)
    with torch.no_grad():
        eager = built.module(*fresh)
    arguments = [host_array(t) for t in (*parameter_tensors(ep), *fresh)]
    if dtype_name not in REFERENCE:
        return DryCase(built, imported, arguments, eager.numpy(), export_s, import_s)
    want = reference_output(built.module, fresh, "cpu")
    eager_error = rel_error(as_host(eager), want)
    return DryCase(built, imported, arguments, want, export_s, import_s, eager_error)


def host_array(t) -> np.ndarray:
    """A CPU torch tensor as the numpy array tgc's interpreter takes: bf16 as ml_dtypes' bfloat16
    (numpy has none; through float32, which holds every bf16 value exactly)."""
    import torch

    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy()


@dataclass
class DryRow:
    model: str
    dtype: str = "-"
    shape: str = "-"
    params: str = "-"
    imported: str = "-"
    reference: str = "-"
    interpreter: str = "-"
    planned: str = "-"
    note: str = ""
    failed: bool = False


def dry_run_one(name: str, batch: int, args) -> DryRow:
    import tgc
    from tgc.pass_manager import PassManager
    from tgc.planner.executor import run_plan
    from tgc.planner.select import select_kernels

    dtype_name = dry_dtype(name, args.dry_dtype)
    row = DryRow(name, dtype_name)
    tolerance = dry_tolerance(name, dtype_name)
    try:
        case = dry_case(
            name,
            dtype_name,
            batch,
            tiny=args.tiny,
            seq=args.seq or 16,
            resnet=args.resnet,
            llama_hidden=args.llama_hidden,
        )
        row.shape = case.built.shape
        row.params = f"{case.built.params / 1e6:.2f} M"
        row.imported = (
            f"ok ({count_ops(case.imported)} ops; export {case.export_s:.1f} s, "
            f"import {case.import_s:.1f} s)"
        )
    except Exception as e:  # noqa: BLE001  (a model that fails gets its row, the others run)
        row.imported, row.note, row.failed = "failed", one_line(e), True
        return row
    imported, inputs, want = case.imported, case.arguments, case.want
    tolerance = error_limit(tolerance, case.eager_error)
    row.reference = (
        f"PyTorch {dtype_name}"
        if dtype_name not in REFERENCE
        else f"PyTorch {REFERENCE[dtype_name]} (its {dtype_name} {case.eager_error:.1e} off; "
        f"limit {tolerance:.1e})"
    )
    row.interpreter = _checked(
        lambda: tgc.run(imported, inputs)[0], want, row, "interpreter", tolerance
    )
    try:
        t0 = time.perf_counter()
        PassManager.from_text("lower-for-planning").run(imported)
        select_kernels(imported.funcs[0], tolerance=1e-5, backends=("numpy",))
        plan_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        row.planned, row.failed = "failed", True
        row.note += f" numpy plan: {one_line(e)};"
        return row
    row.planned = _checked(
        lambda: run_plan(imported.funcs[0], inputs)[0], want, row, "numpy plan", tolerance
    )
    breakdown = plan_breakdown(imported.funcs[0])
    row.planned += (
        f"; planned in {plan_s:.1f} s: {breakdown['calls']} calls, "
        f"{breakdown['seconds'] * 1e3:.3f} ms planned"
    )
    if args.out:  # the GPU rows' plan file, written alike (here all roofline costs)
        path = Path(args.out) / f"plan-{name}-{dtype_name}-b{batch}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plan_text(breakdown, f"{name} {dtype_name} batch {batch}, numpy plan"))
    return row


def _checked(
    run: Callable[[], np.ndarray], want: np.ndarray, row: DryRow, what: str, tolerance: float
) -> str:
    t0 = time.perf_counter()
    try:
        got = run()
    except Exception as e:  # noqa: BLE001
        row.failed = True
        row.note += f" {what}: {one_line(e)};"
        return "failed"
    err = rel_error(got, want)
    verdict = "ok" if err <= tolerance else "WRONG"
    row.failed |= verdict != "ok"
    return f"{verdict}, error {err:.1e} ({time.perf_counter() - t0:.1f} s)"


def dry_table(rows: list[DryRow]) -> list[str]:
    lines = [
        "| model | dtype | input | parameters | export + import | reference (CPU) | numpy "
        "interpreter vs reference | numpy plan (lower-for-planning, select-kernels) vs "
        "reference | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.dtype} | {r.shape} | {r.params} | {r.imported} | {r.reference} | "
            f"{r.interpreter} | {r.planned} | {r.note.strip()} |"
        )
    return lines


# -- on the GPU ---------------------------------------------------------------------------------


@dataclass
class ModeResult:
    first_s: float | None = None  # first call, compile included
    ms: float | None = None  # steady state, median
    error: float | None = None  # against the row's reference, relative to max |reference|
    note: str = ""


@dataclass
class Row:
    model: str
    dtype: str
    shape: str = ""
    params: str = ""
    batch: int = 0
    title: str = ""  # what was built (the ResNet's implementation, the configs)
    running: str = ""  # the step under way when the row was last saved ("" once it is done)
    tgc_first_s: float | None = None  # import + compile_module + first call
    tgc_import_s: float | None = None
    tgc_compile_s: float | None = None  # compile_module's first use (lower, measure, plan, check)
    tgc_steps_s: dict = field(default_factory=dict)  # its steps: lower, measure, plan, check
    tgc_measured: int | None = None
    tgc_second_plan_s: float | None = None  # compile_module again, same database: its plan time
    tgc_second_first_use_s: float | None = None
    tgc_second_measured: int | None = None
    tgc_ms: float | None = None  # calls replayed as CUDA graphs (the route's default)
    tgc_plain_ms: float | None = None  # the same plan launched kernel by kernel
    tgc_host_us: float | None = None  # host time to queue one call, replayed
    tgc_plain_host_us: float | None = None  # and launched kernel by kernel
    tgc_graphs: str = ""  # "replayed", or why not
    # what the errors are measured against: "f32" (eager on the weights upcast, a bf16 row's) or
    # "eager" (an f32 row's own; a row written before the f32 reference has no such key)
    reference: str = ""
    eager_error: float | None = None  # eager in the row's dtype against the reference
    tgc_error: float | None = None  # against the reference, relative to max |reference|
    tgc_limit: float | None = None  # the largest tgc_error passed (error_limit)
    tgc_plan: dict = field(default_factory=dict)  # plan_summary of the plan that ran
    tgc_chosen: str = ""
    tgc_candidates: dict = field(default_factory=dict)
    modes: dict = field(default_factory=dict)  # mode -> ModeResult as a dict
    note: str = ""


def as_host(value) -> np.ndarray:
    """A tgc result (or a torch tensor) as a float64 host array: bf16 goes through float32
    (a torch CUDA tensor's `__cuda_array_interface__` has no bf16)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy().astype(np.float64)
    if hasattr(value, "get"):  # the CUDA backend's DeviceArray
        return np.asarray(value.get()).astype(np.float64)
    return torch.as_tensor(value, device="cuda").float().cpu().numpy().astype(np.float64)


class CutOff(BaseException):
    """SIGTERM (the caller's `timeout`) arrived: the row so far is saved, the run ends. Not an
    Exception, so that no model's `except Exception` takes it for the model's failure."""


def gpu_one(row: Row, args, db: str, save: Callable[[], None] = lambda: None) -> Row:
    """Row `row` (its model, dtype and batch given) measured; `save()` is called after each step
    with `row.running` naming the next, so that a run cut off by a timeout leaves what it had."""
    import torch

    name, dtype_name, batch = row.model, row.dtype, row.batch
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    row.running = "build, export, import"
    try:
        built = make(
            name,
            dtype,
            batch,
            tiny=args.tiny,
            seq=args.seq or 512,
            resnet=args.resnet,
            llama_hidden=args.llama_hidden,
        )
        row.shape, row.title = built.shape, built.title
        row.params = f"{built.params / 1e6:.1f} M"
        module = built.module
        t0 = time.perf_counter()
        ep, imported, _, import_s = export_and_import(module, built.inputs(1))
        row.tgc_import_s = import_s
        export_s = time.perf_counter() - t0 - import_s
        params = [t.detach().to("cuda").contiguous() for t in parameter_tensors(ep)]
    except Exception as e:  # noqa: BLE001
        row.note, row.running = f"export/import failed: {one_line(e)}", ""
        return row
    cpu_inputs = built.inputs(2)
    inputs = tuple(t.to("cuda") for t in cpu_inputs)
    want = None
    if dtype_name in REFERENCE:
        row.running = f"{REFERENCE[dtype_name]} reference"
        save()
        try:  # from the CPU module (a copy, upcast, then moved): the row's own stays as it is
            want = reference_output(module, cpu_inputs, "cuda")
            row.reference = REFERENCE[dtype_name]
        except Exception as e:  # noqa: BLE001  (out of memory, say: eager is the reference)
            row.note += f" {REFERENCE[dtype_name]} reference failed, eager is: {one_line(e)};"
        gc.collect()
        torch.cuda.empty_cache()
    row.running = "eager"
    save()
    module = module.to("cuda")
    stream = torch.cuda.current_stream()

    def eager():
        with torch.no_grad():
            return module(*inputs)

    got = as_host(eager())
    if want is None:
        want, row.reference = got, "eager"
    row.eager_error = rel_error(got, want)
    del got
    torch.cuda.synchronize()
    profiles = [] if args.profile else None
    for mode in args.modes:
        row.running = f"PyTorch {mode}"
        row.modes[mode] = asdict(torch_mode(module, inputs, mode, want, stream, profiles))
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
        save()
    row.running = "tgc compile_module (first use) and first call"
    run_tgc(row, imported, params, inputs, want, stream, args, db, dtype_name, profiles, save)
    row.running = ""
    if profiles:
        out = out_dir(args) / f"profile-{name}-{dtype_name}-b{batch}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(profiles))
    row.note = (row.note + f" (torch.export {export_s:.1f} s, not in tgc's first run)").strip()
    return row


def run_tgc(
    row: Row,
    imported,
    params,
    inputs,
    want,
    stream,
    args,
    db: str,
    dtype_name: str,
    profiles=None,
    save: Callable[[], None] = lambda: None,
):
    """tgc's first run, second plan and steady state into `row` (errors noted, not raised;
    `save()` after the first run and after the steady state)."""
    import torch

    import tgc
    from tgc.planner.route import RouteOptions, compile_module
    from tgc.printer import print_module

    options = RouteOptions(db=db, measure_budget=args.measure_budget)
    values = [*params, *inputs]
    # the second compile's module: compile_module lowers its module in place, and importing
    # `ep` again fails once the model's parameters have moved to the GPU
    text = print_module(imported)
    try:
        t0 = time.perf_counter()
        prog = compile_module(imported, options=options)
        row.tgc_compile_s = time.perf_counter() - t0
        outs = prog(values)
        got = as_host(outs[0])  # synchronises
        row.tgc_first_s = row.tgc_import_s + time.perf_counter() - t0
        report = prog.report
        row.tgc_steps_s = {
            step: round(getattr(report, f"{step}_s"), 2)
            for step in ("lower", "measure", "plan", "check")
        }
        row.tgc_measured = report.measured
        row.tgc_chosen = str(report.chosen)
        row.tgc_candidates = {k: round(float(v), 4) for k, v in report.candidates.items()}
        write_plan(row, prog.func, out_dir(args))
        row.tgc_error = rel_error(got, want)
        row.tgc_limit = error_limit(TOLERANCE[dtype_name], row.eager_error)
        row.running = "tgc steady state"
        save()
        if row.tgc_error <= row.tgc_limit:
            row.tgc_ms = time_ms(lambda: prog(values), stream)
            row.tgc_plain_ms = time_ms(lambda: prog.planned(values), stream)
            row.tgc_host_us = host_us(lambda: prog(values))
            row.tgc_plain_host_us = host_us(lambda: prog.planned(values))
            reason = getattr(prog.runner, "reason", "graphs off")
            row.tgc_graphs = "replayed" if reason is None else reason
            if profiles is not None:
                profiles.append(kernel_table(lambda: prog(values), "tgc"))
        else:
            row.note += (
                f" tgc differs from the {row.reference} reference by {row.tgc_error:.2e} "
                f"(limit {row.tgc_limit:.2e}: max({TOLERANCE[dtype_name]:g}, 2 x eager's "
                f"{row.eager_error:.2e}));"
            )
    except Exception as e:  # noqa: BLE001
        row.note += f" tgc failed: {one_line(e)};"
        return
    finally:
        prog = None
        gc.collect()
        torch.cuda.empty_cache()
    row.running = "tgc second compile"
    save()
    try:
        second = compile_module(tgc.parse(text), options=options)
        row.tgc_second_plan_s = second.report.plan_s
        row.tgc_second_first_use_s = second.report.first_use_s
        row.tgc_second_measured = second.report.measured
    except Exception as e:  # noqa: BLE001
        row.note += f" tgc second compile failed: {one_line(e)};"


def out_dir(args) -> Path:
    return Path(args.out or ROOT / "bench" / "results")


def write_plan(row: Row, func, out: Path) -> None:
    """The breakdown of the plan that runs (`func`, the chosen candidate's planned function) into
    `row.tgc_plan` and plan-<model>-<dtype>-b<batch>.txt in `out`; a failure is noted, not
    raised (the row's times do not depend on it)."""
    try:
        breakdown = plan_breakdown(func)
        row.tgc_plan = plan_summary(breakdown, row.tgc_chosen)
        title = (
            f"{row.model} {row.dtype} {row.shape}: the plan that runs ('{row.tgc_chosen}' of the "
            "whole-plan check; 'default' is planned on the roofline alone)"
        )
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"plan-{row.model}-{row.dtype}-b{row.batch}.txt"
        path.write_text(plan_text(breakdown, title))
    except Exception as e:  # noqa: BLE001
        row.note += f" plan breakdown failed: {one_line(e)};"


def keep_db(row: Row, db: str, out: Path) -> None:
    """A copy of the measurement database `db` as measurements-<model>-<dtype>-b<batch>.sqlite
    in `out`, for the next session to read what was measured (the default database is in a
    temporary folder, gone when the run ends). sqlite's backup, not a file copy: it copies a
    consistent state even when the row was cut off while a write was under way."""
    import sqlite3

    if not Path(db).exists():
        return  # the row ended before tgc opened it
    target = out / f"measurements-{row.model}-{row.dtype}-b{row.batch}.sqlite"
    try:
        out.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        src, dst = sqlite3.connect(db, timeout=5), sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
    except Exception as e:  # noqa: BLE001
        row.note += f" keeping the measurement database failed: {one_line(e)};"


def host_us(call, calls: int = 20) -> float:
    """Microseconds of host time to queue one call (the GPU may still be running them)."""
    import torch

    call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    queued = time.perf_counter() - start
    torch.cuda.synchronize()
    return queued / calls * 1e6


def kernel_table(call, title: str, rows: int = 25) -> str:
    """The GPU kernels of 3 calls of `call` by total time (torch.profiler), as text."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            call()
        torch.cuda.synchronize()
    table = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90
    )
    return f"## {title} (3 calls)\n\n{table}\n"


def torch_mode(module, inputs, mode: str, want: np.ndarray, stream, profiles=None) -> ModeResult:
    import torch

    result = ModeResult()
    try:
        fn = compiled_for(module, mode)

        def call():
            with torch.no_grad():
                return fn(*inputs)

        t0 = time.perf_counter()
        got = as_host(call())  # copies out before a CUDA graph replay can overwrite it
        result.first_s = time.perf_counter() - t0
        result.error = rel_error(got, want)
        result.ms = time_ms(call, stream)
        if profiles is not None:
            profiles.append(kernel_table(call, f"PyTorch {mode}"))
        if mode == BACKEND_MODE:
            result.note = backend_tally()
    except Exception as e:  # noqa: BLE001  (whatever torch.compile raises: report, go on)
        result.note = one_line(e)
    return result


def compiled_for(module, mode: str):
    """`module` as `mode` runs it: itself (eager), torch.compile's mode, or tgc's backend (whose
    tally of graphs is cleared first)."""
    import torch

    if mode == "eager":
        return module
    if mode == BACKEND_MODE:
        from tgc.dynamo import reset_coverage

        reset_coverage()
        return torch.compile(module, backend="tgc")
    return torch.compile(module, mode=None if mode == "default" else mode)


def backend_tally() -> str:
    """How much of the model tgc's backend ran (its tally, tgc/dynamo/tally.py: a graph that
    ran faster eagerly, compare_eager, is not in tgc)."""
    from tgc.dynamo import coverage

    return coverage().summary()


# -- the report ---------------------------------------------------------------------------------


def commit_of(given: str | None) -> str:
    import subprocess

    if given:
        return given
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        if proc.returncode == 0:
            return proc.stdout.strip()
    except OSError:
        pass
    return "unknown"


def versions() -> str:
    parts = [f"python {sys.version.split()[0]}", f"numpy {np.__version__}"]
    for module in ("torch", "transformers", "torchvision", "diffusers", "pycuda", "triton"):
        try:
            parts.append(f"{module} {importlib.metadata.version(module)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{module} absent")
    return ", ".join(parts)


def fmt_ms(ms) -> str:
    return "-" if ms is None else f"{ms:.3f} ms"


def fmt_s(s) -> str:
    return "-" if s is None else f"{s:.1f} s"


def gpu_table(rows: list[dict], modes: list[str]) -> list[str]:
    head = [
        "model",
        "dtype",
        "input",
        "tgc first run",
        "tgc 2nd plan",
        "tgc",
        "tgc, no graphs",
        "host per call (graphs / none)",
        "tgc error",
        *[m if m != "default" else "compile default" for m in modes],
        "note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["dtype"], r["shape"]]
        first = fmt_s(r["tgc_first_s"])
        if r["tgc_measured"] is not None:
            first += f" ({r['tgc_measured']} measured)"
        cells.append(first)
        second = "-"
        if r["tgc_second_plan_s"] is not None:
            second = (
                f"{r['tgc_second_plan_s']:.2f} s (compile {r['tgc_second_first_use_s']:.1f} s, "
                f"{r['tgc_second_measured']} measured)"
            )
        cells.append(second)
        ms = fmt_ms(r["tgc_ms"])
        cells.append(f"**{ms}**" if r["tgc_ms"] is not None and _fastest(r) else ms)
        cells.append(fmt_ms(r.get("tgc_plain_ms")))
        host, plain_host = r.get("tgc_host_us"), r.get("tgc_plain_host_us")
        cells.append("-" if host is None else f"{host:.0f} / {plain_host:.0f} µs")
        cells.append(_error_cell(r))
        notes = [r["note"]] if r["note"] else []
        if r.get("running") and "cut off" not in r["note"]:
            notes.append(f"unfinished: stopped during {r['running']}")
        for m in modes:
            res = r["modes"].get(m)
            if res is None:
                cells.append("not run")
                continue
            cell = fmt_ms(res["ms"])
            if res["first_s"] is not None and m != "eager":
                cell += f" (first {res['first_s']:.0f} s)"
            cells.append(cell)
            if res["note"]:
                notes.append(f"{m}: {res['note']}")
        cells.append("; ".join(n.replace("|", "/") for n in notes))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _error_cell(r: dict) -> str:
    """tgc's error and the limit it was held to; "vs eager" marks a row written before errors
    were measured against a reference (its error is against eager, its limit the tolerance)."""
    if r["tgc_error"] is None:
        return "-"
    cell = f"{r['tgc_error']:.1e}"
    limit = r.get("tgc_limit")
    if limit is not None:
        cell += f" ({'<=' if r['tgc_error'] <= limit else '>'} {limit:.1e})"
    if not r.get("reference"):
        cell += " vs eager"
    return cell


def _fastest(r: dict) -> bool:
    others = [m["ms"] for m in r["modes"].values() if m["ms"] is not None]
    return all(r["tgc_ms"] <= o for o in others)


def gpu_report(rows: list[dict], device: str, commit: str, args) -> list[str]:
    today = datetime.date.today().isoformat()
    titles = {}
    for r in rows:  # what was built, in report order (a row of an older run may have no title)
        titles.setdefault(r["model"], r.get("title") or _registry_title(r["model"]))
    lines = [
        f"# Real models through tgc's GPU route: {device}, {today}",
        "",
        f"- device: {device}; date: {today}; commit: {commit}",
        f"- versions: {versions()}",
        "- models (transformers, torchvision or diffusers, from their configs with random "
        "weights, seed 0, batch norm statistics drawn; exported with torch.export on the CPU, "
        "imported with tgc's torch importer, parameters as arguments):",
        *[f"  - {n}: {t}" for n, t in titles.items()],
        "- tgc: `compile_module` (planner/route.py) with a fresh measurement database "
        f"(measure budget {args.measure_budget:g} s); *first run* = import + compile_module "
        "(lower, measure, plan, whole-plan check) + first call; *2nd plan* = compile_module again "
        "on a fresh import with the same database (its plan time)",
        "- method: bench/gpu_suite.py's: medians of 30 calls timed with CUDA events after 3 "
        "warm-ups, a sleep kernel queued first; PyTorch modes on the same inputs, `(first N s)` "
        "their first call, compile included",
        "- checks: every result (tgc's, eager's, each torch.compile mode's) against a reference, "
        "max |difference| / max |reference|: a bf16 row's reference is the same model with its "
        "bf16 weights upcast to float32, run eagerly on the GPU on the same inputs (eager "
        "bf16's own error against it is what bf16 rounding costs PyTorch); an f32 row's is "
        "eager f32 itself. tgc's time "
        f"is kept when its error is at most max({TOLERANCE['bf16']:g} (bf16) / "
        f"{TOLERANCE['f32']:g} (f32), 2 x eager's own error): *tgc error* shows it with that "
        "limit; **bold**: tgc fastest of the row; f32 convolutions in f32 everywhere "
        "(torch.backends.cudnn.allow_tf32 = False; PyTorch's default runs them in TF32)",
        "- plans: plan-<model>-<dtype>-b<batch>.txt (and the row's `tgc_plan` in the .json) "
        "list the kernels of the plan that ran by planned cost, per callee and call by call, "
        "and how many costs were measured or guessed",
        "",
        *gpu_table(rows, args.modes),
        "",
    ]
    for r in rows:
        if r["tgc_candidates"]:
            times = ", ".join(f"{k} {v:.3f} ms" for k, v in r["tgc_candidates"].items())
            lines.append(
                f"- {r['model']} {r['dtype']} {r['shape']}: whole plans {times}; ran "
                f"'{r['tgc_chosen']}'; CUDA graphs: {r.get('tgc_graphs') or '-'}"
            )
        errors = {m: v["error"] for m, v in r["modes"].items() if v["error"] is not None}
        reference = r.get("reference")
        if reference and reference != "eager":
            if r.get("eager_error") is not None:
                errors["eager"] = r["eager_error"]  # also where eager is not among --modes
            text = ", ".join(f"{m} {e:.1e}" for m, e in errors.items())
            if r["tgc_error"] is not None:
                text += f", tgc {r['tgc_error']:.1e}"
            lines.append(
                f"- {r['model']} {r['dtype']} {r['shape']}: errors against the {reference} "
                f"reference: {text}"
            )
        elif any(m != "eager" for m in errors):
            text = ", ".join(f"{m} {e:.1e}" for m, e in errors.items() if m != "eager")
            lines.append(
                f"- {r['model']} {r['dtype']} {r['shape']}: PyTorch modes against eager: {text}"
            )
        plan = r.get("tgc_plan") or {}
        if plan.get("callees"):
            sources = ", ".join(f"{n} {s}" for s, n in plan["sources"].items())
            lines.append(
                f"- {r['model']} {r['dtype']} {r['shape']}: plan '{plan['chosen']}', "
                f"{plan['calls']} calls, {plan['planned_ms']:.3f} ms planned ({sources})"
                + (
                    f" and {plan['once_calls']} once steps, {plan['once_planned_ms']:.3f} ms"
                    if plan.get("once_calls")
                    else ""
                )
                + f"; dearest: {'; '.join(plan['callees'][:3])}"
            )
    return lines + [""]


def _registry_title(name: str) -> str:
    spec = SPECS.get(name) or VISION.get(name)
    return spec.title if spec is not None else name


def _order(r: dict) -> tuple:
    model = list(MODELS).index(r["model"]) if r["model"] in MODELS else len(MODELS)
    return model, r["dtype"], r.get("batch", 0), r["shape"]


def overrides(name: str, tiny: bool, llama_hidden: int | None) -> dict:
    if name == "llama" and llama_hidden and not tiny:
        return {"hidden_size": llama_hidden, "intermediate_size": int(llama_hidden * 11008 / 4096)}
    return {}


def batches(name: str, given: str | None, dry: bool) -> list[int]:
    """`--batch` (comma-separated), else a text model's 4 (dry run 2) and a vision model's own
    (dry run 1 and 2)."""
    if given:
        return [int(b) for b in given.split(",") if b]
    if name in VISION:
        return [1, 2] if dry else list(VISION[name].batches)
    return [2] if dry else [4]


def results_path(out: Path, device: str) -> Path:
    from gpu_suite import device_slug

    return out / f"real-models-{device_slug(device)}-{datetime.date.today().isoformat()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", default="", help=f"comma-separated models (default all: {','.join(MODELS)})"
    )
    ap.add_argument(
        "--vision", action="store_true", help=f"the vision models: --only {','.join(VISION)}"
    )
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: bf16,f32")
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"PyTorch modes to run beside tgc (also {BACKEND_MODE}: torch.compile(backend='tgc'))",
    )
    ap.add_argument(
        "--batch",
        default=None,
        help="comma-separated batch sizes, a row each (default: text 4, dry run 2; vision each "
        "model's, 1,8 (unet 2,8), dry run 1,2)",
    )
    ap.add_argument("--seq", type=int, default=None, help="tokens each (default 512; dry run 16)")
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="small configs (text: 2 layers, hidden 64; vision: 32 x 32 images, few channels)",
    )
    ap.add_argument("--llama-hidden", type=int, default=None, help="Llama's hidden size (2048)")
    ap.add_argument(
        "--resnet",
        default="auto",
        choices=("auto", "torchvision", "hf"),
        help="ResNet-50 from torchvision (auto: where it imports) or Hugging Face transformers",
    )
    ap.add_argument("--measure-budget", type=float, default=30.0, help="tgc's, seconds")
    ap.add_argument("--db", default=None, help="measurement database (default: a fresh one)")
    ap.add_argument(
        "--keep-db",
        action="store_true",
        help="copy the measurement database into --out after each row, as "
        "measurements-<model>-<dtype>-b<batch>.sqlite",
    )
    ap.add_argument("--dry-run", action="store_true", help="no GPU: import and numpy checks")
    ap.add_argument(
        "--dry-dtype",
        default=None,
        choices=tuple(DRY_DTYPES),
        help="the dry run's dtype (default: f32 for text models, f64 for vision models)",
    )
    ap.add_argument("--commit", default=None, help="commit to report (default: git's HEAD)")
    ap.add_argument(
        "--out", default=None, help="report folder (default bench/results; dry run none)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="also write each run's GPU kernels by time"
    )
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if args.vision:
        names += [n for n in VISION if n not in names]
    names = names or list(MODELS)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.modes = [m for m in args.modes.split(",") if m]
    for given, known, what in (
        (names, MODELS, "model"),
        (args.dtypes, DTYPES, "dtype"),
        (args.modes, (*MODES, BACKEND_MODE), "mode"),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            ap.error(f"unknown {what}(s) {unknown}; known: {list(known)}")
    try:
        for name in names:
            batches(name, args.batch, args.dry_run)
    except ValueError:
        ap.error(f"--batch takes comma-separated integers, not {args.batch!r}")
    import tgc

    tgc.load_all()
    if args.dry_run:
        return dry_run(names, args)
    return gpu_run(names, args)


def dry_run(names: list[str], args) -> int:
    rows = []
    for name in names:
        for batch in batches(name, args.batch, dry=True):
            t0 = time.time()
            rows.append(dry_run_one(name, batch, args))
            print(f"{name} batch {batch}: {time.time() - t0:.1f} s {rows[-1]}", flush=True)
    f64 = ", ".join(
        f"{n} {dry_tolerance(n, 'f64'):g}" for n in names if dry_dtype(n, args.dry_dtype) == "f64"
    )
    lines = [
        f"# Real models, dry run (no GPU): {datetime.date.today().isoformat()}",
        "",
        f"- commit: {commit_of(args.commit)}; versions: {versions()}",
        f"- {'tiny configs' if args.tiny else 'full configs'}; text models {args.seq or 16} "
        "tokens a sequence; exported at inputs of seed 1, checked on fresh ones (seed 2)",
        f"- checks: max |numpy - PyTorch| relative to max |PyTorch|, at most {DRY_TOLERANCE:g} "
        "in f32"
        + (f"; in f64 {f64}" if f64 else "")
        + (
            f"; in bf16 against a float32 reference (the model's bf16 weights upcast, run by "
            f"PyTorch), max |numpy - reference| relative to max |reference| at most "
            f"max({TOLERANCE['bf16']:g}, 2 x PyTorch bf16's own error), the GPU rows' rule"
            if any(dry_dtype(n, args.dry_dtype) in REFERENCE for n in names)
            else ""
        ),
        "",
        *dry_table(rows),
        "",
    ]
    print("\n".join(lines))
    if args.out:
        path = Path(args.out) / f"real-models-dry-run-{datetime.date.today().isoformat()}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path}")
    return 1 if any(r.failed for r in rows) else 0


def gpu_run(names: list[str], args) -> int:
    import signal

    import torch

    # f32 means f32: PyTorch lets cuDNN run f32 convolutions in TF32 by default (matmuls it does
    # not), which would put eager and torch.compile's f32 vision rows 1e-3 off f32
    torch.backends.cudnn.allow_tf32 = False
    device = torch.cuda.get_device_name()
    base = results_path(out_dir(args), device)
    store = base.with_suffix(".json")
    rows = json.loads(store.read_text()) if store.exists() else {}
    commit = commit_of(args.commit)
    lines: list[str] = []

    def save(row: Row) -> None:
        nonlocal lines
        rows[f"{row.model}/{row.dtype}/{row.shape or row.batch}"] = asdict(row)
        base.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(rows, indent=1) + "\n")
        lines = gpu_report(sorted(rows.values(), key=_order), device, commit, args)
        base.with_suffix(".md").write_text("\n".join(lines))

    def cut_off(signum, frame):
        raise CutOff

    signal.signal(signal.SIGTERM, cut_off)
    with tempfile.TemporaryDirectory(prefix="tgc-real-models-") as tmp:
        db = args.db or str(Path(tmp) / "measurements.sqlite")
        for name in names:
            for dtype_name in args.dtypes:
                for batch in batches(name, args.batch, dry=False):
                    t0 = time.time()
                    row = Row(name, dtype_name, batch=batch)
                    try:
                        gpu_one(row, args, db, lambda: save(row))
                    except CutOff:
                        row.note += f" cut off by SIGTERM (its timeout) during {row.running};"
                        if args.keep_db:  # what it measured before the cut is the most telling
                            keep_db(row, db, base.parent)
                        save(row)
                        print(f"{name} {dtype_name} batch {batch}: {row}", flush=True)
                        print(f"cut off; wrote {base.with_suffix('.md')}", flush=True)
                        return 124
                    if args.keep_db:
                        keep_db(row, db, base.parent)
                    print(
                        f"{name} {dtype_name} batch {batch}: {time.time() - t0:.0f} s {row}",
                        flush=True,
                    )
                    save(row)
                    gc.collect()
                    torch.cuda.empty_cache()
    print("\n".join(lines))
    print(f"wrote {base.with_suffix('.md')}")
    failed = [r for r in rows.values() if r["tgc_ms"] is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The torch.export importer (tgc.importers.torch): small nn.Modules exported, imported, run on
the numpy interpreter and compared with PyTorch on fresh random inputs (not the example inputs of
the export); and every refusal checked by its message.

Tolerances: a model exported in float64 is compared with PyTorch in float64 at rtol 1e-10,
atol 1e-12 (only the order of the sums differs); a float32 model run in float32 at rtol 1e-4,
atol 1e-5 (float32 rounding, about 1e-7 relative per op, through a few dozen ops).
"""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is an optional extra (pip install 'tgc[torch]'); CI has none, so the "
    "torch.export importer is tested where it is installed",
)
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import tgc  # noqa: E402
from tgc.diagnostics import TgcError  # noqa: E402
from tgc.importers.torch import (  # noqa: E402
    import_exported_program,
    import_file,
    import_module,
    parameter_values,
)

F64 = {"rtol": 1e-10, "atol": 1e-12}
F32 = {"rtol": 1e-4, "atol": 1e-5}
THIS_FILE = Path(__file__).resolve()


def _export(model: nn.Module, args: tuple, **kw):
    return torch.export.export(model.eval(), args, **kw)


def _fresh(args: tuple, seed: int) -> tuple:
    """Inputs of the example arguments' shapes and dtypes with new random values."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for a in args:
        if a.dtype.is_floating_point:
            out.append(torch.randn(a.shape, dtype=a.dtype, generator=g))
        elif a.dtype == torch.bool:
            out.append(torch.rand(a.shape, generator=g) < 0.5)
        else:  # indices: below the smallest table they index (the tests keep tables >= 10)
            out.append(torch.randint(0, 10, a.shape, dtype=a.dtype, generator=g))
    return tuple(out)


def _numpy(x: torch.Tensor) -> np.ndarray:
    if x.dtype == torch.bfloat16:
        return x.float().numpy().astype(ml_dtypes.bfloat16)
    return x.numpy()


def _run(module, ep, inputs, precision="native"):
    args = parameter_values(ep) + [_numpy(x) for x in inputs]
    return tgc.run(module, args, precision=precision)


def check(model: nn.Module, example: tuple, tol=F64, seed=0, **import_kw):
    """Export `model` at `example`'s shapes, import it, run it on fresh inputs, compare."""
    model = model.eval()
    ep = _export(model, example)
    module = import_exported_program(ep, **import_kw)
    inputs = _fresh(example, seed)
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    if import_kw.get("params_as_args", True):
        got = _run(module, ep, inputs)
    else:
        got = tgc.run(module, [x.numpy() for x in inputs])
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == tuple(e.shape)
        assert g.dtype == e.numpy().dtype
        np.testing.assert_allclose(g, e.numpy(), **tol)
    return module


def _f64(shape, *more):
    return (torch.randn(shape, dtype=torch.float64),) + tuple(
        torch.randn(s, dtype=torch.float64) for s in more
    )


# -- models -----------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d=16, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def test_mlp_matches_pytorch():
    module = check(MLP().double(), _f64((8, 16)))
    text = tgc.print_ir(module)
    assert text.count("hl.linear") == 2
    assert 'hl.gelu %linear {approximate = "tanh"}' in text


def test_mlp_float32_runs_in_float32():
    module = check(MLP(), (torch.randn(4, 16),), tol=F32)
    assert "f64" not in tgc.print_ir(module)


class NormGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32, eps=1e-6)
        self.rms = nn.RMSNorm(32)
        self.bare = nn.LayerNorm(32, elementwise_affine=False)

    def forward(self, x):
        return F.gelu(self.ln(x)), self.rms(x), self.bare(x)


def test_layernorm_rmsnorm_gelu():
    module = check(NormGelu().double(), _f64((2, 5, 32)))
    text = tgc.print_ir(module)
    assert text.count("hl.layernorm") == 2 and "hl.rmsnorm" in text
    assert "eps = 1.0e-06" in text
    assert 'hl.gelu %layer_norm {approximate = "none"}' in text


class NativeLayerNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8, dtype=torch.float64))
        self.b = nn.Parameter(torch.randn(4, 8, dtype=torch.float64))

    def forward(self, x):
        return torch.native_layer_norm(x, [4, 8], self.w, self.b, 1e-5)


def test_native_layer_norm_returns_mean_and_rstd():
    check(NativeLayerNorm(), _f64((3, 4, 8)))


class Attention(nn.Module):
    """SDPA in the forms models use: causal, additive float mask, boolean mask, explicit scale."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form

    def forward(self, q, k, v, mask=None):
        if self.form == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.form == "scale":
            return F.scaled_dot_product_attention(q, k, v, scale=0.3)
        if self.form == "gqa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("form", ["causal", "scale"])
def test_attention(form):
    module = check(Attention(form), _f64((2, 3, 6, 8), (2, 3, 6, 8), (2, 3, 6, 8)))
    text = tgc.print_ir(module)
    assert "hl.attention" in text
    assert ("causal = true" in text) == (form == "causal")


def test_attention_causal_with_fewer_queries_is_top_left():
    """PyTorch's is_causal with 3 queries and 7 keys: query i sees keys 0..i (hl.attention's own
    causal would align to the bottom right)."""
    module = check(Attention("causal"), _f64((2, 3, 8), (2, 7, 8), (2, 7, 8)))
    assert "causal = true" not in tgc.print_ir(module)


def test_attention_float_mask():
    q, k, v = _f64((2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 8))
    check(Attention("mask"), (q, k, v, torch.randn(5, 6, dtype=torch.float64)))


def test_attention_bool_mask():
    q, k, v = _f64((2, 5, 8), (2, 6, 8), (2, 6, 8))
    mask = torch.ones(2, 5, 6, dtype=torch.bool)
    model = Attention("mask").eval()
    ep = _export(model, (q, k, v, mask))
    module = import_exported_program(ep)
    q, k, v = _fresh((q, k, v), 1)
    mask = torch.rand(2, 5, 6) < 0.7
    mask[..., 0] = True  # every query sees one key at least (else PyTorch returns NaN rows)
    (got,) = _run(module, ep, (q, k, v, mask))
    np.testing.assert_allclose(got, model(q, k, v, mask).numpy(), **F64)


def test_attention_grouped_query_heads():
    check(Attention("gqa"), _f64((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)))


class Block(nn.Module):
    """A GPT-2 block with its embeddings: wte + wpe, then pre-norm attention (qkv in one linear,
    heads split, causal SDPA) and a tanh-GELU MLP, each with a residual; a final norm and the
    tied head."""

    def __init__(self, vocab=50, seq=8, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("pos", torch.arange(seq))

    def forward(self, ids):
        b, s = ids.shape
        x = self.drop(self.wte(ids) + self.wpe(self.pos[:s]))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(a.transpose(1, 2).contiguous().view(b, s, -1)))
        x = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return self.lnf(x) @ self.wte.weight.T


def test_gpt2_block_float64():
    ids = torch.randint(0, 10, (2, 8))
    module = check(Block().double(), (ids,))
    func = module.funcs[0]
    names = [a.name_hint for a in func.args]
    assert names[0] == "wte.weight" and names[-2:] == ["pos", "ids"]
    assert all(func.is_param(i) for i in range(len(names) - 1))
    assert not func.is_param(len(names) - 1)


def test_gpt2_block_float32():
    check(Block(), (torch.randint(0, 10, (2, 8)),), tol=F32, seed=3)


def test_gpt2_block_survives_optimize():
    """The imported module is ordinary tgc IR: the optimize pipeline keeps its meaning."""
    model = Block().double().eval()
    ids = torch.randint(0, 10, (2, 8))
    ep = _export(model, (ids,))
    module = import_exported_program(ep)
    tgc.run_pipeline(module, "optimize")
    (fresh,) = _fresh((ids,), 5)
    (got,) = _run(module, ep, (fresh,))
    np.testing.assert_allclose(got, model(fresh).detach().numpy(), **F64)


def test_params_as_constants():
    model = MLP(8, 16).double()
    module = check(model, _f64((3, 8)), params_as_args=False)
    func = module.funcs[0]
    assert [a.name_hint for a in func.args] == ["x"]
    assert not func.is_param(0)
    assert tgc.print_ir(module).count("atomic.constant") == 4


def test_printed_module_parses_back():
    module = import_module(Block().double().eval(), (torch.randint(0, 10, (2, 8)),))
    text = tgc.print_ir(module)
    assert "%wte.weight: tensor<50x32xf64> {tgc.param}" in text
    assert tgc.print_ir(tgc.parse(text)) == text


# -- op coverage ------------------------------------------------------------------------------------


class Elementwise(nn.Module):
    def forward(self, x, y):
        p = x.abs() + 0.5
        return (
            p.pow(2) + p.pow(3.0) + p.pow(0.5) + torch.pow(2.0, x) + p.pow(y.abs() + 1),
            torch.exp(x) - torch.log(p) * torch.sqrt(p) / torch.rsqrt(p),
            -x + torch.tanh(x) + torch.sigmoid(y) + torch.relu(x) + F.silu(y) + torch.erf(x),
            torch.sin(x) * torch.cos(y) + torch.reciprocal(p) + F.leaky_relu(x, 0.2),
            F.hardtanh(x, -0.5, 0.5) + F.hardswish(y) + F.relu6(x * 4),
            1 - x * 2 + x / 3 - torch.rsub(y, 2, alpha=3) + torch.add(x, y, alpha=2),
            torch.maximum(x, y) + torch.minimum(x, y) + x.clamp(-0.3, 0.4) + y.clamp(min=0),
            torch.where(x > y, x, y) + torch.where(x < 0, 0.0, x) + x.masked_fill(y > 0, -1.0),
        )


def test_elementwise_ops():
    check(Elementwise(), _f64((4, 6), (4, 6)))


class Logic(nn.Module):
    def forward(self, x, y):
        a, b = x > 0, y >= 0
        c = (a & b) | ~(x == y) ^ (x != 0)
        return (
            c,
            torch.logical_and(a, b) | torch.logical_or(x <= 0, y < 0),
            torch.logical_not(a),
            a.any(dim=1),
            b.all(),
        )


def test_comparisons_and_logic():
    check(Logic(), _f64((4, 6), (4, 6)))


class Promotion(nn.Module):
    """PyTorch's type promotion: int tensor with a float scalar, int / int (true division), a sum
    of bools (int64), float32 with a rank-0 float64 (stays float32), casts."""

    def forward(self, i, j, x):
        return (
            i + 1.5,
            i / j,
            torch.div(i, j, rounding_mode="trunc"),
            (x > 0).sum(dim=-1),
            x + torch.tensor(2.0, dtype=torch.float64),
            x.to(torch.int32),
            i.float() * x,
            torch.exp(i),
            i > x,
        )


def test_type_promotion():
    i = torch.randint(-9, 10, (3, 4))
    j = torch.randint(1, 5, (3, 4))
    x = torch.randn(3, 4)
    model = Promotion().eval()
    ep = _export(model, (i, j, x))
    module = import_exported_program(ep)
    got = _run(module, ep, (i, j, x))
    for g, e in zip(got, model(i, j, x)):
        assert g.dtype == e.numpy().dtype, (g.dtype, e.dtype)
        np.testing.assert_allclose(g, e.numpy(), **F32)


class Reductions(nn.Module):
    def forward(self, x):
        return (
            x.sum(),
            x.sum(dim=(0, 2)),
            x.sum(-1, keepdim=True),
            x.mean(),
            x.mean(dim=1),
            x.amax(dim=-1),
            x.amin(dim=(0, 1), keepdim=True),
            x.max(),
            x.min(dim=1).values,
            x.max(dim=0, keepdim=True)[0],
            x.var(dim=-1),
            x.var(dim=1, unbiased=False, keepdim=True),
            x.std(dim=0),
            x.softmax(dim=1),
            F.log_softmax(x, dim=0),
        )


def test_reductions_and_softmax():
    check(Reductions(), _f64((3, 4, 5)))


class Shapes(nn.Module):
    def forward(self, x, idx):
        a, b, c = x.split([1, 2, 3], dim=-1)
        d, e = x.chunk(2, dim=1)
        parts = x.unbind(0)
        return (
            x.view(6, -1).reshape(3, 2, 6).permute(2, 0, 1),
            x.transpose(0, 2),
            x[0].t(),
            x[:, 1:, ::2],
            x[1, :, -1],
            x[..., None].squeeze(-1).unsqueeze(1).expand(3, 4, 2, 6),
            torch.cat([a, c, b], dim=-1),
            torch.stack([d, e], dim=0),
            parts[2] + parts[0],
            x.flatten(1),
            x.index_select(2, idx),
            x[:, :, idx],
            x.mT @ x,
            x.clone().detach().contiguous(),
            x.gather(1, idx[:3].clamp(max=1).view(3, 1, 1).expand(3, 1, 6)),
            x.gather(-1, idx.view(1, 1, 4).expand(2, 2, 4)),
        )


def test_shape_ops():
    idx = torch.tensor([5, 0, 2, 2])
    module = import_module(Shapes(), (torch.randn(3, 2, 6, dtype=torch.float64), idx))
    ep = _export(Shapes(), (torch.randn(3, 2, 6, dtype=torch.float64), idx))
    (x,) = _fresh((torch.randn(3, 2, 6, dtype=torch.float64),), 9)
    got = tgc.run(module, [x.numpy(), np.array([1, 5, 0, 4])])
    expected = Shapes()(x, torch.tensor([1, 5, 0, 4]))
    assert len(got) == len(expected) == len(ep.graph_signature.output_specs)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e.numpy(), **F64)


def test_gather_index_out_of_range_fails_when_run():
    """torch.gather with an index past its dim: an error, not the element of the next row."""

    class Along(nn.Module):
        def forward(self, x, idx):
            return x.gather(1, idx)

    x = torch.randn(3, 4, dtype=torch.float64)
    module = import_module(Along(), (x, torch.zeros(3, 2, dtype=torch.int64)))
    idx = torch.tensor([[0, 3], [1, 2], [3, 0]])
    (got,) = tgc.run(module, [x.numpy(), idx.numpy()])
    np.testing.assert_array_equal(got, x.gather(1, idx).numpy())
    with pytest.raises(TgcError, match=r"'atomic.gather' op index -1 .* is out of range"):
        tgc.run(module, [x.numpy(), np.array([[0, 4], [1, 2], [3, 0]])])


def test_negative_index_tensor_counts_from_the_end():
    class Take(nn.Module):
        def forward(self, x, idx):
            return x[:, idx]

    x = torch.randn(3, 5, dtype=torch.float64)
    module = import_module(Take(), (x, torch.tensor([0, 1])))
    idx = torch.tensor([-1, -5])
    (got,) = tgc.run(module, [x.numpy(), idx.numpy()])
    np.testing.assert_array_equal(got, x[:, idx].numpy())


@pytest.mark.parametrize(
    "where", ["all-dims", "middle-dims", "broadcast"], ids=["all", "middle", "broadcast"]
)
def test_several_index_tensors_on_adjacent_dims(where):
    """x[i0, i1] (a padding mask read at [batch, position], as BERT's is) and x[:, i0, i1]:
    one gather from x with the indexed dims merged, the result in PyTorch's shape; negative
    indices count from the end; index tensors broadcast against each other."""
    rng = np.random.default_rng()

    class Take(nn.Module):
        def forward(self, x, i0, i1):
            return x[:, i0, i1] if where == "middle-dims" else x[i0, i1]

    x = torch.from_numpy(rng.standard_normal((4, 5, 6)))
    if where == "broadcast":
        i0 = torch.from_numpy(rng.integers(-4, 4, (3, 1)))
        i1 = torch.from_numpy(rng.integers(-5, 5, (1, 2)))
    else:
        lo, hi = (5, 6) if where == "middle-dims" else (4, 5)
        i0 = torch.from_numpy(rng.integers(-lo, lo, (2, 3)))
        i1 = torch.from_numpy(rng.integers(-hi, hi, (2, 3)))
    module = import_module(Take(), (x, i0, i1))
    (got,) = tgc.run(module, [x.numpy(), i0.numpy(), i1.numpy()])
    want = Take()(x, i0, i1).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_index_tensors_on_dims_apart_are_refused():
    class Apart(nn.Module):
        def forward(self, x, i0, i1):
            return x[i0, :, i1]

    x = torch.randn(4, 5, 6, dtype=torch.float64)
    idx = torch.tensor([0, 1])
    with pytest.raises(TgcError, match="index tensors on dims that are not adjacent"):
        import_module(Apart(), (x, idx, idx))


class Products(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(5, dtype=torch.float64))

    def forward(self, a, b, v, c):
        return (
            torch.mm(a, b),
            torch.bmm(c, c.transpose(1, 2)),
            torch.matmul(v, b),
            torch.matmul(a, v[:4]),
            torch.matmul(v[:4], v[:4]),
            torch.addmm(self.bias, a, b, beta=0.5, alpha=2.0),
            torch.baddbmm(c[:, :, :3], c, c.transpose(1, 2)[:, :, :3], beta=0.0),
            F.linear(a, b.T),
        )


def test_matrix_products():
    check(Products(), _f64((3, 4), (4, 5), (4,), (2, 3, 4)))


class Factories(nn.Module):
    def forward(self, x):
        n = x.shape[-1]
        ramp = torch.arange(n, dtype=x.dtype)
        mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), diagonal=1)
        return (
            x + ramp * 2 + torch.ones(n, dtype=x.dtype) + torch.zeros_like(x),
            x @ torch.eye(n, dtype=x.dtype) + mask,
            torch.full_like(x, 7.0) * x,
        )


def test_factories_fold_to_constants():
    module = check(Factories(), _f64((4, 4)))
    text = tgc.print_ir(module)
    assert "atomic.iota" not in text and "atomic.constant" in text


def test_decompose_false_on_a_core_aten_program():
    """A program the user brought to core aten themselves (SDPA as the math decomposition with
    its boolean mask and safe softmax) imports as it is."""
    model = Block().double().eval()
    ids = torch.randint(0, 10, (2, 8))
    ep = _export(model, (ids,)).run_decompositions()
    module = import_exported_program(ep, decompose=False)
    text = tgc.print_ir(module)
    assert "hl.attention" not in text and "hl.linear" not in text
    (fresh,) = _fresh((ids,), 11)
    (got,) = _run(module, ep, (fresh,))
    np.testing.assert_allclose(got, model(fresh).detach().numpy(), **F64)


class Rounding(nn.Module):
    """Every rounding op on floats: tensor and Python-number operands, on either side."""

    def forward(self, x, y):
        return (
            torch.floor(x),
            torch.ceil(x),
            torch.round(x),
            torch.trunc(x),
            torch.fix(x),
            torch.frac(x),
            torch.round(x, decimals=2),
            torch.round(x, decimals=-1),
            torch.remainder(x, y),
            x % -1.5,
            torch.remainder(2.5, y),
            torch.fmod(x, y),
            torch.fmod(x, -0.7),
            torch.floor_divide(x, y),
            x // -0.3,
            1.0 // y,
            torch.div(x, y, rounding_mode="floor"),
            torch.div(x, y, rounding_mode="trunc"),
            torch.div(x, 0.3, rounding_mode="trunc"),
        )


def _rounding_inputs(dtype: torch.dtype, seed: int) -> tuple:
    """Fresh random x and y with the cases that tell roundings apart: halves (round goes to the
    even neighbour), 1 // 0.1 (9 in PyTorch, floor(1 / 0.1) is 10), divisors of 0 (IEEE),
    negative divisors, infinities, NaN and -0.0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 40, generator=g, dtype=torch.float64) * 8
    y = torch.randn(6, 40, generator=g, dtype=torch.float64) * 2
    x[0, :20] = torch.arange(-10, 10) + 0.5
    x[1, :4] = 1.0
    y[1, :4] = torch.tensor([0.1, -0.1, 0.0, -0.0])
    y[2] = -y[2].abs()
    x[3, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    y[3, 4:6] = torch.tensor([float("inf"), -float("inf")])
    return x.to(dtype), y.to(dtype)


def _as_comparable(x) -> np.ndarray:
    """A result as numpy, bfloat16 as float32 (exactly)."""
    if isinstance(x, torch.Tensor):
        return x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
    return x.astype(np.float32) if x.dtype == ml_dtypes.bfloat16 else x


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_rounding_ops_match_pytorch_exactly(dtype):
    """floor, ceil, round (decimals 0, 2, -1), trunc, remainder, fmod and both rounding modes of
    division equal PyTorch to the bit (NaN where PyTorch has NaN) on fresh inputs, in every float
    type: the lowerings follow PyTorch's CPU kernels, their float32 steps for float16 included."""
    model = Rounding().eval()
    module = import_module(model, _rounding_inputs(dtype, 0))
    x, y = _rounding_inputs(dtype, 1)
    got = tgc.run(module, [_numpy(x), _numpy(y)])
    expected = model(x, y)
    assert len(got) == len(expected)
    for index, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == tuple(e.shape)
        np.testing.assert_array_equal(_as_comparable(g), _as_comparable(e), err_msg=str(index))
    if dtype == torch.float64:
        assert got[2][0, 12] == 2.0 and got[2][0, 7] == -2.0  # round(2.5), round(-2.5)
        assert got[13][1, 0] == 9.0  # 1.0 // 0.1, as Python
    text = tgc.print_ir(module)
    for op in ("atomic.floor", "atomic.ceil", "atomic.round", "atomic.mod"):
        assert op in text
    assert "{fmod = true}" in text


class IntegerRounding(nn.Module):
    def forward(self, i, j):
        return (
            torch.floor(i),
            torch.round(i),
            torch.trunc(i),
            i % j,
            torch.fmod(i, j),
            i % -3,
            torch.fmod(i, -3),
            torch.remainder(7, j),
            i // j,
            i // -3,
            torch.div(i, j, rounding_mode="trunc"),
            torch.div(i, j, rounding_mode="floor"),
            i // 2.5,
            i % 1.5,
        )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8], ids=str)
def test_integer_rounding_ops_match_pytorch(dtype):
    """On integers: floor/round/trunc are the tensor, remainder has the divisor's sign, fmod the
    dividend's, floor division rounds down (trunc toward 0), for negative dividends and
    divisors; with a float operand PyTorch's promotion makes them float ops."""
    model = IntegerRounding().eval()
    g = torch.Generator().manual_seed(2)
    example = (torch.ones(50, dtype=dtype), torch.ones(50, dtype=dtype))
    module = import_module(model, example)
    i = torch.randint(-100, 100, (50,), generator=g).to(dtype)
    j = torch.randint(-9, 10, (50,), generator=g).to(dtype)
    j[j == 0] = -4  # PyTorch raises on an integer divisor of 0
    got = tgc.run(module, [i.numpy(), j.numpy()])
    expected = model(i, j)
    assert len(got) == len(expected)
    for index, (g_, e) in enumerate(zip(got, expected)):
        assert g_.dtype == e.numpy().dtype, (index, g_.dtype, e.dtype)
        np.testing.assert_array_equal(g_, e.numpy(), err_msg=str(index))
    assert (j < 0).any() and (i < 0).any()


def test_floor_divide_and_fix_as_exported():
    """decompose=False: aten.floor_divide and aten.fix as torch.export leaves them (before the
    decomposition into div(rounding_mode='floor') and trunc)."""

    class FloorDivide(nn.Module):
        def forward(self, x, y, i, j):
            return x // y, torch.fix(x), x // -0.1, i // j, torch.floor_divide(i, -3)

    model = FloorDivide().eval()
    x, y = _rounding_inputs(torch.float64, 5)
    ints = torch.randint(-50, 50, (2, 40), generator=torch.Generator().manual_seed(6))
    i, j = ints[0], ints[1].clamp(-7, 7)
    j[j == 0] = -2
    ep = _export(model, (x, y, i, j))
    assert "aten.floor_divide.default" in str(ep.graph) and "aten.fix.default" in str(ep.graph)
    module = import_exported_program(ep, decompose=False)
    x, y = _rounding_inputs(torch.float64, 7)
    got = tgc.run(module, [x.numpy(), y.numpy(), i.numpy(), j.numpy()])
    for index, (g, e) in enumerate(zip(got, model(x, y, i, j))):
        assert g.dtype == e.numpy().dtype
        np.testing.assert_array_equal(g, e.numpy(), err_msg=str(index))


def test_integer_division_by_zero_is_zero():
    """Where PyTorch raises ZeroDivisionError, the imported function gives 0 (tgc's rule for
    integer division and remainder, docs/ir.md), and the other elements are PyTorch's."""
    model = IntegerRounding().eval()
    example = (torch.ones(4, dtype=torch.int64), torch.ones(4, dtype=torch.int64))
    module = import_module(model, example)
    i = torch.tensor([7, -7, 7, -7])
    j = torch.tensor([0, 0, 2, 2])
    got = tgc.run(module, [i.numpy(), j.numpy()])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        model(i, j)
    nonzero = model(i[2:], j[2:])
    for index in (3, 4, 7, 8, 10, 11):  # every output that divides by j
        np.testing.assert_array_equal(got[index][:2], [0, 0])
        np.testing.assert_array_equal(got[index][2:], nonzero[index].numpy())


def test_bfloat16_parameters():
    model = MLP(8, 16).to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    ep = _export(model, (x,))
    module = import_exported_program(ep)
    assert "bf16" in tgc.print_ir(module)
    (got,) = _run(module, ep, (x,))
    expected = model(x).float().detach().numpy()
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=0.05, atol=0.05)


# -- files ------------------------------------------------------------------------------------------


def test_pt2_file(tmp_path):
    model = MLP(8, 16).double().eval()
    x = torch.randn(2, 8, dtype=torch.float64)
    ep = _export(model, (x,))
    path = tmp_path / "mlp.pt2"
    torch.export.save(ep, path)
    module = import_file(path)
    (got,) = _run(module, ep, (x,))
    np.testing.assert_allclose(got, model(x).detach().numpy(), **F64)


def test_pt2_file_missing_or_corrupt(tmp_path):
    with pytest.raises(TgcError, match=r"cannot read '.*nothing\.pt2': no such file"):
        import_file(tmp_path / "nothing.pt2")
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(TgcError) as e:
        import_file(bad)
    assert re.match(
        r"cannot read '.*bad\.pt2' as a program saved by torch\.export\.save: ", e.value.message
    )
    assert "\n" not in e.value.message


# -- tgc-import model.pt2 ---------------------------------------------------------------------------


def _save_mlp(folder: Path, d: int = 16, hidden: int = 128):
    """An MLP in float64 saved with torch.export.save: its weights have d * hidden = 2048
    elements (more than --inline-limit's 1024), its biases fewer."""
    torch.manual_seed(0)
    model = MLP(d, hidden).double().eval()
    path = folder / "mlp.pt2"
    torch.export.save(_export(model, (torch.randn(4, d, dtype=torch.float64),)), path)
    return model, path


def _tgc_import(argv: list[str]) -> int:
    from tgc.tools.import_ import main

    return main(argv)


def _tgc_run(tg: Path, inputs: dict[str, np.ndarray], folder: Path) -> list[np.ndarray]:
    """tgc-run on `tg` with each argument bound to a .npy file; its results, read back."""
    from tgc.tools.run import main

    argv = [str(tg), "-o", str(folder / "results")]
    for name, array in inputs.items():
        np.save(folder / f"in_{name}.npy", array)
        argv += ["--input", f"{name}={folder / f'in_{name}.npy'}"]
    assert main(argv) == 0
    count = len(list((folder / "results").glob("result_*.npy")))
    return [np.load(folder / "results" / f"result_{i}.npy") for i in range(count)]


def test_tgc_import_pt2_weights_in_files(tmp_path, capsys):
    """tgc-import model.pt2 -o model.tg: the parameters are constants, those of more than
    --inline-limit elements in model.weights/<state-dict key>.npy (their exact values), the
    others inline; tgc-run on the .tg computes what the module computes in PyTorch."""
    model, pt2 = _save_mlp(tmp_path)
    tg = tmp_path / "model.tg"
    assert _tgc_import([str(pt2), "-o", str(tg)]) == 0
    text = tg.read_text()
    assert text.startswith("func.func @forward(%x: tensor<4x16xf64>) -> tensor<4x16xf64>")
    for key, shape in (("fc1.weight", "128x16"), ("fc2.weight", "16x128")):
        assert (
            f'%{key} = atomic.constant {{value = dense_file<"model.weights/{key}.npy"> : '
            f"tensor<{shape}xf64>}}" in text
        )
        stored = np.load(tmp_path / "model.weights" / f"{key}.npy")
        np.testing.assert_array_equal(stored, model.state_dict()[key].numpy())
    assert sorted(p.name for p in (tmp_path / "model.weights").iterdir()) == [
        "fc1.weight.npy",
        "fc2.weight.npy",
    ]
    assert "%fc1.bias = atomic.constant {value = dense<[" in text
    x = torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (got,) = _tgc_run(tg, {"x": x.numpy()}, tmp_path)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), **F64)
    # --inline-limit raises the bound; -o - (stdout) keeps every constant inline.
    assert _tgc_import([str(pt2), "-o", str(tmp_path / "inline.tg"), "--inline-limit", "4096"]) == 0
    assert "dense_file" not in (tmp_path / "inline.tg").read_text()
    capsys.readouterr()
    assert _tgc_import([str(pt2), "-o", "-"]) == 0
    out = capsys.readouterr().out
    assert "dense_file" not in out and "%fc2.weight = atomic.constant" in out


def test_tgc_import_pt2_weights_as_args(tmp_path):
    """--weights-as-args: the parameters are {tgc.param} arguments named by their state-dict
    keys, before the inputs, and no weights folder is written; --func names the function."""
    model, pt2 = _save_mlp(tmp_path)
    tg = tmp_path / "model.tg"
    assert _tgc_import([str(pt2), "-o", str(tg), "--weights-as-args", "--func", "mlp"]) == 0
    text = tg.read_text()
    assert text.startswith(
        "func.func @mlp(%fc1.weight: tensor<128x16xf64> {tgc.param}, %fc1.bias: "
        "tensor<128xf64> {tgc.param}, %fc2.weight: tensor<16x128xf64> {tgc.param}, "
        "%fc2.bias: tensor<16xf64> {tgc.param}, %x: tensor<4x16xf64>)"
    )
    assert "atomic.constant" not in text
    assert not (tmp_path / "model.weights").exists()
    x = torch.randn(4, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    params = {k: v.numpy() for k, v in model.state_dict().items()}
    (got,) = _tgc_run(tg, {**params, "x": x.numpy()}, tmp_path)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), **F64)


def test_tgc_import_corrupt_pt2_is_one_line(tmp_path, capfd):
    """A .pt2 that is not a saved program is one line naming it and exit 1, with nothing of
    what PyTorch logs while it tries: random bytes, a cut file, an empty file, a zip of
    something else, a damaged program, a folder, a missing file."""
    import zipfile

    _, pt2 = _save_mlp(tmp_path)
    data = pt2.read_bytes()
    (tmp_path / "noise.pt2").write_bytes(np.random.default_rng(0).bytes(3000))
    (tmp_path / "cut.pt2").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.pt2").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "other.pt2", "w") as z:
        z.writestr("hello.txt", "hi")
    with zipfile.ZipFile(pt2) as src, zipfile.ZipFile(tmp_path / "damaged.pt2", "w") as dst:
        for name in src.namelist():
            content = src.read(name)
            dst.writestr(
                name, content[: len(content) // 2] if name.endswith("model.json") else content
            )
    (tmp_path / "folder.pt2").mkdir()
    cases = {
        "noise": " as a program saved by torch.export.save: File is not a zip file",
        "cut": " as a program saved by torch.export.save: ",
        "empty": " as a program saved by torch.export.save: File is not a zip file",
        "other": " as a program saved by torch.export.save: [enforce fail",
        "damaged": " as a program saved by torch.export.save: ",  # the JSON parser's reason
        "folder": ": it is a directory",
        "missing": ": no such file",
    }
    capfd.readouterr()
    for name, reason in cases.items():
        path = tmp_path / f"{name}.pt2"
        assert _tgc_import([str(path), "-o", str(tmp_path / "out.tg")]) == 1, name
        out, err = capfd.readouterr()
        assert out == ""
        assert err.startswith(f"error: cannot read '{path}'{reason}"), (name, err)
        assert err.count("\n") == 1, (name, err)
    assert not (tmp_path / "out.tg").exists()


# -- refusals ---------------------------------------------------------------------------------------


def _line_of(marker: str) -> int:
    """The line of this file holding `marker` (where an error must point)."""
    for number, line in enumerate(THIS_FILE.read_text().splitlines(), 1):
        if marker in line and "_line_of" not in line:
            return number
    raise AssertionError(marker)


class Unsupported(nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.cumsum(y, dim=0)  # <- unsupported here


def test_unsupported_op_names_node_target_and_line():
    with pytest.raises(TgcError) as e:
        import_module(Unsupported(), (torch.randn(3, 4),))
    assert (
        e.value.message == "node 'cumsum' (aten.cumsum.default): no lowering to tgc for aten.cumsum"
    )
    assert Path(e.value.loc.file).resolve() == THIS_FILE
    assert e.value.loc.line == _line_of("# <- unsupported here")
    assert str(e.value).startswith(f"{e.value.loc.file}:{e.value.loc.line}:1: error: node 'cumsum'")


def test_argmax_from_max_dim_is_refused():
    class ArgMax(nn.Module):
        def forward(self, x):
            return x.max(dim=1).indices

    with pytest.raises(TgcError, match=r"node 'max\w*' \(aten\.max\.dim\): the indices of a max"):
        import_module(ArgMax(), (torch.randn(3, 4),))


def test_symbolic_shapes_are_refused():
    batch = torch.export.Dim("batch")
    ep = _export(MLP(), (torch.randn(4, 16),), dynamic_shapes=({0: batch},))
    with pytest.raises(TgcError) as e:
        import_exported_program(ep)
    assert e.value.message.startswith("input 'x' has a symbolic shape [s")
    assert e.value.message.endswith(
        "tgc compiles static shapes only (export without dynamic_shapes)"
    )


def test_buffer_mutation_is_refused():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return x * 2

    with pytest.raises(TgcError, match=r"the program has a buffer mutation 'calls': tgc functions"):
        import_module(Counter(), (torch.randn(3),))


def test_dropout_in_training_mode_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.25)).train()
    ep = torch.export.export(model, (torch.randn(2, 4),))
    with pytest.raises(
        TgcError,
        match=r"node 'native_dropout' \(aten\.native_dropout\.default\) in module '1' \(Dropout\): "
        r"makes random .*model\.eval",
    ):
        import_exported_program(ep)


def test_attention_dropout_is_refused():
    class AttnDropout(nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)

    with pytest.raises(TgcError, match=r"dropout_p=0\.5: attention dropout is random"):
        import_module(AttnDropout(), (torch.randn(2, 3, 4),))


def test_unsupported_dtype_is_refused():
    class Complex(nn.Module):
        def forward(self, x):
            return x * 2

    with pytest.raises(TgcError, match=r"input 'x' has dtype torch\.uint8, which tgc has no type"):
        import_module(Complex(), (torch.zeros(3, dtype=torch.uint8),))


def test_integer_power_is_refused():
    class IntPower(nn.Module):
        def forward(self, i, j):
            return i**j

    ints = (torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64))
    with pytest.raises(TgcError, match=r"\(aten\.pow\.Tensor_Tensor\): a power in i64"):
        import_module(IntPower(), ints)


def test_rounding_refusals():
    """round with decimals of an integer tensor (PyTorch has no kernel) and a remainder of bools
    are refused by name, at the model's line."""

    class RoundInt(nn.Module):
        def forward(self, i):
            return torch.round(i, decimals=1)  # <- round of ints

    class BoolRemainder(nn.Module):
        def forward(self, a, b):
            return torch.remainder(a, b)

    with pytest.raises(TgcError) as e:
        import_module(RoundInt(), (torch.arange(3),))
    assert e.value.message == (
        "node 'round_1' (aten.round.decimals): round with decimals=1 of an i64 tensor "
        "(PyTorch has no kernel for it)"
    )
    assert e.value.loc.line == _line_of("# <- round of ints")
    bools = (torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool))
    with pytest.raises(TgcError) as e:
        import_module(BoolRemainder(), bools)
    assert e.value.message == (
        "node 'remainder' (aten.remainder.Tensor): aten.remainder of bool tensors (tgc's "
        "remainders and rounded quotients are of numbers)"
    )


def test_custom_op_is_refused():
    @torch.library.custom_op("tgc_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    class UsesCustomOp(nn.Module):
        def forward(self, x):
            return twice(x) + 1

    with pytest.raises(TgcError) as e:
        import_module(UsesCustomOp(), (torch.randn(3),))
    assert e.value.message == (
        "node 'twice' (tgc_test.twice.default): not an aten op; tgc imports programs of aten "
        "ops only"
    )


def test_non_tensor_output_is_refused_and_int_input_is_specialised():
    class ReturnsInt(nn.Module):
        def forward(self, x):
            return x * 2, 3

    class TakesInt(nn.Module):
        def forward(self, x, n: int):
            return x * n

    with pytest.raises(
        TgcError,
        match=r"^error: the program returns 3, not a tensor: tgc functions return tensors$",
    ):
        import_module(ReturnsInt(), (torch.randn(3),))
    module = import_module(TakesInt(), (torch.randn(3), 4))  # torch.export bakes n = 4 in
    assert [a.name_hint for a in module.funcs[0].args] == ["x"]
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(tgc.run(module, [x])[0], x * 4)


def test_not_an_exported_program():
    with pytest.raises(TgcError, match=r"expected a torch\.export\.ExportedProgram, got MLP"):
        import_exported_program(MLP())


def test_gpt2_block_import_is_deterministic():
    """Two imports of one program print the same text (value names from the graph)."""
    model = Block().double().eval()
    ep = _export(model, (torch.randint(0, 10, (2, 8)),))
    assert tgc.print_ir(import_exported_program(ep)) == tgc.print_ir(import_exported_program(ep))


# -- Hugging Face models ----------------------------------------------------------------------------


def _tiny_transformer(kind: str):
    transformers = pytest.importorskip(
        "transformers", reason="the Hugging Face models need transformers (not a tgc extra)"
    )
    small = {"vocab_size": 100, "num_hidden_layers": 2, "num_attention_heads": 4}
    if kind == "gpt2":
        config = transformers.GPT2Config(n_positions=16, n_embd=32, **small)
        return transformers.GPT2Model(config)
    if kind == "bert":
        config = transformers.BertConfig(
            hidden_size=32, intermediate_size=64, max_position_embeddings=16, **small
        )
        return transformers.BertModel(config)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=16,
        num_key_value_heads=2,
        **small,
    )
    return transformers.LlamaModel(config)


# Llama computes its rotary embedding in float32 whatever the model's dtype (cos and sin of
# float32 differ by an ulp between numpy and PyTorch), hence its float32-sized tolerance.
@pytest.mark.parametrize(("kind", "tol"), [("gpt2", F64), ("bert", F64), ("llama", F32)])
def test_hugging_face_transformer(kind, tol):
    """Tiny GPT-2, BERT (its token-type buffer read through torch.gather) and Llama (rotary
    embedding, grouped-query attention, RMSNorm, SiLU) with random weights: the last hidden
    state matches PyTorch on fresh token ids."""
    torch.manual_seed(0)
    model = _tiny_transformer(kind).double().eval()
    model.config.use_cache = False
    ids = torch.randint(0, 100, (2, 8))
    ep = _export(model, (ids,))
    module = import_exported_program(ep)
    fresh = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    got = _run(module, ep, (fresh,))
    with torch.no_grad():
        expected = model(fresh).last_hidden_state
    np.testing.assert_allclose(got[0], expected.numpy(), **tol)


def test_docs_op_table_lists_every_lowering():
    """docs/torch-import.md's op table names exactly the aten ops with a lowering (the `*_copy`
    forms of views are covered by one sentence there)."""
    import tgc.importers.torch._program  # noqa: F401  (registers the lowerings)
    from tgc.importers.torch._registry import LOWERINGS

    doc = (THIS_FILE.parent.parent / "docs" / "torch-import.md").read_text()
    table = doc.split("## Op table", 1)[1].split("\n\n", 2)[1]
    listed = set()
    for row in table.splitlines()[2:]:
        listed |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row.split("|")[1]))
    copy_forms = {
        name
        for name in LOWERINGS
        if name.endswith("_copy") and name.removesuffix("_copy") in LOWERINGS
    }
    # a `*_copy` op may be listed (index_copy is no view's copy form) and need not be
    assert listed - copy_forms == set(LOWERINGS) - copy_forms

"""raise-attention: differential tests on random attention-shaped graphs, the imported tiny
GPT-2/BERT models, and a hand-written PyTorch attention.

Random graphs (hypothesis): q @ k^T in each spelling (transpose_b, a transpose op, k stored
transposed, q by transpose_a), random batch dims broadcast between q, k and v, 0 to 2 scales
(mul on either side, div), additive masks, -inf where-masks from an argument or the causal
pattern (either polarity), the softmax as hl.softmax or lowered by lower-hl, v by transpose_b.
Valid graphs must be raised (one hl.attention, no softmax left) exactly when the rules say so;
graphs with one defect (softmax over the query axis, an intermediate also returned, a finite
fill, a mask before the scale, p transposed in the last matmul) must not be. Either way the
float64 interpreter must give the same results before and after (the tolerance of
test_passes_differential: NaN/inf positions exactly, elsewhere 1e-9 relative to the largest
intermediate for f64 graphs, 1e-5 for f32). Without assume-finite the inputs include NaN, ±inf
and ±0 (the default rewrites are exact for every input); with it they are finite.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from test_passes_differential import assert_same, intermediate_scale, run_pipeline

import tgc
import tgc.passes  # noqa: F401
from tgc.attributes import DenseAttr
from tgc.builder import FunctionBuilder
from tgc.parser import parse_module
from tgc.pass_manager import PASSES
from tgc.printer import print_module
from tgc.runtime.interpreter import run_function
from tgc.types import TensorType

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])
SCALES = [0.5, 0.25, 3.0, 1 / math.sqrt(2), 0.125, -0.5, -2.0]
DEFECTS = ["axis", "extra_use", "finite_fill", "add_before_scale", "transposed_p"]


class Case:
    """A random attention graph, whether the pass must raise it, and the inputs' seed."""

    def __init__(self, module, raised: bool, assume_finite: bool, lowered: bool, seed: int):
        self.text = print_module(module)
        self.raised = raised
        self.assume_finite = assume_finite
        self.lowered = lowered
        self.seed = seed
        self.element_type = module.funcs[0].args[0].type.element_type

    @property
    def pipeline(self) -> str:
        raise_ = "raise-attention{assume-finite=true}" if self.assume_finite else "raise-attention"
        return f"lower-hl,{raise_}" if self.lowered else raise_

    def __repr__(self) -> str:
        return (
            f"Case(pipeline={self.pipeline!r}, raised={self.raised}, seed={self.seed}):\n"
            f"{self.text}"
        )


def _sub_batch(draw, batch: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `batch`: leading dims dropped, some dims 1."""
    keep = draw(st.integers(0, len(batch)))
    return tuple(1 if draw(st.booleans()) else d for d in batch[len(batch) - keep :])


def _swap(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[:-2] + (shape[-1], shape[-2])


class _Graph:
    """Builds one attention graph; arguments are declared first, ops appended in order."""

    def __init__(self, draw, element_type: str) -> None:
        self.draw = draw
        self.element_type = element_type
        self.batch = tuple(draw(st.sampled_from([1, 2, 3])) for _ in range(draw(st.integers(0, 2))))
        self.sq, self.sk = draw(st.integers(1, 4)), draw(st.integers(1, 5))
        self.d, self.dv = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        self.arg_types: list[TensorType] = []
        self.arg_names: list[str] = []

    def t(self, shape, element_type=None) -> TensorType:
        return TensorType.get(tuple(shape), element_type or self.element_type)

    def arg(self, name: str, shape, element_type=None) -> int:
        self.arg_types.append(self.t(shape, element_type))
        self.arg_names.append(name)
        return len(self.arg_types) - 1

    def scores_shape(self, qb, kb) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(qb, kb)) + (self.sq, self.sk)

    def mask_shape(self, scores: tuple[int, ...]) -> tuple[int, ...]:
        return _sub_batch(self.draw, scores)


def _constant(fb: FunctionBuilder, value: float, element_type: str):
    t = TensorType.get((), element_type)
    return fb.atomic.constant(value=DenseAttr.splat(value, t), result_type=t)


def _causal(sq: int, sk: int) -> np.ndarray:
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)


@st.composite
def attention_cases(draw) -> Case:
    g = _Graph(draw, draw(st.sampled_from(["f64", "f64", "f64", "f32"])))
    assume_finite = draw(st.booleans())
    defect = draw(st.sampled_from(DEFECTS)) if draw(st.integers(0, 3)) == 0 else None
    q_form = draw(st.sampled_from(["plain", "transpose_a"]))
    k_form = draw(st.sampled_from(["transpose_b", "transpose_op", "stored"]))
    v_form = draw(st.sampled_from(["plain", "transpose_b"]))
    qb, kb, vb = (_sub_batch(draw, g.batch) for _ in range(3))
    q_shape = qb + (g.sq, g.d)
    k_shape = kb + (g.sk, g.d)
    v_shape = vb + (g.sk, g.dv)
    scores = g.scores_shape(qb, kb)

    # Scales and masks in program order (after the score matmul).
    steps: list[tuple] = []
    for _ in range(draw(st.integers(0, 2))):
        steps.append(
            ("scale", draw(st.sampled_from(["mul", "lmul", "div"])), draw(st.sampled_from(SCALES)))
        )
    masks = draw(st.lists(st.sampled_from(["add", "where", "causal"]), max_size=3, unique=True))
    for kind in masks:
        position = draw(st.integers(0, len(steps))) if kind != "add" else len(steps)
        steps.insert(position, (kind, draw(st.booleans())))
    if defect == "finite_fill" and not any(st_[0] in ("where", "causal") for st_ in steps):
        steps.append(("where", True))
    if defect == "add_before_scale":
        if not any(s[0] == "scale" for s in steps):
            steps.append(("scale", "mul", 0.5))
        steps.insert(0, ("add", True))
        steps = [s for i, s in enumerate(steps) if s[0] != "add" or i == 0]

    # Arguments.
    q = g.arg("q", _swap(q_shape) if q_form == "transpose_a" else q_shape)
    k = g.arg("k", _swap(k_shape) if k_form == "stored" else k_shape)
    v = g.arg("v", _swap(v_shape) if v_form == "transpose_b" else v_shape)
    pt = g.arg("w", vb + (g.sq, g.dv)) if defect == "transposed_p" else None
    step_args = {}
    for i, step in enumerate(steps):
        if step[0] == "add":
            step_args[i] = g.arg(f"m{i}", g.mask_shape(scores))
        elif step[0] == "where":
            step_args[i] = g.arg(f"c{i}", g.mask_shape(scores), "i1")
    fb = FunctionBuilder("f", g.arg_types, g.arg_names)
    args = fb.args
    a = fb.atomic

    kq = args[k]
    if k_form == "transpose_op":
        kq = a.transpose(
            kq, perm=tuple(range(len(k_shape) - 2)) + (len(k_shape) - 1, len(k_shape) - 2)
        )
    s = a.matmul(
        args[q], kq, transpose_a=q_form == "transpose_a", transpose_b=k_form == "transpose_b"
    )
    intermediates = [s]
    scale_product_positive = True
    causal_seen = where_seen = False
    add_after_causal = False
    for i, step in enumerate(steps):
        kind = step[0]
        if kind == "scale":
            _, how, c = step
            const = _constant(fb, c, g.element_type)
            s = {
                "mul": lambda: a.mul(s, const),
                "lmul": lambda: a.mul(const, s),
                "div": lambda: a.div(s, const),
            }[how]()
            if c < 0 and (causal_seen or where_seen):
                scale_product_positive = False
        elif kind == "add":
            s = a.add(s, args[step_args[i]]) if step[1] else a.add(args[step_args[i]], s)
            add_after_causal = add_after_causal or causal_seen
        else:
            fill = -1e9 if defect == "finite_fill" else -math.inf
            keep_true = step[1]
            if kind == "where":
                cond = args[step_args[i]]
                where_seen = True
            else:
                allowed = _causal(g.sq, g.sk)
                value = allowed if keep_true else ~allowed
                lead = draw(st.integers(0, 1)) if len(scores) > 2 else 0
                shape = (1,) * lead + value.shape
                ct = g.t(shape, "i1")
                cond = a.constant(value=DenseAttr(value.reshape(shape), ct), result_type=ct)
                causal_seen = causal_seen or g.sq <= g.sk
                where_seen = where_seen or g.sq > g.sk  # not the causal pattern: an ordinary mask
            minus = _constant(fb, fill, g.element_type)
            s = a.where(cond, s, minus) if keep_true else a.where(cond, minus, s)
        intermediates.append(s)
    if defect == "axis":
        p = fb.hl.softmax(s, axis=-2)
    else:
        p = fb.hl.softmax(s, axis=-1)
    intermediates.append(p)
    if defect == "transposed_p":
        o = a.matmul(p, args[pt], transpose_a=True)  # p^T w: sums over queries, not keys
    else:
        o = a.matmul(p, args[v], transpose_b=v_form == "transpose_b")
    results = [o]
    if defect == "extra_use":
        results.append(draw(st.sampled_from(intermediates)))
    module = fb.ret(*results)

    if defect is not None:
        raised = False
    elif not scale_product_positive:
        raised = False
    elif assume_finite:
        raised = True
    else:
        raised = not where_seen and not add_after_causal
    lowered = draw(st.booleans())
    return Case(module, raised, assume_finite, lowered, draw(st.integers(0, 2**32 - 1)))


def case_inputs(func, seed: int, specials: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for arg in func.args:
        shape = arg.type.shape
        if arg.type.element_type == "i1":
            out.append(rng.random(shape) < 0.7)
            continue
        values = rng.standard_normal(shape) * rng.choice([0.5, 1.0, 3.0])
        if specials:
            values = np.where(rng.random(shape) < 0.1, rng.choice(SPECIALS, size=shape), values)
        out.append(np.asarray(values, dtype=arg.type.dtype))
    return out


def count(module, name: str) -> int:
    return sum(1 for op in module.funcs[0].walk() if op.name == name)


@settings(
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(attention_cases())
def test_raise_attention_keeps_results(case: Case):
    event(f"raised={case.raised} assume-finite={case.assume_finite}")
    note(f"input seed {case.seed}; replay: save the text below and run tgc-opt -p {case.pipeline}")
    func = parse_module(case.text, "case.tg").funcs[0]
    inputs = case_inputs(func, case.seed, specials=not case.assume_finite)
    with np.errstate(all="ignore"):
        before = run_function(func, inputs, "f64")
        scale = intermediate_scale(func, inputs)
    after_module = run_pipeline(case.text, case.pipeline)
    raised = count(after_module, "hl.attention")
    assert raised == (1 if case.raised else 0), f"expected raised={case.raised}, got {raised}"
    if case.raised:
        assert count(after_module, "hl.softmax") == 0
        assert count(after_module, "atomic.exp") == 0
    with np.errstate(all="ignore"):
        after = run_function(after_module.funcs[0], inputs, "f64")
    rel = 1e-9 if case.element_type == "f64" else 1e-5
    assert_same(before, after, scale, rel, f"after {case.pipeline}")


def test_registered_with_a_contract():
    cls = PASSES["raise-attention"]
    assert cls.name == "raise-attention" and "Contract" in cls.__doc__


# -- imported models -------------------------------------------------------------------------------


def _import(name: str, passes: str):
    import test_import_models as models  # needs onnx: imported only by the tests that use it

    return models, models.import_and_optimize(name, passes=passes)


MODEL_NAMES = ("tiny_gpt2", "tiny_bert", "tiny_gpt2_dynamo", "tiny_bert_dynamo")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_imported_models_raise_one_attention_per_layer(name):
    """Each layer's attention (one softmax per layer as imported) becomes one hl.attention, and
    the model still matches PyTorch's stored float64 and float32 outputs (rtol 1e-3, atol 1e-4,
    as test_import_models)."""
    pytest.importorskip("onnx", reason="the onnx extra is not installed")
    models, module = _import(name, "")
    layers = count(module, "hl.softmax")
    assert layers >= 2 and count(module, "hl.attention") == 0
    tgc.run_pipeline(module, "raise-attention")
    assert count(module, "hl.attention") == layers
    assert count(module, "hl.softmax") == 0
    text = print_module(module)
    assert re.findall(r"hl\.attention [^{]*\{scale = ([0-9.e-]+)\}", text) == ["0.25"] * layers
    inputs, f32, f64 = models.stored_case(name)
    got = models.run(module, inputs)
    models.assert_close(got, f64, f"{name} after raise-attention vs PyTorch float64")
    models.assert_close(got, f32, f"{name} after raise-attention vs PyTorch float32")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_imported_models_fresh_inputs_after_raising(name):
    """Fresh ids and padding (a right-padded mask keeping one token a row) against onnx's
    reference evaluator: the raised masks are the model's, not the stored inputs'."""
    onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
    from onnx.reference import ReferenceEvaluator

    models, module = _import(name, "raise-attention")
    assert count(module, "hl.attention") >= 2
    proto = onnx.load(str(models.MODELS / name / "model.onnx"))
    names = [i.name for i in proto.graph.input]
    rng = np.random.default_rng()
    for _ in range(2):
        inputs = models.fresh_inputs(name, rng)
        want = ReferenceEvaluator(proto).run(None, dict(zip(names, inputs)))
        models.assert_close(models.run(module, inputs), want, f"{name} raised, fresh inputs")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_gpu_plan_runs_the_attention_kernel_on_imported_models(name):
    """What the planner plans (lower-for-planning) raises the attention of the imported models:
    the GPU plan (tgc's kernels, nothing measured) has one attention kernel per layer, and (run
    by the numpy interpreter, which runs planned IR) still matches PyTorch's float64 outputs."""
    pytest.importorskip("onnx", reason="the onnx extra is not installed")
    from tgc.planner.backends.cuda_kernels import planning_kernels
    from tgc.planner.standalone import plan_standalone

    models, module = _import(name, "lower-for-planning")
    with planning_kernels(None):
        plan_standalone(module.funcs[0])
    calls = [op.attributes.get("callee") for op in module.funcs[0].body.ops]
    assert calls.count("cuda.attention") == 2, calls
    inputs, _, f64 = models.stored_case(name)
    models.assert_close(
        models.run(module, inputs), f64, f"{name} planned for the GPU vs PyTorch f64"
    )


# -- a hand-written PyTorch attention --------------------------------------------------------------


def _torch_attention(causal_mask: bool):
    torch = pytest.importorskip("torch", reason="PyTorch is an optional extra")

    class Attention(torch.nn.Module):
        """Multi-head self-attention without scaled_dot_product_attention: q k^T / sqrt(d),
        masked_fill of the future with -inf (optional), a padding mask added, softmax, @ v."""

        def __init__(self, dim: int = 32, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(dim, 3 * dim)

        def forward(self, x, pad):
            b, s, dim = x.shape
            q, k, v = self.qkv(x).split(dim, dim=-1)
            q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            w = q @ k.transpose(-2, -1) / math.sqrt(dim // self.heads)
            if causal_mask:
                future = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
                w = w.masked_fill(future, float("-inf"))
            w = w + pad[:, None, None, :]
            return (torch.softmax(w, dim=-1) @ v).transpose(1, 2).reshape(b, s, dim)

    return torch, Attention().eval()


@pytest.mark.parametrize("causal_mask", [False, True])
def test_hand_written_torch_attention(causal_mask):
    """Imported by tgc.importers.torch: the padding-only attention is raised by default (an
    additive mask); the causal one only with assume-finite (its padding mask, an argument, is
    added after the -inf select: exact only if it never holds +inf or NaN), then as causal =
    true. On fresh inputs, interpreted in float64: the raised module equals the imported one
    to rtol 1e-12 and PyTorch's float64 run to rtol 1e-5, atol 1e-7 (the import holds sqrt(8)
    as a float32 constant, 3e-8 relative from PyTorch's float64 one)."""
    torch, model = _torch_attention(causal_mask)
    from tgc.importers.torch import import_exported_program, parameter_values

    g = torch.Generator().manual_seed(0)
    x, pad = torch.randn(2, 8, 32, generator=g), torch.zeros(2, 8)
    ep = torch.export.export(model, (x, pad))
    imported = import_exported_program(ep)
    for options, raised in (("", not causal_mask), ("{assume-finite=true}", True)):
        module = import_exported_program(ep)
        tgc.run_pipeline(module, f"raise-attention{options}")
        ops = [op for op in module.funcs[0].walk() if op.name == "hl.attention"]
        assert len(ops) == (1 if raised else 0), options
        if ops:
            assert bool(ops[0].attr("causal")) == causal_mask
            assert ops[0].attr("scale") == pytest.approx(1 / math.sqrt(8), rel=1e-6)
        x = torch.randn(2, 8, 32, generator=g)
        pad = torch.where(torch.rand(2, 8, generator=g) < 0.3, -1e4, 0.0)
        with torch.no_grad():
            want = model.double()(x.double(), pad.double()).numpy()
            model.float()
        inputs = parameter_values(ep) + [x.numpy(), pad.numpy()]
        (before,) = run_function(imported.funcs[0], inputs, "f64")
        (got,) = run_function(module.funcs[0], inputs, "f64")
        np.testing.assert_allclose(got, before, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


# -- constant causal masks -------------------------------------------------------------------------


def _masked_attention(seq_q: int, seq_k: int, mask: np.ndarray) -> str:
    """hl.attention of fresh q, k, v (2 heads, head dim 8, f64) with `mask` as a constant."""
    types = [TensorType.get((2, n, 8), "f64") for n in (seq_q, seq_k, seq_k)]
    fb = FunctionBuilder("f", types, ["q", "k", "v"])
    q, k, v = fb.args
    t = TensorType.get(mask.shape, "f64")
    m = fb.atomic.constant(value=DenseAttr(mask, t), result_type=t)
    return print_module(fb.ret(fb.hl.attention(q, k, v, m)))


@pytest.mark.parametrize(
    "seq_q, seq_k, batch", [(5, 5, ()), (5, 5, (1,)), (3, 7, (2,)), (1, 9, ())]
)
def test_a_constant_causal_mask_becomes_causal(seq_q, seq_k, batch):
    """A 0/-inf constant mask in the causal pattern (square, and with a KV cache: the diagonal
    aligned to the end) becomes `causal = true` with no mask under assume-finite, and only then;
    the float64 interpreter gives the same results on fresh inputs (rtol 1e-12)."""
    allowed = _causal(seq_q, seq_k)
    mask = np.broadcast_to(np.where(allowed, 0.0, -np.inf), batch + allowed.shape).copy()
    text = _masked_attention(seq_q, seq_k, mask)
    func = parse_module(text, "case.tg").funcs[0]
    inputs = case_inputs(func, seed=seq_q * 10 + seq_k, specials=False)
    (want,) = run_function(func, inputs, "f64")
    exact = run_pipeline(text, "raise-attention")
    (op,) = [op for op in exact.funcs[0].walk() if op.name == "hl.attention"]
    assert len(op.operands) == 4 and not op.attr("causal")
    module = run_pipeline(text, "raise-attention{assume-finite=true}")
    (op,) = [op for op in module.funcs[0].walk() if op.name == "hl.attention"]
    assert len(op.operands) == 3 and op.attr("causal")
    assert count(module, "atomic.constant") == 0
    (got,) = run_function(module.funcs[0], inputs, "f64")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_lower_for_planning_makes_hugging_face_masks_causal():
    """Hugging Face's GPT-2 and Llama, exported by torch.export, hand their causal mask to
    scaled_dot_product_attention as a float 0/-inf tensor; after lower-for-planning every layer's
    hl.attention is causal with no mask (so the causal kernels run), and the planned module
    gives the imported module's results (float64 interpreter, within 1e-12 of the largest
    logit) and PyTorch's float64 ones (1e-6: the import keeps the scale as a float32)."""
    pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("transformers", reason="transformers is not installed")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    import real_models

    for name in ("gpt2", "llama"):
        case = real_models.dry_case(name, "f64", 2, tiny=True, seq=8)
        module = case.imported
        (before,) = run_function(module.funcs[0], case.arguments, "f64")
        tgc.run_pipeline(module, "lower-for-planning")
        ops = [op for op in module.funcs[0].walk() if op.name == "hl.attention"]
        assert ops and all(op.attr("causal") and len(op.operands) == 3 for op in ops), name
        (got,) = run_function(module.funcs[0], case.arguments, "f64")
        largest = np.abs(before).max()
        np.testing.assert_allclose(got, before, rtol=0, atol=1e-12 * largest)
        np.testing.assert_allclose(got, case.want, rtol=0, atol=1e-6 * largest)

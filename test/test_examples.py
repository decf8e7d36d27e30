"""Every example: runs through tgc-run, round-trips to a fixed point, and matches an independent
float64 numpy computation written here from the textbook formulas (not from the op references).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tgc.parser import parse_file, parse_module
from tgc.printer import print_module
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.verifier import verify

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ALL = sorted(p.name for p in EXAMPLES.glob("*.tg"))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _layernorm(x, g, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _softmax_rows(s):
    out = np.empty_like(s)
    for idx in np.ndindex(*s.shape[:-1]):
        row = s[idx]
        e = np.exp(row - row.max())
        out[idx] = e / e.sum()
    return out


def _attention(q, k, v, mask=None, causal=False):
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask
    if causal:
        sq, sk = scores.shape[-2:]
        allowed = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        scores = np.where(allowed, scores, -np.inf)
    return _softmax_rows(scores) @ v


def expected_mlp(x, w1, b1, w2, b2):
    return _gelu_tanh(x @ w1 + b1) @ w2 + b2


def expected_gelu_scale(x):
    return _gelu_tanh(x) * float(np.float32(1.702))  # the IR's constant is an f32


def expected_softmax(x):
    return _softmax_rows(x)


def expected_layernorm(x, g, b):
    return _layernorm(x, g, b)


def expected_attention(q, k, v, mask):
    return _attention(q, k, v, mask, causal=True)


def expected_gpt2_block(x, g1, be1, wqkv, bqkv, wo, bo, g2, be2, wfc, bfc, wp, bp):
    s, d = x.shape
    heads = 12
    qkv = _layernorm(x, g1, be1) @ wqkv + bqkv
    q, k, v = (
        qkv[:, i * d : (i + 1) * d].reshape(s, heads, d // heads).transpose(1, 0, 2)
        for i in range(3)
    )
    att = _attention(q, k, v, causal=True).transpose(1, 0, 2).reshape(s, d)
    x1 = x + att @ wo + bo
    return x1 + _gelu_tanh(_layernorm(x1, g2, be2) @ wfc + bfc) @ wp + bp


EXPECTED = {
    "mlp.tg": expected_mlp,
    "gelu_scale.tg": expected_gelu_scale,
    "softmax.tg": expected_softmax,
    "layernorm.tg": expected_layernorm,
    "attention.tg": expected_attention,
    "gpt2_block.tg": expected_gpt2_block,
}


def test_every_example_has_an_independent_reference():
    assert set(ALL) == set(EXPECTED)


@pytest.mark.parametrize("name", ALL)
def test_example_matches_float64_formula(name, tmp_path):
    module = parse_file(EXAMPLES / name)
    verify(module)
    func = module.funcs[0]
    seed = sum(map(ord, name))
    inputs = random_inputs(func, seed)
    want = EXPECTED[name](*[a.astype(np.float64) for a in inputs])
    (got64,) = run_function(func, inputs, "f64")
    np.testing.assert_allclose(got64, want, rtol=1e-9, atol=1e-9)  # same math, both in f64
    # tgc-run itself, in native f32, through its -o output: f32 rounding only.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tgc.tools.run",
            str(EXAMPLES / name),
            "--random-inputs",
            str(seed),
            "-o",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    got32 = np.load(tmp_path / "result_0.npy")
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want, rtol=2e-3, atol=2e-3 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("name", ALL)
def test_example_round_trips_to_a_fixed_point(name):
    text = (EXAMPLES / name).read_text()
    once = print_module(parse_module(text, name))
    twice = print_module(parse_module(once, name))
    assert once == twice
    generic = print_module(parse_module(text, name), generic=True)
    assert print_module(parse_module(generic, name)) == once

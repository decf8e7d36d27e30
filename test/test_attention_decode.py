"""The split-KV decode attention kernel (codegen/attention_decode.py, attention_decode.cu.j2).

CPU: code generation picks it for a few query rows per key-value head against a long cache
(and not for short caches, many queries or f32), a parameter turns it off or sets its splits;
grouped-query attention whose k and v repeat the cache's heads (reshape of a broadcast, as
Hugging Face's repeat_kv and the torch importer's enable_gqa write it) reads the un-expanded
cache by index, in this kernel and in the flash-attention ones; nvcc compiles its variants
(one batched run, test/nvcc_batch.py) without spills.
GPU (marker `cuda`): launched directly on fresh random inputs with the output poisoned with NaN
bytes, twice (the second launch checks that the last block reset the split counters), against
the float64 interpreter: relative Frobenius error under 1e-2 (bf16) and 2e-3 (f16), as the
tensor-core kernel's (P is rounded to the element type before P V, the output on store).
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from nvcc_batch import compile_each
from test_attention_tc import REL_ERROR, attention_region, heads_text, rel_frobenius, run_gpu, t

from tgc.codegen.attention_decode import default_splits
from tgc.codegen.kernels import SYMBOL_FORMS, generate_kernel
from tgc.codegen.names import NameAllocator
from tgc.codegen.render import prelude
from tgc.diagnostics import TgcError
from tgc.parser import parse_module
from tgc.runtime.interpreter import random_inputs, run_function

NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")


def gqa_text(b, hq, hkv, sq, sk, d, dtype="bf16", causal=False, mask=False) -> str:
    """q (b, hq, sq, d) against a cache k, v (b, hkv, sk, d) whose heads are repeated for
    hq / hkv query heads each: reshape to (b, hkv, 1, sk, d), broadcast, reshape (repeat_kv).
    With `mask`, an additive (b, 1, sq, sk) mask broadcast over the heads (Hugging Face's)."""
    g = hq // hkv
    qt, kt, wide = t((b, hq, sq, d), dtype), t((b, hkv, sk, d), dtype), t((b, hkv, 1, sk, d), dtype)
    big, rep = t((b, hkv, g, sk, d), dtype), t((b, hq, sk, d), dtype)
    args = [f"%q: {qt}", f"%k: {kt}", f"%v: {kt}"]
    lines = []
    for n in "kv":
        lines += [
            f"  %{n}1 = atomic.reshape %{n} : ({kt}) -> {wide}",
            f"  %{n}2 = atomic.broadcast %{n}1 : ({wide}) -> {big}",
            f"  %{n}3 = atomic.reshape %{n}2 : ({big}) -> {rep}",
        ]
    operands, types = "%q, %k3, %v3", [qt, rep, rep]
    if mask:
        mt = t((b, 1, sq, sk), dtype)
        args.append(f"%m: {mt}")
        operands += ", %m"
        types.append(mt)
    attr = " {causal = true}" if causal else ""
    lines.append(f"  %y = hl.attention {operands}{attr} : ({', '.join(types)}) -> {qt}")
    return "\n".join(
        [f"func.func @att({', '.join(args)}) -> {qt} {{", *lines, f"  func.return %y : {qt}", "}"]
    )


# -- which kernel ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, decode",
    [
        (heads_text(1, 8, 4, 2049, 128, 128, "bf16", layout="flat"), True),
        (heads_text(2, 3, 1, 300, 64, 64, "f16", True, True, "flat"), True),  # causal, masked
        (gqa_text(2, 8, 2, 1, 1000, 64), True),
        (heads_text(1, 8, 4, 200, 128, 128, "bf16", layout="flat"), False),  # a short cache
        (heads_text(1, 8, 17, 2049, 64, 64, "bf16", layout="flat"), False),  # 17 query rows
        (gqa_text(1, 16, 2, 3, 1000, 64), False),  # 8 heads x 3 queries: 24 rows
        (heads_text(1, 8, 4, 2049, 64, 64, "f32", layout="flat"), False),
        (heads_text(1, 8, 4, 2049, 72, 72, "bf16", layout="flat"), False),  # not tensor cores
    ],
)
def test_the_decode_kernel_is_chosen_for_few_rows_against_a_long_cache(text, decode):
    k = generate_kernel(attention_region(text), {"arch": "sm_90"})
    assert k.params.get("decode", False) is decode
    assert ("split-KV decode attention" in k.source) is decode


def test_the_grid_is_key_value_heads_times_splits_and_splits_is_a_parameter():
    fused = attention_region(heads_text(2, 3, 4, 2049, 64, 64, layout="flat"))
    k = generate_kernel(fused, {"arch": "sm_90"})
    assert k.grid == (6 * k.params["splits"], 1, 1) and k.block == (128, 1, 1)
    four = generate_kernel(fused, {"splits": 4})
    assert four.params["splits"] == 4 and four.grid == (24, 1, 1)
    assert "_done[6]" in four.source and "SPLITS = 4" in four.source
    one = generate_kernel(fused, {"splits": 1})
    assert one.grid == (6, 1, 1) and "_part" not in one.source  # no scratch, no counter
    # 2049 keys are 65 tiles of 32: 40 splits become 33 of 2 tiles (none empty)
    forty = generate_kernel(fused, {"splits": 40})
    assert forty.grid == (6 * 33, 1, 1) and "SPLITS = 33" in forty.source
    off = generate_kernel(fused, {"decode": False})
    assert off.params["decode"] is False and off.params["tensor_cores"]
    for bad in (0, True, "4"):
        with pytest.raises(TgcError, match="splits must be a positive integer"):
            generate_kernel(fused, {"splits": bad})
    with pytest.raises(TgcError, match="stages 2, 3 or 4"):
        generate_kernel(fused, {"stages": 5})
    assert generate_kernel(fused, {"stages": 2}).shared_bytes < k.shared_bytes
    f32 = attention_region(heads_text(1, 2, 4, 2049, 64, 64, "f32", layout="flat"))
    with pytest.raises(TgcError, match="decode needs bf16/f16"):
        generate_kernel(f32, {"decode": True})


def test_the_kernels_module_globals_are_reserved_with_its_symbol():
    """The scratch and counter arrays are named after the kernel's symbol; an allocator that
    hands out the symbol reserves those names too, so another kernel or function of the same
    translation unit named like one of them gets another name."""
    names = NameAllocator()
    symbol = names.allocate("att", forms=SYMBOL_FORMS)
    fused = attention_region(heads_text(2, 3, 4, 2049, 64, 64, layout="flat"))
    k = generate_kernel(fused, {"splits": 4}, symbol)
    declared = set(re.findall(r"^__device__ [\w ]+ (\w+)\[", k.source, re.MULTILINE))
    assert declared == {form.format(symbol) for form in SYMBOL_FORMS}
    assert {names.allocate(f"att{suffix}") for suffix in ("_part", "_part_ml", "_done")}.isdisjoint(
        declared
    )


@pytest.mark.parametrize(
    "nb, tiles, per_sm, sms, want",
    [
        (8, 64, 1, 132, 16),  # batch 1, 8 heads: 128 blocks of 132
        (128, 1024, 1, 132, 1),  # batch 16: one wave already
        (8, 8, 1, 132, 2),  # a short cache: one tile per warp at most
        (6, 100, 2, 108, 25),  # 150 of 216 is too little; 25 x 6 fills 150 ... best is 36
    ][:3],
)
def test_default_splits_fill_one_wave(nb, tiles, per_sm, sms, want):
    assert default_splits(nb, tiles, per_sm, sms) == want


def test_grouped_kv_is_read_by_index_from_the_unexpanded_cache():
    """The region's inputs are q and the (b, 2, s, d) cache itself, not an expanded copy: the
    decode kernel takes the group's 4 query heads as rows of one block per key-value head, and
    the flash-attention kernel (many queries) divides the head index by the group."""
    fused = attention_region(gqa_text(2, 8, 2, 1, 1000, 64))
    assert [list(a.type.shape) for a in fused.operands] == [
        [2, 8, 1, 64],
        [2, 2, 1000, 64],
        [2, 2, 1000, 64],
    ]
    k = generate_kernel(fused, {"arch": "sm_90"})
    assert k.params["decode"] and "ROWS = 4" in k.source and k.grid[0] == 4 * k.params["splits"]
    prefill = attention_region(gqa_text(1, 8, 2, 100, 100, 64))
    assert [list(a.type.shape) for a in prefill.operands][1] == [1, 2, 100, 64]
    for params in ({}, {"wgmma": True, "arch": "sm_90", "tma": False}):
        src = generate_kernel(prefill, params).source
        assert re.search(r"\(\(bz % 8\) / 4\) \* 6400", src), "k's head is the query head / 4"
    # The TMA kernel's copies: k's tensor map has the 2 key-value heads, its head coordinate the
    # query head / 4.
    tma = generate_kernel(prefill, {"wgmma": True, "arch": "sm_90", "tma": True})
    q_map, k_map = tma.tensor_maps[:2]  # (then v and, stored by TMA, o)
    assert tma.params["tma"] and (q_map.dims, k_map.dims) == ((64, 100, 8), (64, 100, 2))
    assert k_map.strides == (128, 12800)  # (the one batch entry is no dim)
    copy_k = tma.source[tma.source.index("auto copy_k") :]
    assert '"r"((int) (((bz % 8) / 4)))' in copy_k.split("};")[0]


# -- nvcc ----------------------------------------------------------------------------------------


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_decode_kernels_compile_for_sm_90_without_spills(tmp_path):
    variants = [
        (heads_text(1, 8, 4, 2049, 128, 128, "bf16", layout="flat"), {}),
        (heads_text(1, 8, 4, 2049, 64, 64, "f16", layout="flat"), {"splits": 1}),
        (gqa_text(2, 8, 2, 1, 1000, 64, "bf16", mask=True), {}),
        (heads_text(2, 3, 2, 300, 32, 128, "f16", True, True, "flat"), {}),
    ]
    kernels = [
        generate_kernel(attention_region(text), {"arch": "sm_90", **p}) for text, p in variants
    ]
    assert all(k.params["decode"] for k in kernels)
    flags = ["-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-Xptxas", "-v"]
    results = compile_each(tmp_path, prelude(), [(k.name, k.source) for k in kernels], flags)
    for (ok, log), k in zip(results, kernels):
        assert ok, log[-3000:]
        # ptxas keeps the masked GQA variant at 128 registers with one 4-byte spill
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
        assert spills and max(spills) <= 8, f"{k.params}: {log[-1500:]}"


# -- on the GPU ------------------------------------------------------------------------------------


def launch_twice(text: str, params: dict, seed: int):
    """(first result, second result, float64 reference, kernel): the attention region's kernel
    launched directly on `text`'s arguments (its inputs, in order), the output poisoned with
    NaN bytes before each launch."""
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as cuda

    from tgc.runtime.cuda_compile import load_kernels

    ref = parse_module(text)
    inputs = random_inputs(ref.funcs[0], seed)
    fused = attention_region(text)
    assert [a.type.shape for a in fused.operands] == [x.shape for x in inputs]
    k = generate_kernel(fused, params)
    (fn,) = load_kernels([k])
    (out_type,) = ref.funcs[0].function_type.results
    # bf16 as its bits: PyCUDA's buffer protocol does not take ml_dtypes' bfloat16
    raw = [x.view(np.uint16) if x.dtype.itemsize == 2 else x for x in inputs]
    bufs = [cuda.to_device(np.ascontiguousarray(x)) for x in raw]
    out = cuda.mem_alloc(out_type.nbytes)
    results = []
    for _ in range(2):
        cuda.memset_d8(out, 0xFF, out_type.nbytes)
        fn.prepared_call(k.grid, k.block, *bufs, out, shared_size=k.shared_bytes)
        cuda.Context.synchronize()
        got = np.empty(out_type.shape, dtype=out_type.dtype)
        cuda.memcpy_dtoh(got, out)
        results.append(got)
    (want,) = run_function(ref.funcs[0], inputs, "f64")
    return results[0], results[1], want, k


GPU_CASES = [
    # text, params
    (heads_text(1, 8, 4, 2049, 128, 128, "bf16", layout="flat"), {}),
    (heads_text(2, 3, 4, 2049, 64, 64, "f16", layout="flat"), {"splits": 7}),
    (heads_text(2, 3, 4, 2049, 64, 64, "bf16", layout="flat"), {"splits": 1}),
    (heads_text(1, 2, 1, 1, 64, 64, "bf16", layout="flat"), {"decode": True}),
    (heads_text(2, 2, 3, 37, 128, 128, "f16", layout="flat"), {"decode": True, "splits": 2}),
    (heads_text(1, 4, 2, 37, 32, 128, "bf16", True, True, "flat"), {"decode": True}),
    (heads_text(2, 3, 5, 2049, 80, 80, "bf16", True, False, "flat"), {"splits": 9}),
    (gqa_text(2, 8, 2, 1, 2049, 128, "bf16"), {}),
    (gqa_text(1, 8, 2, 2, 1000, 64, "f16", causal=True), {"splits": 5}),
    (heads_text(1, 8, 4, 2049, 128, 128, "bf16", layout="flat"), {"stages": 3, "splits": 3}),
    (gqa_text(3, 4, 1, 1, 777, 64, "bf16", mask=True), {}),
]


@pytest.mark.cuda
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
def test_decode_attention_matches_float64(case):
    text, params = GPU_CASES[case]
    first, second, want, k = launch_twice(text, {"arch": "sm_90", **params}, 100 + case)
    assert k.params["decode"]
    dtype = "f16" if "xf16>" in text else "bf16"
    for got in (first, second):
        assert not np.isnan(got.astype(np.float64)).any(), "NaN: an element left unwritten?"
        err = rel_frobenius(got, want)
        assert err < REL_ERROR[dtype], f"relative error {err:.2e} ({k.params})"
    np.testing.assert_array_equal(first, second)


@pytest.mark.cuda
@pytest.mark.parametrize("params", [{}, {"wgmma": True}])
def test_grouped_kv_prefill_reads_the_cache_by_index(params):
    """Many queries (the flash-attention kernels), k and v repeated per group: the kernel reads
    head h // 4 of the un-expanded cache (planned and run by the executor)."""
    from tgc.planner import load_backends
    from tgc.planner.backends import cuda_kernels as ck

    load_backends(("cuda",), required=True)
    if params.get("wgmma") and ck.TARGET["arch"] != "sm_90":
        pytest.skip("wgmma needs sm_90")
    got, want, kernels = run_gpu(
        gqa_text(2, 8, 2, 100, 100, 64, "bf16", causal=True), 7, params=params
    )
    assert [k.params.get("tensor_cores") for k in kernels] == [True]
    assert not np.isnan(got.astype(np.float64)).any()
    assert rel_frobenius(got, want) < REL_ERROR["bf16"]

"""The few-rows matmul whose epilogue reads its product's two halves (codegen/matmul.py
`_halves`): SiLU(gate) * up of a packed gate+up projection computed where the products are
summed, each warp summing an output column's gate row and up row of B. The kernel's code and
refusals, that the planner offers it for few rows only (with and without the norm before as a
prologue), that nvcc compiles it without spills or warnings (no GPU needed), and on a GPU its
results against float64, outputs poisoned with NaN first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_attention_tc import NVCC
from test_matmul_wgmma import check_against_float64, fused_region
from test_planner_cuda import stand_in  # noqa: F401  (the fixture)

import tgc
from tgc.codegen.kernels import generate_kernel
from tgc.diagnostics import TgcError
from tgc.parser import parse_module
from tgc.pass_manager import PassManager

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from matmul_prologue import gate_up_text, t  # noqa: E402
from test_matmul_prologue import (  # noqa: E402
    assert_compiled_without_spills_or_warnings,
    assert_planned_as_one_kernel,
)

SM90 = {"arch": "sm_90"}


def halves_text(rows: tuple[int, ...], k: int, n: int, sizes=None, whole=False) -> str:
    """x @ W^T of a packed [2n, k] weight, split along n, SiLU(gate) * up; `sizes`: another
    split (then SiLU(gate) squared); `whole`: the product itself added as well (read both
    ways)."""
    x, w, p = t((*rows, k), "bf16"), t((2 * n, k), "bf16"), t((*rows, 2 * n), "bf16")
    sizes = sizes or [n, n]
    g, u = t((*rows, sizes[0]), "bf16"), t((*rows, sizes[1]), "bf16")
    h = g
    lines = [
        f"func.func @f(%x: {x}, %w: {w}) -> {p if whole else h} {{",
        f"  %p = atomic.matmul %x, %w {{transpose_b = true}} : ({x}, {w}) -> {p}",
        f"  %g, %u = atomic.split %p {{axis = {len(rows)}, sizes = {sizes}}} : ({p}) -> ({g}, {u})",
        f"  %s = hl.silu %g : ({g}) -> {g}",
        # (split otherwise: the gate alone, its up unread)
        f"  %m = atomic.mul %s, {'%s' if sizes[0] != sizes[1] else '%u'} : ({g}, {g}) -> {h}",
    ]
    if whole:
        lines += [
            f"  %c = atomic.concat %m, %m {{axis = {len(rows)}}} : ({h}, {h}) -> {p}",
            f"  %r = atomic.add %c, %p : ({p}, {p}) -> {p}",
            f"  func.return %r : {p}",
        ]
    else:
        lines.append(f"  func.return %m : {h}")
    return "\n".join([*lines, "}"])


def test_an_output_column_is_summed_from_its_gate_and_up_rows_in_one_warp():
    """Each warp sums BCOLS = 2 x COLS columns: its COLS output columns' rows of B and those
    N / 2 further; the epilogue reads them as mm_val0 and mm_val1 and stores the half-width
    output; the grid covers the output's columns, not the product's."""
    k = generate_kernel(fused_region(halves_text((1, 1), 64, 96)), dict(SM90))
    assert k.params["gemv"] is True and k.params["gemv_mma"] is False
    assert "constexpr int BCOLS = 2 * COLS;" in k.source and "N_OUT = N / 2;" in k.source
    assert "return n0 + c % COLS + (c / COLS) * N_OUT;" in k.source
    assert "const float mm_val0 = acc[r][c], mm_val1 = acc[r][c + COLS];" in k.source
    assert "n0 + c < N_OUT" in k.source and "out0[n] = " in k.source
    per_block = k.params["warps"] // k.params["split_k"] * k.params["columns"]
    assert k.grid == (-(-96 // per_block), 1, 1)
    # the prefetch asks for the block's rows in both halves of B
    assert "i < 2 * BLOCK_ROWS * LINES" in k.source
    # a product read whole keeps one sum a column
    x, w, p = t((1, 1, 64), "bf16"), t((192, 64), "bf16"), t((1, 1, 192), "bf16")
    whole = f"""func.func @f(%x: {x}, %w: {w}) -> {p} {{
  %p = atomic.matmul %x, %w {{transpose_b = true}} : ({x}, {w}) -> {p}
  %r = hl.silu %p : ({p}) -> {p}
  func.return %r : {p}
}}"""
    plain = generate_kernel(fused_region(whole), dict(SM90))
    assert "constexpr int BCOLS = COLS;" in plain.source and "mm_val0" not in plain.source


def test_with_a_norm_before_it_is_one_kernel_of_prologue_product_and_halves():
    k = generate_kernel(fused_region(gate_up_text((1, 1), 128, 96)), dict(SM90))
    assert "float rowv0[ROWS];" in k.source and "mm_val1" in k.source
    assert k.params["gemv"] is True


@pytest.mark.parametrize("skeleton", ["tensor_cores", "wgmma", "gemv_mma"])
def test_the_halves_on_another_skeleton_are_refused(skeleton):
    r = fused_region(halves_text((1, 1), 64, 96))
    with pytest.raises(TgcError, match="two halves runs only on the few-rows skeleton") as info:
        generate_kernel(r, {**SM90, skeleton: True})
    assert info.value.loc is not None


@pytest.mark.parametrize(
    "text",
    [halves_text((1, 1), 64, 96, sizes=[64, 128]), halves_text((1, 1), 64, 96, whole=True)],
    ids=["unequal", "whole-too"],
)
def test_a_product_split_otherwise_or_also_read_whole_is_refused(text):
    with pytest.raises(TgcError, match="whole or through one split of n into two equal") as info:
        generate_kernel(fused_region(text), dict(SM90))
    assert info.value.loc is not None


def _matmul_options(text: str) -> list[list[str]]:
    from tgc.planner.backends import cuda_kernels as ck

    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    found = []
    with ck.planning_kernels("sm_90"):
        for op in module.funcs[0].body.ops:
            found += [[x.name for x in m.ops] for m in ck.cuda_options(op)]
    return found


def test_the_planner_offers_the_halves_epilogue_for_few_rows_only():
    few = _matmul_options(gate_up_text((1, 1), 64, 96))
    with_halves = [ops for ops in few if "atomic.matmul" in ops and "atomic.split" in ops]
    # the product with SiLU(gate) * up after it, alone and with the norm before it
    assert any("atomic.reduce_sum" in ops for ops in with_halves)
    assert any("atomic.reduce_sum" not in ops for ops in with_halves)
    assert ["atomic.matmul"] in few  # the product alone, still
    many = _matmul_options(gate_up_text((1, 64), 64, 96))  # 64 rows: no few-rows kernel
    assert not any("atomic.matmul" in ops and "atomic.split" in ops for ops in many)


CASES = [
    (halves_text((1, 1), 2048, 520), {}),
    (halves_text((2, 3), 264, 200), {"columns": 2}),
    (halves_text((1, 1), 4096, 136), {"split_k": 2}),
    (halves_text((1, 1), 72, 100), {"columns": 4, "unroll": 2}),
    (gate_up_text((1, 1), 2048, 344), {}),
    (gate_up_text((1, 4), 264, 136), {"columns": 2}),
    (gate_up_text((1, 8), 2048, 136), {}),  # 8 rows: the CUDA-core kernel's defaults
    # the most static shared memory: 8 rows of A staged at the limit, split_k's 8 x 8 x 8 sums
    (gate_up_text((1, 8), 2928, 72), {"columns": 4, "split_k": 2, "unroll": 1}),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_halves_kernels_compile_without_spills_or_warnings(tmp_path):
    # every parameter the cases vary, once (the GPU test compiles all of them): a long row,
    # split_k, 4 columns, a prologue at 4 rows, the most static shared memory
    assert_compiled_without_spills_or_warnings(tmp_path, [CASES[i] for i in (0, 2, 3, 5, 7)])


@pytest.mark.cuda
@pytest.mark.parametrize("text, params", CASES)
def test_halves_matmul_matches_float64(text, params):
    fused = fused_region(text)
    kernel = generate_kernel(fused, dict(params))
    check_against_float64(parse_module(text).funcs[0], fused, kernel)


@pytest.mark.usefixtures("stand_in")
def test_a_planned_gate_up_product_and_silu_run_as_one_kernel_matching_float64():
    """The plan of the norm, the packed gate+up product and SiLU(gate) * up at one row is one
    generated kernel."""
    text = gate_up_text((1, 1), 128, 96).replace("bf16", "f32")
    assert_planned_as_one_kernel(text, {"atomic.reduce_sum", "atomic.matmul", "atomic.split"})

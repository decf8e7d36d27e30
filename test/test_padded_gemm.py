"""cuda.cublas.gemm_padded (planner/backends/cuda_kernels.py): which GEMMs it takes, the
leading dimension it pads to, and its cuBLAS call (a numpy model of cuBLAS, the stand-in
device of test_planner_cuda.py) computing the matmul. Timing it against cuda.cublas.gemm is
the planner's business on a GPU (bench/real_models.py: GPT-2's head)."""

from __future__ import annotations

import numpy as np
import pytest
from nvcc_batch import NVCC, compile_unit
from test_planner_cuda import _stand_in_call
from test_planner_cuda import stand_in as _stand_in  # noqa: F401  (a fixture)

from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.kernel import KERNELS
from tgc.types import TensorType


def types(a, b, c, dtype="bf16"):
    return (
        [TensorType.get(a, dtype), TensorType.get(b, dtype)],
        [TensorType.get(c, dtype)],
    )


@pytest.mark.parametrize(
    "case, problem",
    [
        # GPT-2's head: [tokens, 768] @ [50257, 768]^T
        (types((2048, 768), (50257, 768), (2048, 50257)), None),
        (types((4, 512, 768), (50257, 768), (4, 512, 50257)), None),
        (types((8, 16), (13, 16), (8, 13), "f32"), None),  # rows of 52 bytes
        (types((8, 16), (16, 8), (8, 8)), "pads only a result whose rows are not"),
        (types((8, 12), (12, 5), (8, 5), "f32"), "needs the operands' rows 16-byte multiples"),
        (types((8, 12), (5, 12), (8, 5)), "needs the operands' rows 16-byte multiples"),
        (types((8, 16), (16, 5), (8, 5), "i32"), "takes "),
    ],
)
def test_the_padded_gemm_takes_results_whose_rows_are_not_16_byte_multiples(case, problem):
    got = ck.padded_gemm_types(case)
    if problem is None:
        assert got is None
    else:
        assert got is not None and got.startswith(problem)


@pytest.mark.parametrize(
    "n, itemsize, ld", [(50257, 2, 50264), (50264, 2, 50264), (5, 4, 8), (3, 8, 4), (1, 1, 16)]
)
def test_the_padded_leading_dimension_is_the_next_16_byte_row(n, itemsize, ld):
    assert ck.padded_ld(n, itemsize) == ld


@pytest.mark.parametrize("name", ck.SPLIT_GEMMS)
@pytest.mark.parametrize("seed", range(6))
def test_the_padded_cublas_call_computes_the_matmul(seed, name, _stand_in):  # noqa: F811
    """B transposed, as a language model's head reads its embedding (the kernel's constraint
    needs B's rows aligned, so an untransposed B with such an N is not its case)."""
    rng = np.random.default_rng(seed)
    m, k, n = int(rng.integers(1, 9)), 4 * int(rng.integers(1, 4)), 4 * int(rng.integers(1, 4))
    n += 1 + seed % 3  # rows of n f32 are never 16-byte multiples
    batch = (2,) if seed & 1 else ()
    a = rng.standard_normal(batch + (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k)).astype(np.float32)
    operands = [TensorType.get(a.shape, "f32"), TensorType.get(b.shape, "f32")]
    result = TensorType.get(batch + (m, n), "f32")
    assert ck.padded_gemm_types((operands, [result])) is None
    want = np.matmul(a.astype(np.float64), b.T.astype(np.float64))

    class Box:
        def __init__(self, array):
            self.array = array

    kernel = KERNELS[name]
    (out,) = _stand_in_call(kernel, [Box(a), Box(b)], {"transpose_b": True}, [result])
    assert out.array.shape == want.shape
    np.testing.assert_allclose(out.array, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "n, itemsize, columns",  # columns: (first, how many) of each call
    [(50257, 2, [(0, 50256), (50256, 1)]), (13, 4, [(0, 12), (12, 1)]), (7, 2, [(0, 7)])],
)
def test_the_padded_gemm_runs_the_aligned_columns_apart(n, itemsize, columns):
    """cuBLAS's fast kernels need N aligned, not only the result's rows: the aligned columns
    are one call, the few left another, each reading its rows of B and writing its columns."""
    dtype = {2: "bf16", 4: "f32"}[itemsize]
    k = 64
    g = ck.gemm_of(
        [TensorType.get((32, k), dtype), TensorType.get((n, k), dtype)],
        TensorType.get((32, n), dtype),
        {"transpose_b": True},
    )
    parts = ck.padded_gemm_parts(g, itemsize)
    assert [(into_c, part.n) for part, _, into_c in parts] == columns
    for part, into_b, into_c in parts:
        assert into_b == into_c * k and part.stride_b == g.stride_b and part.m == g.m


@pytest.mark.parametrize("shape", [(2, 64, 1001), (5, 3), (1001,), (2, 3, 4, 7)])
def test_padded_row_strides_find_every_element_where_the_padded_gemm_wrote_it(shape):
    """gemm_padded's result handed out as it was written: element [i, ..., j] of a result whose
    rows start `ld` elements apart, every row in order, sits at (row number * ld + j) elements."""
    itemsize, ld = 2, shape[-1] + 7
    strides = ck.padded_row_strides(shape, itemsize, ld)
    index = np.indices(shape).reshape(len(shape), -1).T
    rows = np.ravel_multi_index(index[:, :-1].T, shape[:-1]) if len(shape) > 1 else 0
    want = (rows * ld + index[:, -1]) * itemsize
    np.testing.assert_array_equal(index @ np.array(strides), want)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_compact_copy_compiles(tmp_path):
    """The padded GEMM's copy to compact rows (codegen/compact.py) compiles with the prelude;
    what it computes is checked on a GPU (test_route_cuda.py)."""
    from tgc.codegen.compact import compact_rows_kernel
    from tgc.codegen.render import prelude

    rows, n, ld = 2048, 50257, 50264  # GPT-2's head at 4 x 512 tokens
    kernel = compact_rows_kernel(rows, n, ld, "bf16")
    assert kernel.num_inputs == kernel.num_outputs == 1
    assert f"row * {ld} + col" in kernel.source and f"== {n})" in kernel.source
    ok, log = compile_unit(tmp_path, prelude() + "\n" + kernel.source, ["-arch=sm_90", "-cubin"])
    assert ok, log[-4000:]

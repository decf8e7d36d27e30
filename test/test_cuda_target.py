"""tgc/cuda_target.py's record of what each GPU architecture lets a kernel take, and the
generators that read it: a point that fits an H100's shared memory and not an A100's is
refused for the A100 only; an unnamed or unknown architecture is taken as sm_90's."""

from __future__ import annotations

import pytest
from test_matmul_tc import matmul_region

from tgc.codegen.kernels import generate_kernel
from tgc.cuda_target import GPU_LIMITS, gpu_limits
from tgc.diagnostics import TgcError


def test_each_architecture_has_its_own_limits_and_the_rest_are_sm_90s():
    assert gpu_limits("sm_80").shared_per_block == 163 * 1024
    assert gpu_limits("sm_89").shared_per_sm == 100 * 1024
    assert gpu_limits("sm_90") == GPU_LIMITS["sm_90"]
    assert gpu_limits(None) == gpu_limits("sm_90") == gpu_limits("sm_100")
    assert gpu_limits("sm_90").sms == 132 and gpu_limits("sm_80").sms == 108


def test_blocks_an_sm_holds_count_the_kilobyte_the_system_keeps_of_each():
    h100 = gpu_limits("sm_90")
    assert h100.blocks_by_shared(113 * 1024) == 2  # 2 x 114 KB of 228
    assert h100.blocks_by_shared(114 * 1024) == 1  # 2 x 115 KB would be 230
    assert gpu_limits("sm_86").blocks_by_shared(49 * 1024) == 2


@pytest.mark.parametrize("arch", [None, "sm_90"])
def test_a_matmul_tile_over_an_a100s_shared_memory_is_refused_there_only(arch):
    """4 stages of 128x64 and 64x256 tiles of the mma.sync skeleton: 208,896 bytes, within
    sm_90's 227 KB a block."""
    region = matmul_region((300, 512), (512, 520))
    point = {
        "tensor_cores": True,
        "wgmma": False,
        "block_m": 128,
        "block_n": 256,
        "block_k": 64,
        "stages": 4,
    }
    assert (
        generate_kernel(region, {**point, **({"arch": arch} if arch else {})}).shared_bytes
        == 208896
    )
    with pytest.raises(
        TgcError, match=r"need 208896 bytes of shared memory \(a block may take 166912\)"
    ):
        generate_kernel(region, {**point, "arch": "sm_80"})

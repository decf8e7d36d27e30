"""Shared pytest setup: tgc's dialects and passes are registered before any test module is
collected (tests use the core modules, which know only what is registered, directly), and tests
marked `cuda` are skipped, with the reason, where there is no GPU."""

from __future__ import annotations

import functools
import os

import pytest

import tgc


@functools.lru_cache(maxsize=1)
def cuda_unavailable_reason() -> str | None:
    try:
        import pycuda.driver as cuda
    except ImportError as e:
        return f"PyCUDA is not installed ({e})"
    try:
        cuda.init()
        if cuda.Device.count() == 0:
            return "no CUDA device is visible"
    except Exception as e:  # noqa: BLE001  (driver missing or broken: skip, saying why)
        return f"the CUDA driver is not usable ({e})"
    return None


def pytest_configure(config):
    # The planner with the numpy backend alone, whatever is installed (PyTorch, PyCUDA): plans,
    # path counts and brute-force sizes do not depend on the machine. Tests of the other
    # backends register them themselves (test_planner_torch.py, test_planner_cuda.py).
    os.environ.setdefault("TGC_PLANNER_BACKENDS", "numpy")
    tgc.load_all()


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if item.get_closest_marker("cuda") is None:
            continue
        reason = reason or cuda_unavailable_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {reason}"))

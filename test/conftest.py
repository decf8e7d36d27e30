"""Shared pytest setup: tgc's dialects and passes are registered before any test module is
collected (tests use the core modules, which know only what is registered, directly), tests
marked `cuda` are skipped, with the reason, where there is no GPU, the planner backends a
test loads are unloaded after it, and the lit suite runs in the background (test/lit_runner.py),
started by xdist's controller where pytest-xdist spreads the tests over workers."""

from __future__ import annotations

import functools
import os
import re
import tempfile

# One BLAS thread a process, before numpy loads (here, in xdist's workers, in the tools tests
# start): the workers and lit's tools already have every core, and OpenBLAS's start of a thread
# per core costs about 0.1 s of CPU a process. A value set outside is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The default measurement database, which every tool reads when --db is not given, is one no test
# writes: a developer's own measurements must not change a plan a test checks (tests of the
# default itself set TGC_DB themselves).
os.environ["TGC_DB"] = os.path.join(tempfile.mkdtemp(prefix="tgc-tests-"), "default.sqlite")

import pytest  # noqa: E402

import tgc  # noqa: E402


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
    tgc.load_all()
    import lit_runner

    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "tgc_lit_dir" in workerinput:
        lit_runner.attach(workerinput["tgc_lit_dir"])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): a worker per core, at most 4 (each holds up to about
    400 MB; lit's processes run beside them)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Each xdist worker reads the lit results of the run the controller starts."""
    import lit_runner

    node.workerinput["tgc_lit_dir"] = str(lit_runner.work_dir())


LIT_ID = re.compile(r"test_lit\.py::test_lit_folder\[(.+)\]$")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller starts lit once the first worker has collected (every worker collects the
    same tests), on the folders selected, a lit worker per core: the cores are shared with the
    xdist workers while both run, and lit has them all once the other tests are done."""
    import lit_runner

    if node.config.option.collectonly:
        return
    lit_runner.start(sorted({m.group(1) for m in map(LIT_ID.search, ids) if m}))


@pytest.fixture(autouse=True)
def planner_backends_as_found():
    """Tests plan with the backends they name (`backends=("numpy",)`, `--planner-backends
    numpy`), so that plans, path counts and brute-force sizes do not depend on what is installed
    (PyTorch, PyCUDA). A tool or pass run without them loads every backend that loads here: the
    optional ones a test loaded are unloaded after it, so the next test finds what it found."""
    from tgc.planner import family_of, unload_backends
    from tgc.planner.backends import BACKENDS

    before = set(BACKENDS)
    yield
    added = {family_of(name) for name in set(BACKENDS) - before}
    unload_backends(sorted(f for f in added if f not in (None, "numpy")))


def pytest_collection_modifyitems(config, items):
    # The lit folder tests wait for lit: last, so that no worker waits while tests are left.
    items.sort(key=lambda item: getattr(item, "originalname", None) == "test_lit_folder")
    reason = None
    for item in items:
        if item.get_closest_marker("cuda") is None:
            continue
        reason = reason or cuda_unavailable_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {reason}"))


def pytest_collection_finish(session):
    """Start the lit suite in the background once the tests are known (test/lit_runner.py),
    unless xdist's controller starts it."""
    import lit_runner

    if getattr(session.config, "workerinput", None) is not None:
        return

    folders = sorted(
        {
            item.callspec.params["folder"]
            for item in session.items
            if getattr(item, "originalname", None) == "test_lit_folder"
        }
    )
    # Beside other tests lit takes one core (pytest runs on the other) for the whole run; alone,
    # every core.
    others = any(getattr(i, "originalname", None) != "test_lit_folder" for i in session.items)
    if not session.config.option.collectonly:
        lit_runner.start(folders, workers=1 if others else None)


def pytest_unconfigure(config):
    import lit_runner

    lit_runner.stop()

# ruff: noqa: F821  (lit injects `config`)
# lit configuration for tgc's FileCheck tests: one folder per pass or area.
# Tools come from the Python environment running lit (the venv with tgc installed).
import os
import shutil
import sys

import lit.formats

config.name = "tgc"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".tg", ".mlir", ".test"]
config.excludes = ["Inputs", "Output"]
config.test_source_root = os.path.dirname(__file__)

bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join(
    [bin_dir, config.environment.get("PATH", os.environ.get("PATH", ""))]
)
config.environment["PYTHONUNBUFFERED"] = "1"
# One BLAS thread a tool (numpy's OpenBLAS starts a thread per core at import otherwise: about
# 0.1 s of CPU a tool start on a 2-core machine, and the suite starts about 430 tools beside the
# Python tests, which have the other cores).
config.environment["OPENBLAS_NUM_THREADS"] = os.environ.get("OPENBLAS_NUM_THREADS", "1")
# Every tool reads the default measurement database when --db is not given: here it is a file
# that no test writes (so that a developer's own measurements never change a plan a test
# checks); a test that wants a database gives --db, or sets TGC_DB for one command.
config.environment["TGC_DB"] = os.path.join(config.test_source_root, "Output", "default.sqlite")
# Planner tests name their backends (`--planner-backends numpy`, `select-kernels{backends=numpy}`)
# so that plans do not depend on what is installed (PyTorch, PyCUDA).
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(
    (
        "%examples",
        os.path.join(os.path.dirname(os.path.dirname(config.test_source_root)), "examples"),
    )
)

path = config.environment["PATH"]
if shutil.which("xdsl-opt", path=path):
    config.available_features.add("xdsl")
if shutil.which("nvcc", path=path + os.pathsep + "/usr/local/cuda/bin"):
    config.available_features.add("nvcc")
try:
    import onnx  # noqa: F401  (tgc-import's tests; the onnx extra)

    config.available_features.add("onnx")
except ImportError:
    pass
try:
    import pycuda.driver as _drv  # noqa: F401

    _drv.init()
    if _drv.Device.count() > 0:
        config.available_features.add("cuda")
except Exception:
    pass

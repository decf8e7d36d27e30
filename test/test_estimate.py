"""The estimator (planner/estimate.py) on synthetic curves with known answers, and the database
as a cost source: measured, estimated, roofline, failures, tuned parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgc.planner import load_backends
from tgc.planner.cost import RooflineCostSource
from tgc.planner.db import Database, Measurement, device_of, kernel_info, signature_of
from tgc.planner.estimate import (
    Curve,
    DatabaseCostSource,
    best_params,
    instance_bytes,
    nonnegative_lstsq,
)
from tgc.planner.kernel import KERNELS, Kernel
from tgc.types import TensorType

load_backends(["numpy"])  # numpy's kernels alone, whatever is installed


def memory_bound(nbytes: float) -> float:
    """2 us per call, 20 GB/s up to 1 MiB (a cache), 5 GB/s beyond: a knee."""
    knee = 2.0**20
    if nbytes <= knee:
        return 2e-6 + nbytes / 20e9
    return 2e-6 + knee / 20e9 + (nbytes - knee) / 5e9


def test_nonnegative_lstsq_known_answers():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert np.allclose(nonnegative_lstsq(a, a @ np.array([2.0, 3.0])), [2.0, 3.0])
    # the unconstrained answer has a negative slope: the best non-negative one is flat
    x = nonnegative_lstsq(a, np.array([3.0, 2.0, 1.0]))
    assert np.all(x >= 0) and np.allclose(x, [2.0, 0.0])


def test_straight_line_is_predicted_exactly():
    points = [(b, 0.0, 3e-6 + b / 10e9) for b in np.geomspace(1e3, 1e8, 12)]
    curve = Curve(points)
    for b in np.geomspace(2e3, 5e7, 9):
        seconds, _ = curve.predict(b, 0.0)
        assert seconds == pytest.approx(3e-6 + b / 10e9, rel=1e-6)
    assert curve.error == pytest.approx(0.02)  # the floor: no curve is trusted beyond 2%


def test_knee_is_followed_by_the_local_fit():
    sizes = 2.0 ** np.arange(10, 27)  # 1 KiB .. 64 MiB, the knee at 1 MiB
    curve = Curve([(b, 0.0, memory_bound(b)) for b in sizes])
    between = 2.0 ** (np.arange(10, 26) + 0.5)
    errors = [abs(curve.predict(b, 0.0)[0] - memory_bound(b)) / memory_bound(b) for b in between]
    # exact on the straight pieces; the one interval that straddles the knee is off by ~12%
    assert np.median(errors) < 0.01 and max(errors) < 0.15
    assert sum(e > 0.01 for e in errors) <= 1
    # one straight line over every point cannot: the knee is what the local fit is for
    columns = np.stack([np.ones(len(sizes)), sizes], axis=1)
    times = np.array([memory_bound(b) for b in sizes])
    c = nonnegative_lstsq(columns / times[:, None], np.ones(len(sizes)))
    global_errors = [abs(c[0] + c[1] * b - memory_bound(b)) / memory_bound(b) for b in between]
    assert max(global_errors) > 3 * max(errors)


def test_matmul_like_surface_over_bytes_and_flops():
    rng = np.random.default_rng(0)

    def gemm(m, k, n):
        nbytes, flops = 4.0 * (m * k + k * n + m * n), 2.0 * m * k * n
        return nbytes, flops, 5e-6 + nbytes / 8e9 + flops / 40e9

    shapes = rng.choice([32, 48, 64, 96, 128, 192, 256, 384, 512], size=(60, 3))
    points = [gemm(*s) for s in shapes]
    curve = Curve(points[:40])
    errors = [abs(curve.predict(b, f)[0] - t) / t for b, f, t in points[40:]]
    assert max(errors) < 0.01


def test_expected_error_measures_the_noise():
    rng = np.random.default_rng(1)
    sizes = np.geomspace(1e4, 1e8, 40)
    noisy = Curve([(b, 0.0, (2e-6 + b / 10e9) * rng.lognormal(0, 0.1)) for b in sizes])
    clean = Curve([(b, 0.0, 2e-6 + b / 10e9) for b in sizes])
    assert 0.04 < noisy.error < 0.3
    assert clean.error == pytest.approx(0.02)


def test_extrapolation_is_less_sure_than_interpolation():
    curve = Curve([(b, 0.0, memory_bound(b)) for b in np.geomspace(1e4, 1e6, 8)])
    _, inside = curve.predict(3e5, 0.0)
    _, far = curve.predict(1e9, 0.0)
    assert far > 2 * inside


def test_one_and_two_points():
    one = Curve([(1e6, 0.0, 1e-3)])
    assert one.predict(2e6, 0.0) == (pytest.approx(2e-3), 1.0)
    two = Curve([(1e6, 0.0, 1e-3), (2e6, 0.0, 2e-3)])
    assert two.predict(1.5e6, 0.0)[0] == pytest.approx(1.5e-3)


# -- the database as a cost source ----------------------------------------------------------------


def t(rows: int) -> TensorType:
    return TensorType.get((rows, 256), "f32")


def store(db: Database, kernel: Kernel, rows: int, seconds: float | None, **kw) -> None:
    x = t(rows)
    db.record(
        Measurement(
            kernel=kernel_info(kernel),
            device=device_of(kernel),
            signature=signature_of([x], [x]),
            dtypes="f32->f32",
            params=kw.pop("params", {}),
            attrs_key="",
            attrs="",
            bytes=instance_bytes([x], [x]),
            flops=float(x.num_elements),
            status="ok" if seconds is not None else "failed",
            median=seconds,
            min=seconds,
            spread=0.03,
            runs=10,
            max_error=0.0,
            message=None if seconds is not None else "wrong result",
            **kw,
        )
    )


def test_measured_estimated_roofline_and_failed(tmp_path):
    exp, neg, tanh = (KERNELS[f"numpy.atomic.{n}"] for n in ("exp", "neg", "sin"))
    path = str(tmp_path / "m.sqlite")
    with Database.open(path) as db:
        for rows in (16, 32, 64, 128, 256, 512):
            store(db, exp, rows, memory_bound(instance_bytes([t(rows)], [t(rows)])))
        store(db, neg, 64, None)
    source = DatabaseCostSource(path)
    measured = source.cost(exp, [t(64)], [t(64)], {})
    assert (measured.source, measured.rel_uncertainty) == ("measured", 0.03)
    assert measured.seconds == memory_bound(instance_bytes([t(64)], [t(64)]))
    estimated = source.cost(exp, [t(90)], [t(90)], {})
    want = memory_bound(instance_bytes([t(90)], [t(90)]))
    assert estimated.source == "estimated"
    assert estimated.seconds == pytest.approx(want, rel=0.02)
    assert 0.02 <= estimated.rel_uncertainty < 0.1
    assert source.cost(neg, [t(64)], [t(64)], {}).seconds == math.inf  # never chosen
    # a kernel with no record here, and other parameters than those measured: the roofline
    roofline = RooflineCostSource().cost(tanh, [t(64)], [t(64)], {})
    assert source.cost(tanh, [t(64)], [t(64)], {}) == roofline
    assert source.cost(exp, [t(64)], [t(64)], {"unroll": 4}).source == "roofline"


def test_missing_database_is_the_roofline_silently(tmp_path, capsys):
    source = DatabaseCostSource(str(tmp_path / "none.sqlite"))
    exp = KERNELS["numpy.atomic.exp"]
    assert source.cost(exp, [t(4)], [t(4)], {}).source == "roofline"
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "none.sqlite").exists()


def test_best_params_skip_failed_and_foreign_points():
    k = Kernel("numpy.tuned", "numpy", op="atomic.exp", params={"rows": (1, 2, 4)})
    rows = [
        ('{"rows":1}', "", "ok", 3e-3, 0.0),
        ('{"rows":2}', "", "ok", 1e-3, 0.0),
        ('{"rows":4}', "", "failed", None, None),  # wrong: never the best
        ('{"rows":8}', "", "ok", 1e-5, 0.0),  # not in the domain any more
    ]
    assert best_params(k, rows) == {"rows": 2}
    assert best_params(k, [rows[2]]) is None

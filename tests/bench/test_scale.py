"""Rank 0's real per-flush code (Reducer, StragglerWatch, OutlierWatch, the agreed stop, Blame, Stream) fed the
table N virtual ranks would gather, for N up to 16,384.

The collective is a fake: ``msbridge.bench.scale.VirtualJob`` builds the ``[N, HEADER + capacity]`` float32
table a real AllGather returns (one ``payload.pack`` row per rank, as ``metrics/payload.py`` documents it),
because thousands of ranks cannot run here. The real AllGather with real msrun ranks is tested in
tests/metrics/test_cross_rank.py and test_rank_agreement_msrun.py. Wall clock is printed by the bench
(``python -m msbridge.bench.scale``), never asserted here.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from msbridge.bench.scale import Plant, VirtualJob, line, summary
from msbridge.names import GLOBAL_LOSS, LOSS_MAX, LOSS_MIN, LOSS_STD, OUTLIER_RANK, rank_loss

RANKS = (8, 128, 1024, 4096, 16384)
WINDOWS = 5


@pytest.fixture(scope="module", params=RANKS)
def job(request):
    job = VirtualJob(ranks=request.param, window=100, seed=request.param)
    flushes = job.run(WINDOWS)
    print("\n" + line(summary(job, flushes)))
    return job, flushes


def direct(losses: np.ndarray):
    """The statistics straight from numpy over the ranks' gathered losses ``[ranks, steps]``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {GLOBAL_LOSS: losses.mean(axis=0), LOSS_MIN: np.nanmin(losses, axis=0),
                LOSS_MAX: np.nanmax(losses, axis=0), "dist/loss_mean": np.nanmean(losses, axis=0),
                LOSS_STD: np.nanstd(losses, axis=0),
                **{f"dist/loss_p{q}": np.nanpercentile(losses, q, axis=0) for q in (5, 50, 95)}}


def test_global_loss_and_spread_equal_numpy_at_every_step(job):
    job, flushes = job
    checked = 0
    for flush in flushes:
        expected = direct(flush.losses)
        steps = [r.step for r in flush.records]
        assert steps == list(range(steps[0], steps[0] + job.window)), "every step of the window has a record"
        tol = 1e-9 * float(np.nanmax(np.abs(flush.losses)))  # float64 sums of the same float32 values
        for name, want in expected.items():
            got = np.array([r.values[name] for r in flush.records])
            np.testing.assert_allclose(got, want, rtol=0, atol=tol, equal_nan=True, err_msg=name)
            checked += len(got)
    assert checked == WINDOWS * job.window * 8
    nan_step = job.plant.nan_step
    at_nan = next(r for f in flushes for r in f.records if r.step == nan_step)
    assert np.isnan(at_nan.values[GLOBAL_LOSS]) and at_nan.values["dist/loss_nonfinite_ranks"] == 1.0
    assert np.isfinite(at_nan.values[LOSS_MIN]), "the spread is over the finite losses"


def test_the_planted_ranks_are_named_in_events(job):
    job, flushes = job
    events = [e for f in flushes for e in f.events]
    by_kind = {}
    for e in events:
        by_kind.setdefault(e.kind, []).append(e.detail)
    assert [d["straggler_rank"] for d in by_kind["straggler"]] == [job.straggler], "the straggler, once"
    assert [d["stalled_rank"] for d in by_kind["rank_stall"]] == [job.stall], "the one-off stall, once"
    assert by_kind["rank_stall"][0]["longest_wait_ms"] == 5000.0
    assert job.stall not in [d["straggler_rank"] for d in by_kind["straggler"]], "a stall is not a straggler"
    assert [d["outlier_rank"] for d in by_kind["rank_outlier"]] == [job.outlier], "the outlier, when it starts"
    assert by_kind["rank_outlier"][0]["window_mean_loss"] > by_kind["rank_outlier"][0]["ranks_median"] + 0.4
    (blame,) = by_kind["blame"]
    assert (blame["blamed_rank"], blame["check"], blame["first_step"], blame["loss"]) == \
        (job.nan, "nonfinite", job.plant.nan_step, "nan")
    outliers = {r.values[OUTLIER_RANK] for f in flushes for r in f.records}
    assert outliers == {float(job.outlier)}, "dist/outlier_rank names the outlier in every window"


def test_rank_zero_series_do_not_grow_with_the_world_size(job):
    job, flushes = job
    row = summary(job, flushes)
    names = {n for f in flushes for r in f.records for n in r.values}
    per_rank = {n for n in names if "/rank_" in n}
    if job.ranks <= 16:
        assert {rank_loss(r) for r in range(job.ranks)} <= per_rank, "small jobs keep today's overlay"
    else:
        assert not per_rank and row["series"] <= 40, f"{row['series']} series at {job.ranks} ranks"
    assert row["received_bytes"] == job.ranks * row["sent_bytes"]


def test_explicit_per_rank_curves_and_none():
    picked = VirtualJob(ranks=128, per_rank_curves=[3, 77]).run(1)
    names = {n for f in picked for r in f.records for n in r.values if "/rank_" in n}
    assert names == {rank_loss(3), rank_loss(77), "dist/step_time_ms/rank_3", "dist/step_time_ms/rank_77"}
    small = VirtualJob(ranks=8, per_rank_curves="none", plant=Plant()).run(1)
    assert not [n for f in small for r in f.records for n in r.values if "/rank_" in n]


def test_per_rank_curves_naming_a_rank_outside_the_job_says_so(caplog):
    with caplog.at_level("WARNING", logger="msbridge"):
        VirtualJob(ranks=8, per_rank_curves=[1, 12])
    assert "per_rank_curves: rank(s) [12] are not in the reduction group (ranks 0-7)" in caplog.text

"""The parts of the per-flush agreement that need no second process: the payload, the agreed stop,
per-rank timing and stragglers, first-anomaly blame, and the ``straggler`` setting. The real-msrun
tests of the same behaviour are in test_rank_agreement_msrun.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from msbridge import ConfigError, load_config
from msbridge.health.runner import Stop
from msbridge.metrics.payload import (
    ANOMALY_STEP,
    CHECKS,
    FIRST,
    HEADER,
    LAST,
    STOP_FAILED,
    STOP_FINISHED,
    STOP_STEP,
    Slots,
    check_index,
    check_name,
    pack,
    unpack_step,
)
from msbridge.metrics.rank_health import Blame, JobStop, agree_stop, health_stop, stop_code
from msbridge.metrics.rank_timing import (
    DATA_WAIT_MAX,
    SLOWEST_RANK,
    STEP_TIME_MAX,
    STEP_TIME_MEDIAN,
    STEP_TIME_MIN,
    StepTimer,
    StragglerWatch,
    own_step_times,
)
from msbridge.names import rank_step_time
from msbridge.sinks.base import FAILED, FINISHED


def table(*rows: Slots, capacity: int = 4) -> np.ndarray:
    """What the AllGather hands every rank: one packed row per rank, float32 as on the wire."""
    return np.stack([pack(row, [1.0] * row.n, capacity) for row in rows])


def slots(**kw) -> Slots:
    return Slots(**{"n": 4, "batch": 8, "first": 17, "last": 20, **kw})


# -- payload -------------------------------------------------------------------------------------------------------
def test_steps_checks_and_losses_survive_the_float32_wire():
    big = 2**40 + 12345
    row = pack(Slots(n=2, batch=8, first=big, last=big + 1, stop_code=STOP_FAILED, stop_check="nonfinite",
                     stop_step=big + 1, anomaly_check="loss_spike", anomaly_step=big), [2.5, math.nan], capacity=3)
    assert row.dtype == np.float32 and row.shape == (HEADER + 3,)
    assert [unpack_step(row, s) for s in (FIRST, LAST, STOP_STEP, ANOMALY_STEP)] == [big, big + 1, big + 1, big]
    assert row[HEADER] == 2.5 and np.isnan(row[HEADER + 1:]).all()
    assert [check_name(check_index(c)) for c in CHECKS] == list(CHECKS)
    assert math.isnan(check_index(None)) and check_name(math.nan) is None


# -- one stop for all ranks ------------------------------------------------------------------------------------
def test_no_rank_stopping_is_no_stop():
    assert agree_stop(table(slots(), slots())) is None


def test_the_first_failing_stop_wins_over_an_earlier_early_stop_and_ties_go_to_the_lower_rank():
    gathered = table(slots(), slots(stop_code=STOP_FINISHED, stop_check="plateau", stop_step=17),
                     slots(stop_code=STOP_FAILED, stop_check="nonfinite", stop_step=19),
                     slots(stop_code=STOP_FAILED, stop_check="loss_spike", stop_step=19))
    assert agree_stop(gathered) == JobStop(rank=2, check="nonfinite", step=19, status=FAILED)
    early = table(slots(), slots(stop_code=STOP_FINISHED, stop_check="plateau", stop_step=18))
    assert agree_stop(early) == JobStop(rank=1, check="plateau", step=18, status=FINISHED)


def test_each_rank_takes_the_agreed_stop_and_the_cause_keeps_its_own_reason():
    own = Stop(19, "nonfinite", FAILED, "nonfinite at step 19: nonfinite ['train/loss']")
    assert stop_code(own) == STOP_FAILED and stop_code(None) == 0.0
    agreed = JobStop(rank=2, check="nonfinite", step=19, status=FAILED)
    assert health_stop(agreed, own, rank=2) is own
    other = health_stop(agreed, None, rank=0)
    assert (other.status, other.check, other.reason) == (FAILED, "nonfinite",
                                                         "nonfinite on rank 2 at step 19 stopped every rank")


# -- timing and stragglers -----------------------------------------------------------------------------------------
def test_step_timer_splits_each_step_into_data_wait_and_run():
    timer = StepTimer()
    timer.step(0.000, None)  # the first step only starts the clock; its hook returns at 1 ms
    t, hook_s = 0.001, 0.001
    for wait, run in ((0.002, 0.010), (0.004, 0.010), (0.003, 0.030)):
        timer.step(t + wait + run, t, t + wait, hook_s=hook_s)  # the hook before it: its time, known now
        t, hook_s = t + wait + run + 0.0005, 0.0005
    step, run, wait, wait_max, callback = timer.drain()
    assert (step, run, wait, wait_max) == pytest.approx((14.0, 10.0, 3.0, 4.0))
    assert callback == pytest.approx(2.0)  # the hooks before the three steps: 1 + 0.5 + 0.5 ms
    timer.step(t + 0.02, t, hook_s=0.0005)  # no begin stamp (device sink mode): a step time, nothing else
    out = timer.drain()
    assert out[0] == pytest.approx(20.0) and np.isnan(out[1:4]).all() and out[4] == pytest.approx(0.5)


def timing(*rows):
    """``[ranks, TIMING_FIELDS]`` rows of (step, run, data wait) ms; no wait max or callback time."""
    return np.array([[s, r, w, w, 0.0] for s, r, w in rows], dtype=np.float32)


def test_a_ranks_own_step_time_leaves_out_its_wait_for_the_others():
    # rank 1 loads data 3 ms longer; ranks 0 and 2 wait those 3 ms inside their run (the gradient AllReduce)
    own = own_step_times(timing((13, 12, 1), (13, 9, 4), (13, 12, 1)))
    np.testing.assert_allclose(own, [10.0, 13.0, 10.0])
    np.testing.assert_allclose(own_step_times(np.array([[13, np.nan, np.nan, np.nan, 0]])), [13.0])


def test_only_a_rank_slow_in_k_consecutive_windows_is_a_straggler():
    watch = StragglerWatch(4, margin=0.15, windows=3, curves=range(4))
    normal = [(13, 12, 1)] * 4
    slow3 = normal[:3] + [(13, 9, 4)]  # rank 3: 30% slower than the others every window
    events = []
    for i, rows in enumerate([slow3, slow3, [normal[0], (500, 9, 490), normal[2], (13, 9, 4)], slow3, slow3]):
        metrics, found = watch.observe(timing(*rows), first_step=4 * i + 1, last_step=4 * i + 4, rank=0)
        events += found
    assert [(e.step, e.detail["straggler_rank"], e.detail["windows"], e.detail["since_step"]) for e in events] == \
        [(12, 3, 3, 1)], "named once, at its third slow window; rank 1's single stalled window names nobody"
    assert events[0].detail["slower_pct"] == pytest.approx(30.0) and events[0].detail["data_wait_ms"] == 4.0
    assert metrics[SLOWEST_RANK] == 3.0 and metrics[rank_step_time(3)] == pytest.approx(13.0)
    assert (metrics[STEP_TIME_MIN], metrics[STEP_TIME_MEDIAN], metrics[STEP_TIME_MAX]) == pytest.approx((10, 10, 13))
    assert metrics[DATA_WAIT_MAX] == 4.0
    assert watch.streak.tolist() == [0, 0, 0, 5]


# -- first-anomaly blame -------------------------------------------------------------------------------------------
def finding(check, step):
    return slots(anomaly_check=check, anomaly_step=step)


def test_blame_names_the_first_rank_and_lists_the_ranks_that_followed():
    blame = Blame(quiet_steps=4)
    losses = np.array([[1.0, 1.0, 1.0, math.nan], [1.0, 1.0, math.nan, math.nan]])
    events = blame.observe(table(finding("nonfinite", 20), finding("nonfinite", 19)), losses, [0, 1],
                           np.arange(17, 21), rank=0)
    assert [(e.kind, e.step, e.rank) for e in events] == [("blame", 19, 0)]
    assert events[0].detail == {"blamed_rank": 1, "check": "nonfinite", "first_step": 19, "same_step_ranks": [1],
                                "then": [{"rank": 0, "step": 20, "check": "nonfinite"}], "loss": "nan"}
    follow = table(finding("nonfinite", 21), slots(), capacity=4)
    assert blame.observe(follow, losses, [0, 1], np.arange(21, 25), rank=0) == [], "the same incident"
    later = blame.observe(table(finding("loss_spike", 90), finding("loss_spike", 90)), losses, [0, 1],
                          np.arange(87, 91), rank=0)
    assert [(e.detail["blamed_rank"], e.detail["same_step_ranks"]) for e in later] == [(0, [0, 1])]


# -- the setting ---------------------------------------------------------------------------------------------------
def test_straggler_setting_defaults_merges_and_names_bad_keys():
    assert dict(load_config({}).straggler) == {"margin": 0.15, "windows": 3}
    assert dict(load_config({"straggler": {"windows": 5}}, ["straggler.margin=0.3"]).straggler) == \
        {"margin": 0.3, "windows": 5}
    with pytest.raises(ConfigError) as err:
        load_config({"straggler": {"margn": 0.2, "windows": 0}})
    assert err.value.problems == ["<dict>: straggler.margn: unknown key; did you mean 'margin'?",
                                  "<dict>: straggler.windows: expected an integer >= 1 and <= 10_000_000, got 0"]


def test_per_rank_curves_setting_auto_none_or_ranks():
    from msbridge.metrics.spread import AUTO_CURVES_MAX_RANKS, curve_ranks

    assert load_config({}).per_rank_curves == "auto"
    assert load_config({"per_rank_curves": [3, 1]}).per_rank_curves == (3, 1)
    assert load_config({}, ["per_rank_curves=none"]).per_rank_curves == "none"
    with pytest.raises(ConfigError, match=r"per_rank_curves: expected 'auto', 'none' or a non-empty list of ranks"):
        load_config({"per_rank_curves": "all"})
    assert curve_ranks("auto", range(AUTO_CURVES_MAX_RANKS)) == list(range(16))
    assert curve_ranks("auto", range(17)) == [] and curve_ranks("none", range(4)) == []
    assert curve_ranks((3, 1, 99), [0, 1, 2, 3]) == [1, 3], "only ranks of the group, in rank order"

"""Which events alert, on which rank, and how often (the rate limit and its "and N more")."""
from __future__ import annotations

from msbridge.alerts.message import alert_for, category
from msbridge.alerts.policy import Policy
from msbridge.alerts.spec import DEFAULT_ON, ON_VALUES
from msbridge.sinks.base import Event, RunInfo


def run_info(rank=0):
    return RunInfo(run_id="id", run_name="r", experiment="e", rank=rank, world_size=2, is_global=rank == 0,
                   run_dir="/runs/e/r")


def nan(step, rank=0):
    return Event("anomaly", step, rank, 1.0, {"check": "nonfinite", "nonfinite": ["train/loss"]})


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_every_event_kind_msbridge_records_has_its_category():
    cases = {("anomaly", "nonfinite"): "nonfinite", ("anomaly", "loss_spike"): "spike",
             ("anomaly", "grad_norm_spike"): "spike", ("anomaly", "plateau"): "plateau",
             ("anomaly", "throughput_drop"): "throughput_drop", ("blame", "nonfinite"): "nonfinite",
             ("job_stop", None): "stop", ("early_stop", "plateau"): "stop", ("stall", None): "stall",
             ("resumed", None): "stall", ("straggler", None): "straggler", ("gap", None): "undelivered",
             ("histogram", None): None, ("resume", None): None, ("recovery", "loss_spike"): None}
    for (kind, check), expected in cases.items():
        assert category(Event(kind, 1, 0, 0.0, {"check": check})) == expected, (kind, check)
    assert category(Event("action", 1, 0, 0.0, {"action": "stop"})) == "stop"
    assert category(Event("action", 1, 0, 0.0, {"action": "dump"})) is None
    assert set(DEFAULT_ON) <= set(ON_VALUES) and "spike" not in DEFAULT_ON


def test_one_message_per_kind_per_window_then_and_n_more():
    clock = Clock()
    policy = Policy(frozenset(DEFAULT_ON), window_s=60, is_global=True, clock=clock)
    first = policy.admit(alert_for(nan(20), "nonfinite", run_info()))
    assert first is not None and first.more == 0
    for step in (25, 30, 35):
        clock.now += 10
        assert policy.admit(alert_for(nan(step), "nonfinite", run_info())) is None
    clock.now = 61  # the window is over: the next one goes out and says what was held
    after = policy.admit(alert_for(nan(40), "nonfinite", run_info()))
    assert after.step == 40 and after.more == 3
    assert "and 3 more nonfinite alert(s)" in "\n".join(after.text_lines())
    clock.now = 62
    assert policy.admit(alert_for(nan(45), "nonfinite", run_info())) is None
    [held] = policy.held()  # at close: the held one goes out
    assert held.step == 45 and held.more == 0
    assert policy.held() == []


def test_the_same_finding_on_the_same_step_alerts_once_and_kinds_are_limited_apart():
    policy = Policy(frozenset(DEFAULT_ON), window_s=300, is_global=True, clock=Clock())
    assert policy.admit(alert_for(nan(20), "nonfinite", run_info())) is not None
    assert policy.admit(alert_for(nan(20), "nonfinite", run_info())) is None
    assert policy.held() == [], "a duplicate is dropped, not held"
    stall = Event("stall", 20, 0, 0.0, {"seconds_since_step": 900})
    resumed = Event("resumed", 21, 0, 0.0, {"stalled_s": 950})
    assert policy.admit(alert_for(stall, "stall", run_info())) is not None
    assert policy.admit(alert_for(resumed, "stall", run_info())) is not None, "resumed has its own window"


def test_only_the_global_rank_sends_job_level_alerts_every_rank_its_own_stall():
    """However many ranks see the NaN, the webhook hears it from rank 0 only."""
    policies = [Policy(frozenset(DEFAULT_ON), 300, is_global=rank == 0) for rank in range(4)]
    sent = [p.wants(nan(20, rank)) for rank, p in enumerate(policies)]
    assert sent == ["nonfinite", None, None, None]
    stalls = [p.wants(Event("stall", 20, rank, 0.0, {})) for rank, p in enumerate(policies)]
    assert stalls == ["stall"] * 4


def test_on_picks_the_categories():
    policy = Policy(frozenset({"stall"}), 300, is_global=True)
    assert policy.wants(nan(20)) is None and policy.wants(Event("stall", 3, 0, 0.0, {})) == "stall"
    opt_in = Policy(frozenset({"spike"}), 300, is_global=True)
    assert opt_in.wants(Event("anomaly", 3, 0, 0.0, {"check": "loss_spike"})) == "spike"


def test_in_a_multi_rank_run_a_finding_alerts_as_blame_not_as_rank_0s_own_anomaly():
    policy = Policy(frozenset(DEFAULT_ON), 300, is_global=True, world_size=8)
    assert policy.wants(nan(21)) is None
    blame = Event("blame", 20, 0, 1.0, {"check": "nonfinite", "blamed_rank": 3, "same_step_ranks": [3, 5]})
    assert policy.wants(blame) == "nonfinite"
    assert alert_for(blame, "nonfinite", run_info()).message == \
        "non-finite values at step 20, first on rank 3 (ranks at that step: 3, 5)"
    assert Policy(frozenset(DEFAULT_ON), 300, is_global=True).wants(nan(21)) == "nonfinite"  # one process

"""msbridge diagnose's ``slowdown`` on real CPU training runs' jsonl: an input pipeline slowed mid-run, a step
slowed mid-run, and a run at one speed throughout."""
from __future__ import annotations

import numpy as np
from helpers.load import cpu_hogs
from helpers.runs import monitor
from helpers.slow_training import SLOW_FROM, Busy, Samples, train
import pytest

from msbridge.cli.main import main
from msbridge.names import DATA_WAIT_PCT, STEP_TIME
from msbridge.offline.diagnose import diagnose
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS = 120
STEP_S = 0.02  # the step's own work (a sleep inside the step, as a model's compute would be)
SLOW_S = 0.035  # a step slowed mid-run: its sleep from then on


def level_changes_at(mon, step):
    """The step times themselves: the 10 steps from ``step`` on are 20 % slower than the 10 before it, and
    so is the rest of the run than everything before it (the first step, the compile, left out)."""
    times = np.array([v for _, v in read_run(mon.run_dir).ranks[0].series(STEP_TIME)])
    i = step - 1
    assert np.median(times[i:i + 10]) > 1.2 * np.median(times[i - 10:i])
    assert np.median(times[i:]) > 1.2 * np.median(times[1:i])


def slowdowns(mon):
    run = read_run(mon.run_dir)
    times = run.ranks[0].series(STEP_TIME)
    assert [s for s, _ in times] == list(range(1, STEPS + 1)), "every step has its step time"
    assert len(run.ranks[0].series(DATA_WAIT_PCT)) >= 4, "a data-wait share per flush window"
    report = diagnose(run)
    assert "slowdown" in report.checks, report.skipped
    return [f for f in report.findings if f.check == "slowdown"], report


def test_an_input_pipeline_slowed_mid_run(tmp_path):
    """From the batch of step 61 on a batch takes 35 ms to read, longer than the 20 ms step; with a 1-batch
    prefetch queue the steps wait for it ~10 steps later, once the batches read ahead are used up."""
    mon = monitor(tmp_path, flush_steps=10)
    train([Busy(STEP_S), mon], Samples(STEPS, slow_from=SLOW_FROM, batch_s=0.035), prefetch=1)
    [finding], report = slowdowns(mon)
    before, after = finding.evidence["step_time_ms"]
    wait_before, wait_after = finding.evidence["data_wait_pct"]
    assert SLOW_FROM <= finding.evidence["step"] <= SLOW_FROM + 20, finding.title
    level_changes_at(mon, finding.evidence["step"])
    assert 1.3 < after / before < 2.2 and wait_before < 10 and 20 < wait_after < 60, finding.evidence
    assert finding.evidence["cause"] == "input_pipeline" and "input pipeline" in finding.advice
    assert f"slower at step {finding.evidence['step']}" in finding.title
    assert f"data wait went from {wait_before:.0f}% to {wait_after:.0f}%" in finding.title
    assert finding.title in report.to_text()


def test_a_step_slowed_mid_run(tmp_path, capsys):
    mon = monitor(tmp_path, flush_steps=10)
    train([Busy(STEP_S, slow_from=SLOW_FROM, slow_s=SLOW_S), mon], Samples(STEPS))
    [finding], _ = slowdowns(mon)
    assert abs(finding.evidence["step"] - SLOW_FROM) <= 3, finding.title
    level_changes_at(mon, finding.evidence["step"])
    assert finding.evidence["cause"] == "step" and max(finding.evidence["data_wait_pct"]) < 10
    before, after = finding.evidence["step_time_ms"]
    # the gap, not the ratio, is what the step got: load inflates both sides (in CI, 29.0 -> 40.4 ms: 1.39)
    added_ms = 1000 * (SLOW_S - STEP_S)
    assert 0.5 * added_ms < after - before < 1.5 * added_ms, finding.evidence
    main(["diagnose", str(mon.run_dir)])
    assert f"the step got {finding.title.split('the step got ')[1].split('%')[0]}% slower" in capsys.readouterr().out


def test_a_run_at_one_speed_has_no_slowdown(tmp_path):
    mon = monitor(tmp_path, flush_steps=10)
    train([Busy(STEP_S), mon], Samples(STEPS))
    found, _ = slowdowns(mon)
    assert found == []


@pytest.mark.alone  # 2 CPU-bound processes: the other pytest-xdist workers wait
@pytest.mark.parametrize("slowed", ["step", "input_pipeline", None])
def test_beside_2_busy_processes_the_slowdown_and_its_cause_are_found_and_a_steady_run_has_none(tmp_path, slowed):
    """On a busy host a step's own noise is 10-15 % of it: the 50 % shift is a level that moved, not each step
    (the check's standard error of the two medians, not a step's sigma)."""
    mon = monitor(tmp_path, flush_steps=10)
    with cpu_hogs(2):
        if slowed == "input_pipeline":
            train([Busy(STEP_S), mon], Samples(STEPS, slow_from=SLOW_FROM, batch_s=0.035), prefetch=1)
        else:
            train([Busy(STEP_S, slow_from=SLOW_FROM if slowed else None, slow_s=SLOW_S), mon], Samples(STEPS))
    found, _ = slowdowns(mon)
    if slowed is None:
        assert found == [], [f.title for f in found]
        return
    [finding] = found
    assert SLOW_FROM - 3 <= finding.evidence["step"] <= SLOW_FROM + 20, finding.title
    level_changes_at(mon, finding.evidence["step"])
    assert finding.evidence["cause"] == slowed, finding.evidence

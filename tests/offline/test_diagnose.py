"""msbridge diagnose: each reading fires on its scenario and stays quiet on clean runs; bad input; a real run."""
from __future__ import annotations

import json
import math
import tempfile

import numpy as np
import pytest
from helpers import synthetic_runs as sr
from hypothesis import example, given, settings
from hypothesis import strategies as st

from msbridge.cli.main import main
from msbridge.names import GRAD_NORM, LOSS, OVERFLOW
from msbridge.offline.diagnose import diagnose, mad_sigma, rolling_median, spearman
from msbridge.sinks.runlog import read_run


def report_of(tmp_path, scenario, name="run"):
    return diagnose(read_run(sr.write_run(tmp_path / name, scenario)))


def checks(report):
    return sorted(f.check for f in report.findings)


def only(report, check):
    assert checks(report) == [check], report.to_text()
    return report.findings[0]


# -- both directions: fires on its scenario, silent on clean runs ------------------------
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("world_size", [1, 4])
def test_clean_run_has_no_findings_and_says_so(tmp_path, seed, world_size):
    report = report_of(tmp_path, sr.clean(world_size=world_size, seed=seed))
    assert report.findings == [], report.to_text()
    assert "no findings" in report.to_text()
    expected = {"nonfinite", "lr_too_high", "loss_spike", "periodic_grad_spikes", "slowdown"}
    assert set(report.checks) == expected | ({"rank_outlier", "first_anomaly"} if world_size > 1 else set())
    assert "straggler" in report.skipped, "the synthetic runs carry no per-rank step times"


@given(seed=st.integers(0, 2**32 - 1))
@example(seed=188)  # a 4-sigma noise step in a quiet stretch, once taken for a spike
@settings(max_examples=15, deadline=None)
def test_no_false_alarm_on_any_noisy_clean_run(seed):
    with tempfile.TemporaryDirectory() as tmp:
        report = diagnose(read_run(sr.write_run(tmp, sr.clean(world_size=2, seed=seed))))
    assert report.findings == [], report.to_text()


@pytest.mark.parametrize("seed", range(3))
def test_lr_too_high_loss_falls_while_grad_norm_rises(tmp_path, seed):
    f = only(report_of(tmp_path, sr.lr_too_high(seed=seed)), "lr_too_high")
    assert f.level == "high" and "while the loss falls" in f.title and "lr is likely too high" in f.advice
    low, high = f.evidence["grad_norm_median"]
    assert high > 3 * low and f.evidence["loss_median"][1] < f.evidence["loss_median"][0]
    assert f.evidence["window"][0] >= sr.WARMUP  # the warm-up climb is not judged


def test_lr_too_high_is_less_sure_while_the_lr_decays(tmp_path):
    constant = only(report_of(tmp_path, sr.lr_too_high(), "a"), "lr_too_high")
    decaying = only(report_of(tmp_path, sr.lr_too_high(cosine=True), "b"), "lr_too_high")
    assert decaying.confidence < constant.confidence
    assert "lr fell by more than half" in decaying.why


def test_loss_and_grad_norm_rising_together_is_divergence(tmp_path):
    f = only(report_of(tmp_path, sr.diverging()), "lr_too_high")
    assert "diverging" in f.title and f.level in ("medium", "high")


@pytest.mark.parametrize("seed", range(3))
def test_loss_spike_names_the_steps_and_the_rank(tmp_path, seed):
    f = only(report_of(tmp_path, sr.loss_spike(at=(150, 220), rank=1, seed=seed)), "loss_spike")
    assert f.steps == [150, 220] and f.ranks == [1]
    assert all("rank 1" in s["seen_in"] for s in f.evidence["spikes"])
    assert f.level == "high"  # the global loss rose about 2.5x


@given(at=st.integers(60, 270), seed=st.integers(0, 1000))
@settings(max_examples=15, deadline=None)
def test_loss_spike_found_wherever_it_is(at, seed):
    with tempfile.TemporaryDirectory() as tmp:
        report = diagnose(read_run(sr.write_run(tmp, sr.loss_spike(at=(at,), seed=seed))))
    assert checks(report) == ["loss_spike"] and report.findings[0].steps == [at], report.to_text()


def test_a_level_change_is_not_a_spike(tmp_path):
    assert "loss_spike" not in checks(report_of(tmp_path, sr.loss_jump()))


def test_spike_in_warmup_is_not_judged(tmp_path):
    scenario = sr.clean()
    scenario.ranks[0][LOSS][9] *= 3  # step 10, inside the lr warm-up
    assert report_of(tmp_path, scenario).findings == []


@pytest.mark.parametrize("rank", [0, 2, 3])
def test_rank_outlier_names_the_rank(tmp_path, rank):
    f = only(report_of(tmp_path, sr.slow_rank(rank=rank, world_size=4)), "rank_outlier")
    assert f.ranks == [rank] and f"rank {rank}" in f.title
    assert f.evidence["median_excess"] == pytest.approx(0.12, abs=0.03)


def test_rank_outlier_from_rank0_dist_metrics_when_other_files_are_missing(tmp_path):
    run_dir = sr.write_run(tmp_path / "run", sr.slow_rank(rank=3, world_size=4))
    for r in (1, 2, 3):
        (tmp_path / "run" / "metrics" / f"rank_{r}.jsonl").unlink()
    assert only(diagnose(read_run(run_dir)), "rank_outlier").ranks == [3]


@pytest.mark.parametrize("period", [8, 25, 40])
def test_periodic_grad_spikes_report_the_period(tmp_path, period):
    f = only(report_of(tmp_path, sr.periodic_grad_spikes(period=period)), "periodic_grad_spikes")
    assert f.evidence["period"] == period and f"every {period} steps" in f.title
    assert all(s % period == 0 for s in f.steps)


def test_nonfinite_steps_are_reported_with_the_event(tmp_path):
    report = report_of(tmp_path, sr.nan_steps(at=(160, 161)))
    f = only(report, "nonfinite")
    assert f.steps == [160, 161] and f.confidence == 1.0 and "first at step 160" in f.title
    assert [e["step"] for e in report.events] == [160, 161]
    assert "events recorded during training (2)" in report.to_text()


def test_overflow_steps_skipped_by_the_loss_scaler_are_not_nonfinite_unless_the_loss_is(tmp_path):
    scenario = sr.clean()
    columns = scenario.ranks[0]
    columns[OVERFLOW] = np.zeros(300)
    columns[OVERFLOW][[99, 199]] = 1.0
    columns[GRAD_NORM][[99, 199]] = math.inf  # the overflow itself: expected, the step was skipped
    assert report_of(tmp_path, scenario, "a").findings == []
    columns[LOSS][199] = math.nan  # a NaN loss is never expected
    assert only(report_of(tmp_path, scenario, "b"), "nonfinite").steps == [200]


def test_missing_grad_norm_skips_those_checks_and_says_why(tmp_path):
    report = report_of(tmp_path, sr.without(sr.lr_too_high(), GRAD_NORM))
    assert report.findings == []
    assert set(report.skipped) == {"lr_too_high", "periodic_grad_spikes", "rank_outlier", "straggler",
                                   "first_anomaly"}
    assert "no train/grad_norm recorded" in report.skipped["lr_too_high"]
    assert "skipped lr_too_high: no train/grad_norm recorded" in report.to_text()


def test_too_short_a_run_skips_instead_of_guessing(tmp_path):
    report = report_of(tmp_path, sr.lr_too_high(steps=35))
    assert report.findings == [] and "needs 30" in report.skipped["lr_too_high"]


# -- robust statistics ------------------------------------------------------------
def test_robust_helpers():
    values = np.array([1.0, 2.0, 100.0, 3.0, 4.0])
    assert rolling_median(values, 3).tolist() == [1.5, 2.0, 3.0, 4.0, 3.5]
    assert mad_sigma(np.array([1.0, 1.0, 1.0, 50.0])) == pytest.approx(1e-12)  # one outlier does not move it
    assert spearman(np.arange(10), np.arange(10) ** 3) == pytest.approx(1.0)
    assert spearman(np.arange(10), np.ones(10)) == 0.0  # ties are not an order
    assert spearman(np.arange(6), np.array([1, 1, 2, 2, 3, 3])) == pytest.approx(0.956, abs=1e-3)


# -- bad input, through the command line --------------------------------------------
def test_cut_last_line_is_used_and_said(tmp_path, capsys):
    run_dir = sr.write_run(tmp_path / "run", sr.loss_spike())
    sr.cut_last_line(run_dir, rank=1)
    report = diagnose(read_run(run_dir))
    assert report.notes == ["rank_1.jsonl: the last line was cut (killed run?); "
                            "used the 299 complete metrics lines before it"]
    assert checks(report) == ["loss_spike"]
    assert main(["diagnose", run_dir]) == 0
    assert "note: rank_1.jsonl: the last line was cut" in capsys.readouterr().out


def test_json_format_is_well_formed(tmp_path, capsys):
    run_dir = sr.write_run(tmp_path / "run", sr.nan_steps())
    assert main(["diagnose", run_dir, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranks"] == [0] and out["steps"] == [1, 300]
    (finding,) = out["findings"]
    assert finding["check"] == "nonfinite" and finding["level"] == "high" and finding["steps"] == [160]
    assert out["events"][0]["detail"] == {"check": "nonfinite_loss", "value": "nan"}
    assert out["skipped"] == {"rank_outlier": "only one rank in this run (no per-rank local losses)",
                              "straggler": "no per-rank step times (perf/own_step_time_ms): a single-process run, "
                                           "or one recorded before msbridge carried each rank's timing",
                              "first_anomaly": "only one rank's file in this run: nothing to compare"}


def test_not_a_run_dir_exits_2_naming_what_is_missing(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path)]) == 2
    assert "metrics/rank_*.jsonl is missing" in capsys.readouterr().err
    assert main(["diagnose", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_newer_schema_exits_2_naming_both_versions(tmp_path, capsys):
    assert main(["diagnose", sr.write_header_only(str(tmp_path / "run"), schema_version=99)]) == 2
    err = capsys.readouterr().err
    assert "schema version 99" in err and "up to version 1" in err


def test_header_only_run_says_there_is_nothing_yet(tmp_path):
    report = diagnose(read_run(sr.write_header_only(str(tmp_path / "run"))))
    assert report.findings == [] and "no metrics lines" in report.skipped["all"]


# -- real MindSpore runs -------------------------------------------------------------
@pytest.mark.slow
def test_real_healthy_run_is_well_formed_and_not_lr_too_high(tmp_path):
    report = diagnose(read_run(sr.train_real_run(str(tmp_path / "real"), steps=200)))
    assert report.steps == (1, 200) and report.notes == []
    assert "lr_too_high" in report.checks  # the grad norm was really recorded and judged
    assert report.findings == [], report.to_text()
    assert json.loads(json.dumps(report.to_dict()))["run_name"] == "real-regression"


@pytest.mark.slow
def test_real_nan_batch_is_found_at_its_step(tmp_path):
    report = diagnose(read_run(sr.train_real_run(str(tmp_path / "real"), steps=80, poison_step=50)))
    f = next(f for f in report.findings if f.check == "nonfinite")
    assert "first at step 50" in f.title
    assert f.steps == list(range(50, 81))  # the NaN batch poisons the weights: NaN to the end


def test_loss_spike_names_the_layer_whose_grad_norm_spiked_first(tmp_path):
    scenario = sr.with_layer_norms(sr.loss_spike(at=(150,), rank=0, world_size=1),
                                   spikes={"layers.2": [147, 148, 149, 150], "lm_head": [149, 150]})
    f = only(report_of(tmp_path, scenario), "loss_spike")
    assert f.evidence["first_layer"]["layer"] == "layers.2" and f.evidence["first_layer"]["step"] == 147
    assert "The first layer whose grad norm spiked: layers.2 at step 147" in f.advice


def test_periodic_grad_spikes_name_the_layer_that_leads(tmp_path):
    scenario = sr.with_layer_norms(sr.clean(), spikes={"layers.0": list(range(25, 301, 25))}, factor=8.0)
    f = only(report_of(tmp_path, scenario), "periodic_grad_spikes")
    assert f.evidence["first_layer"]["layer"] == "layers.0" and f.evidence["first_layer"]["step"] == f.steps[0]


def test_nan_names_the_first_nonfinite_layer(tmp_path):
    scenario = sr.with_layer_norms(sr.nan_steps(at=(160,)))
    scenario.ranks[0]["grad_norm/layers.1"][158] = math.inf  # step 159, before the loss goes NaN
    f = only(report_of(tmp_path, scenario), "nonfinite")
    assert f.evidence["first_layer"] == {"step": 159, "layers": ["layers.1"]}


def test_without_layer_norms_nothing_is_added(tmp_path):
    f = only(report_of(tmp_path, sr.loss_spike(at=(150,), rank=0, world_size=1)), "loss_spike")
    assert "first_layer" not in f.evidence and "first layer" not in f.advice

"""The saved views msbridge writes to MLflow: a run's, the train section's loss first, the perf section's first row
MFU, tokens seen and the loss over tokens seen; a sweep's, each trial's state beside its objective, written as each
run of the sweep ends (two workers on PostgreSQL and a real ``mlflow server``: tests/sweep/test_sweep_join.py).

Checked by hand in MLflow 3.17.2's UI (headless Chromium, this VM, 2026-12-04): the perf section's first row
shows these three, and MLflow files a chart it generates (``perf/data_wait_ms``) by name among a section's
cards unless the section is ``isReordered``, where it appends it (its bundle's chart reconciling code).
"""
from __future__ import annotations

import json
import math
import uuid

import pytest
from helpers.runs import make_records, make_run

from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_TAG, SWEEP_TAG
from msbridge.adapters.mlflow_tracker.run.view import (BEST_TAG, LOSS_OVER_TOKENS, STATE_TAG, VIEW_SECTIONS, VIEW_TAG_PREFIX,
                                            compared_view, loss_first_view)
from msbridge.names import DATA_WAIT_PCT, LOSS, MFU, OBJECTIVE_BEST, SAMPLES_PER_S, TFLOPS, TOKENS_SEEN
from msbridge.sinks.base import Event, Record
from msbridge.sweep.trial import PRUNED_EVENT


def state():
    key, value = loss_first_view("e36a30f1d658")
    assert key == "mlflow.sharedViewState.msbridge-e36a30f1d658"
    return json.loads(value)


def test_the_perf_section_opens_on_mfu_tokens_seen_and_the_loss_over_tokens():
    charts = state()["compareRunCharts"]
    perf = [c for c in charts if c["metricSectionId"] == "msbridge-perf"]
    assert [c["metricKey"] for c in perf] == [MFU, TOKENS_SEEN, LOSS, SAMPLES_PER_S, TFLOPS, DATA_WAIT_PCT]
    over_tokens = perf[2]
    assert over_tokens["uuid"] == LOSS_OVER_TOKENS and over_tokens["xAxisKey"] == "metric"
    assert over_tokens["selectedXAxisMetricKey"] == TOKENS_SEEN and over_tokens["useGlobalXaxisKey"] is False
    assert all(c["xAxisKey"] == "step" and c["useGlobalXaxisKey"] for c in charts if c is not over_tokens)
    assert len({c["uuid"] for c in charts}) == len(charts), "every card its own uuid"


def test_the_sections_with_chosen_cards_keep_their_order():
    sections = state()["compareRunSections"]
    assert [s["name"] for s in sections] == ["train", *(n for n in VIEW_SECTIONS if n != "train")]
    assert {s["name"] for s in sections if s["isReordered"]} == {"train", "perf"}


def test_a_sweeps_view_puts_the_trial_state_beside_the_objective_and_a_plain_comparison_does_not():
    runs = [({"lr": "0.1"}, {SWEEP_TAG: "s1"}), ({"lr": "0.2"}, {SWEEP_TAG: "s1"})]
    columns = json.loads(compared_view(runs)[1])["selectedColumns"]
    assert columns[columns.index(f"tags.`{STATE_TAG}`") + 1] == f"metrics.`{OBJECTIVE_BEST}`"
    plain = json.loads(compared_view([({"lr": "0.1"}, {}), ({"lr": "0.2"}, {})])[1])["selectedColumns"]
    assert f"tags.`{STATE_TAG}`" not in plain and f"metrics.`{OBJECTIVE_BEST}`" in plain


def _trial_records(best):
    """Ten steps of records, ``objective/best`` at the last."""
    records = make_records(range(1, 11))
    last = records[-1]
    return records[:-1] + [Record(last.step, last.rank, last.time, {**last.values, OBJECTIVE_BEST: best})]


@pytest.mark.slow
def test_a_sweeps_runs_end_with_their_trial_state_and_write_its_one_view(shared_sqlite, tmp_path):
    """Six runs of one sweep through the MLflow sink on a real sqlite store: RUNNING while they run; as each ends,
    its state as Optuna names it; the best complete run marked (a pruned, NaN, failed or killed run with a lower
    value never takes it); and, written by the runs' own closes, one saved view of the sweep."""
    from mlflow.tracking import MlflowClient

    from msbridge.adapters.mlflow_sink import MlflowSink

    sweep_id = f"s{uuid.uuid4().hex[:8]}"
    cases = {"a": ("FINISHED", 0.5, False, "COMPLETE"), "b": ("FINISHED", 0.3, False, "COMPLETE"),
             "pruned": ("FINISHED", 0.1, True, "PRUNED"), "nan": ("FINISHED", math.nan, False, "FAIL"),
             "failed": ("FAILED", 0.05, False, "FAIL"), "killed": ("KILLED", 0.01, False, "FAIL")}
    sinks = {}
    for i, (name, (_, best, pruned, _)) in enumerate(cases.items()):
        config = {"experiment": sweep_id, "sweep_id": sweep_id, "params": {"lr": 0.1 * (i + 1)}}
        sink = sinks[name] = MlflowSink(tracking_uri=shared_sqlite)
        sink.open(make_run(tmp_path, name=name, experiment=sweep_id, run_id=uuid.uuid4().hex, config=config))
        sink.write(_trial_records(best), [Event(PRUNED_EVENT, 10, 0, 0.0, {"trial": i})] if pruned else [])
    client = MlflowClient(shared_sqlite)
    experiment = client.get_experiment_by_name(sweep_id)

    def children():
        runs = client.search_runs([experiment.experiment_id], f"tags.`{SWEEP_TAG}` = '{sweep_id}'")
        return {r.info.run_name: r for r in runs if PARENT_TAG not in r.data.tags}

    assert {name: run.data.tags.get(STATE_TAG) for name, run in children().items()} == dict.fromkeys(cases, "RUNNING")
    for name, sink in sinks.items():
        sink.close(cases[name][0])
    ended = children()
    assert {name: run.data.tags[STATE_TAG] for name, run in ended.items()} == {n: c[3] for n, c in cases.items()}
    assert [name for name, run in ended.items() if BEST_TAG in run.data.tags] == ["b"]

    tags = client.get_experiment(experiment.experiment_id).tags
    assert [key for key in tags if key.startswith(VIEW_TAG_PREFIX)] == [f"{VIEW_TAG_PREFIX}msbridge-sweep-{sweep_id}"]
    view = json.loads(tags[f"{VIEW_TAG_PREFIX}msbridge-sweep-{sweep_id}"])
    assert view["selectedColumns"][1:4] == ["params.`lr`", f"tags.`{STATE_TAG}`", f"metrics.`{OBJECTIVE_BEST}`"]

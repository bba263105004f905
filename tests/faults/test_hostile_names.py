"""Names that one tracker would merge, in a real run with jsonl, TensorBoard, MLflow (sqlite) and MindInsight:
metrics ``acc@1`` and ``acc_1`` (MLflow's name cleaning made them one metric with two values a step), params
``{a: {b: 1}, "a.b": 2}`` (flattening kept one of them). Each tracker keeps them apart, with every value, and
each mapping is said once."""
from __future__ import annotations

import glob
import logging

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import msbridge
from msbridge.adapters.mlflow_tracker.run.fields import clean_key
from msbridge.sinks import base
from msbridge.sinks.base import flatten
from msbridge.sinks.runlog import read_run

STEPS = 6


def mindinsight_steps(summary_root, tags) -> list:
    """How many steps each tag has in the MindInsight sink's summary file, read with MindSpore's protobuf class."""
    from mindspore.train.summary_pb2 import Event as SummaryEvent
    from msbridge.adapters._eventwire import read_records

    [path] = glob.glob(str(summary_root / "*_rank_0" / "*_MS"))
    values = [v.tag for body in read_records(path) for v in SummaryEvent.FromString(body).summary.value]
    return [values.count(tag) for tag in tags]


@pytest.mark.slow
def test_metrics_and_params_one_tracker_would_merge_are_kept_apart_and_said_once(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="msbridge")
    monkeypatch.setattr(base, "_SAID_CLASHES", set())  # said once a process: this worker may have said it already
    config = {"experiment": "names", "run_name": "clash", "flush_steps": 2,
              "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
              "sinks": {"jsonl": {}, "tensorboard": {}, "mindinsight": {},
                        "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}},
              "params": {"a": {"b": 1}, "a.b": 2, "opt": {"lr": 0.1}}}
    with msbridge.track(config, progress=False) as run:
        for step in range(1, STEPS + 1):
            run.step(loss=1.0 / step, **{"acc@1": 0.1 * step, "acc_1": 0.5})
    assert run.outcome.status == "FINISHED" and run.outcome.undelivered == {}
    log = read_run(run.run_dir).ranks[0]
    assert log.series("train/acc@1")[-1] == (STEPS, pytest.approx(0.1 * STEPS))
    assert len(log.series("train/acc_1")) == STEPS

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [mlrun] = client.search_runs([client.get_experiment_by_name("names").experiment_id])
    at_step = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, "train/acc_1")}
    assert at_step == {s: 0.5 for s in range(1, STEPS + 1)}, "one value a step: nothing merged into acc_1"
    cleaned = clean_key("train/acc@1")
    assert cleaned.startswith("train/acc_1-") and len(client.get_metric_history(mlrun.info.run_id, cleaned)) == STEPS
    params = mlrun.data.params
    assert {params["a.b"], params["a.b_2"]} == {"1", "2"} and params["opt.lr"] == "0.1", "both values, apart"

    acc = EventAccumulator(str(tmp_path / "names" / "tensorboard" / "clash" / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/acc_1" in tags and "train/acc_1_2" in tags
    assert {len(acc.Scalars(t)) for t in ("train/acc_1", "train/acc_1_2")} == {STEPS}

    assert mindinsight_steps(tmp_path / "names" / "summary", ("train/acc@1", "train/acc_1")) == [STEPS, STEPS]

    said = [r.getMessage() for r in caplog.records]
    assert sum(f"MLflow rejects the name 'train/acc@1'; logged as '{cleaned}'" in m for m in said) == 1
    assert sum("two params flatten to the name 'a.b'" in m and "'a.b_2'" in m for m in said) == 1, said


@pytest.mark.parametrize("names", [("acc@1", "acc_1"), ("loss (train)", "loss _train_"), ("a/../b", "a/__/b"),
                                   ("x" * 300, "x" * 299 + "y"), ("é", "_"), ("a//b", "a/b")])
def test_mlflow_never_cleans_two_names_to_one(names):
    first, second = map(clean_key, names)
    assert first != second and max(len(first), len(second)) <= 250


def test_params_that_flatten_to_one_key_are_kept_apart_in_order():
    assert flatten({"a": {"b": 1}, "a.b": 2, "c": {}}) == {"a.b": 1, "a.b_2": 2, "c": {}}
    assert flatten({"a.b": 2, "a": {"b": 1}}) == {"a.b": 2, "a.b_2": 1}

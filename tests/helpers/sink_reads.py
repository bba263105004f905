"""One metric's ``{step: value}`` read back from each sink's store with that tracker's own reader.

Example:
    >>> series = every_sink(experiment_dir, run_name, "eval/loss")
    >>> sorted(series["tensorboard"])
    [10, 20, 30]
"""
from __future__ import annotations

import glob
from pathlib import Path
from typing import Dict

from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge.sinks.runlog import read_run
from helpers.mlflow_reads import only_run

Series = Dict[int, float]


def jsonl_series(run_dir: Path, name: str) -> Series:
    return dict(read_run(str(run_dir)).ranks[0].series(name))


def tensorboard_series(experiment_dir: Path, run_name: str, name: str) -> Series:
    acc = EventAccumulator(str(experiment_dir / "tensorboard" / run_name / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(name)} if name in acc.Tags()["scalars"] else {}


def mindinsight_series(experiment_dir: Path, name: str) -> Series:
    """From the MindInsight sink's summary file, read with MindSpore's own protobuf class."""
    from mindspore.train.summary_pb2 import Event as SummaryEvent
    from msbridge.adapters._eventwire import read_records
    from msbridge.adapters.mindinsight_sink import mindinsight_tag

    [path] = glob.glob(str(experiment_dir / "summary" / "*_rank_0" / "*_MS"))
    out = {}
    for body in read_records(path):
        event = SummaryEvent.FromString(body)
        out.update((event.step, v.scalar_value) for v in event.summary.value if v.tag == mindinsight_tag(name))
    return out


def mlflow_series(experiment_dir: Path, experiment: str, name: str) -> Series:
    client = MlflowClient(f"sqlite:///{experiment_dir / 'mlflow.db'}")
    run = only_run(client, experiment)
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}


def every_sink(experiment_dir: Path, experiment: str, run_name: str, name: str) -> Dict[str, Series]:
    """``name`` in jsonl, TensorBoard, MindInsight and MLflow (one run of ``experiment`` in the default store)."""
    return {"jsonl": jsonl_series(experiment_dir / run_name, name),
            "tensorboard": tensorboard_series(experiment_dir, run_name, name),
            "mindinsight": mindinsight_series(experiment_dir, name),
            "mlflow": mlflow_series(experiment_dir, experiment, name)}

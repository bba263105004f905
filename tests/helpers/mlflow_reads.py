"""Reading an MLflow run back with ``MlflowClient``, for the MLflow sink's tests.

Example:
    >>> mlrun = only_run(MlflowClient(uri), run.experiment)
    >>> assert_same_series(MlflowClient(uri), mlrun.info.run_id, run.run_dir)
"""
from __future__ import annotations

import math
import uuid
from typing import Any, List, Sequence, Tuple

from mlflow.entities import ViewType
from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_TAG

from msbridge.sinks.runlog import read_run


def nan_safe(series: Sequence[Tuple[int, float]]) -> List[Tuple[int, Any]]:
    """NaN as ``"nan"``, so two series compare equal where both hold NaN."""
    return [(step, "nan" if math.isnan(v) else v) for step, v in series]


def mlflow_series(client: Any, run_id: str, key: str) -> List[Tuple[int, Any]]:
    return nan_safe(sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)))


def steps(client: Any, run_id: str, key: str = "train/loss") -> List[int]:
    return [step for step, _ in mlflow_series(client, run_id, key)]


def assert_same_series(client: Any, run_id: str, run_dir: str) -> None:
    """Every metric of the jsonl log has, in MLflow, exactly the same steps (checked first) and values."""
    log = read_run(run_dir).ranks[0]
    names = log.metric_names()
    assert names and set(client.get_run(run_id).data.metrics) == set(names)
    for name in names:
        got, want = mlflow_series(client, run_id, name), nan_safe(log.series(name))
        assert [s for s, _ in got] == [s for s, _ in want], name
        assert sorted(got, key=str) == sorted(want, key=str), name  # a restated objective: two values at a step


def only_run(client: Any, experiment: str) -> Any:
    """The experiment's one run of a job (a sweep's parent run, which holds no job, is not counted)."""
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id], run_view_type=ViewType.ALL)
    runs = [r for r in runs if PARENT_TAG not in r.data.tags]
    assert len(runs) == 1, f"expected exactly one MLflow run, found {len(runs)}"
    return runs[0]


def artifact_text(client: Any, run_id: str, path: str, tmp_path: Any) -> str:
    with open(client.download_artifacts(run_id, path, str(tmp_path / uuid.uuid4().hex)), encoding="utf-8") as fh:
        return fh.read()

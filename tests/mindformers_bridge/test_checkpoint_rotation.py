"""mindformers' CheckpointMonitor keeping 2 files, from a run YAML's ``callbacks:`` (the shape of
tests/mindformers_bridge/test_do_eval.py), trained for real with examples/mindformers/train.py: train begin says in
one line that its rotation deletes logged checkpoints, naming the YAML key; the LoggedModels of the files it deleted
are marked. (``log_checkpoints: best`` on a real training: tests/adapters/test_mlflow_models.py; one more mindformers
run here would add about 160 s on this 2-CPU VM.)"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("mindformers")
pytest.importorskip("mlflow")
from helpers.mf_runs import only_run, train, variant  # noqa: E402

from msbridge.sinks.runlog import read_run  # noqa: E402

pytestmark = pytest.mark.slow

RUN_YAML = """callbacks:
  - type: MFLossMonitor
  - type: CheckpointMonitor
    prefix: tiny
    save_checkpoint_steps: 2
    keep_checkpoint_max: 2
    integrated_save: False
  - type: MSBridgeMonitor
    experiment: tiny-llama
    output_dir: ./msbridge_runs/{experiment}/{run_name}
    sinks: [jsonl, mlflow]
    flush_steps: 2
"""


def test_a_run_yamls_checkpointmonitor_rotation_is_said_and_marked(tmp_path):
    from mlflow.tracking import MlflowClient

    work = tmp_path / "work"
    out = train(work, steps=8, config=variant(tmp_path, "ckpt.yaml", RUN_YAML))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr.count("msbridge: CheckpointMonitor keeps only its last 2 files (keep_checkpoint_max: 2 in the "
                            "CheckpointMonitor entry of callbacks)") == 1
    log = read_run(only_run(work)).ranks[0]
    saved = {e.step: e.detail["path"] for e in log.events if e.kind == "checkpoint"}
    assert sorted(saved) == [2, 4, 6, 8]
    assert [os.path.exists(saved[s]) for s in (2, 4, 6, 8)] == [False, False, True, True]  # the saver kept 2
    client = MlflowClient(f"sqlite:///{work / 'msbridge_runs' / 'tiny-llama' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny-llama").experiment_id
    models = {int(m.tags["msbridge.step"]): m for m in client.search_logged_models([experiment])}
    assert sorted(models) == [2, 4, 6, 8]
    assert [(models[s].tags["msbridge.checkpoint.file"], str(models[s].status)) for s in (2, 4, 6, 8)] == [
        ("deleted", "FAILED"), ("deleted", "FAILED"), ("present", "READY"), ("present", "READY")]
    assert all(models[s].tags["msbridge.checkpoint.path"] == saved[s] for s in saved)

"""The train-begin line when a saver's rotation can delete checkpoints MLflow logs as LoggedModels: MindSpore's
``ModelCheckpoint`` built as its tutorials build it, and mindformers' ``CheckpointMonitor`` built from a run YAML's
``callbacks:`` entry by mindformers' own ``build_callback``. (A real training with the line: test_mlflow_models.py.)"""
from __future__ import annotations

import pytest
from mindspore.train import CheckpointConfig, ModelCheckpoint

from msbridge.capture.checkpoints import kept_path, rotation_line


def _saver(**config):
    return ModelCheckpoint("net", config=CheckpointConfig(save_checkpoint_steps=5, **config))


def test_the_line_names_the_savers_setting_and_the_option_that_keeps_the_best():
    line = rotation_line([_saver(keep_checkpoint_max=2)], {"jsonl": {}, "mlflow": {}})
    assert line.startswith("msbridge: ModelCheckpoint keeps only its last 2 files "
                           "(CheckpointConfig(keep_checkpoint_max=2))")
    assert line.endswith("sinks: {mlflow: {log_checkpoints: best}}")
    assert "keep_checkpoint_per_n_minutes=3)" in rotation_line([_saver(keep_checkpoint_max=0,
                                                                       keep_checkpoint_per_n_minutes=3)],
                                                               {"mlflow": {"log_checkpoints": "link"}})


def test_no_line_when_the_training_saves_no_more_files_than_the_saver_keeps():
    """Every 5 steps, 2 kept: 10 steps save 2 files, 11 save 3 (the last step's at the end), so one is deleted; with
    the steps not known (None) the line is said."""
    saver = _saver(keep_checkpoint_max=2)
    assert rotation_line([saver], {"mlflow": {}}, steps=10) is None
    assert rotation_line([saver], {"mlflow": {}}, steps=11).startswith("msbridge: ModelCheckpoint keeps only its")
    assert rotation_line([saver], {"mlflow": {}}, steps=None) is not None


@pytest.mark.parametrize("mode", ["best", "upload", "off", None])
def test_no_line_without_logged_models_to_lose_or_with_each_file_held(mode):
    """``best`` and ``upload`` hold each file (a hard link) until it is judged or uploaded; ``off`` logs none; and
    without the mlflow sink (None) no LoggedModel is made."""
    sinks = {"jsonl": {}} if mode is None else {"mlflow": {"log_checkpoints": mode}}
    assert rotation_line([_saver(keep_checkpoint_max=2)], sinks) is None


@pytest.mark.slow
def test_mindformers_checkpointmonitor_of_a_run_yaml_is_named_with_its_yaml_key(tmp_path):
    pytest.importorskip("mindformers")
    import yaml
    from mindformers.core.callback.build_callback import build_callback

    entry = yaml.safe_load("""
    - type: CheckpointMonitor
      prefix: tiny
      save_checkpoint_steps: 5
      keep_checkpoint_max: 2
      integrated_save: False
    """)[0]  # as in a mindformers run YAML's callbacks: (tests/mindformers_bridge/test_do_eval.py trains it)
    saver = build_callback({**entry, "directory": str(tmp_path)})
    line = rotation_line([saver], {"mlflow": {}})
    assert line.startswith("msbridge: CheckpointMonitor keeps only its last 2 files (keep_checkpoint_max: 2 in "
                           "the CheckpointMonitor entry of callbacks)")


def test_the_kept_path_stays_in_the_run_dirs_checkpoints_folder():
    assert kept_path("/runs/a", 50, "/ckpt/net-1_50.ckpt") == "/runs/a/checkpoints/step50-net-1_50.ckpt"
    assert kept_path("/runs/a", 7, "/ckpt/..") == "/runs/a/checkpoints/step7-checkpoint"
    assert kept_path("/runs/a", 7, "/ckpt/../x y;rm -rf.ckpt") == "/runs/a/checkpoints/step7-x_y_rm_-rf.ckpt"

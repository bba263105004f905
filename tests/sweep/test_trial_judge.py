"""How `msbridge sweep` judges an ended trial from its run's own outcome (run.json), for a run that never
evaluates: FAIL, with the sweep-file line that ranks such runs on their training loss instead."""
from __future__ import annotations

import textwrap

import pytest

import msbridge
from msbridge.sweep.runner import judge
from msbridge.sweep.spec import load_spec

pytest.importorskip("optuna", reason="the sweep extra: pip install 'msbridge[sweep]'")
pytestmark = pytest.mark.slow  # a MindSpore training each


def _spec(tmp_path, objective: str):
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(f"""\
        study: judge
        command: "python train.py"
        params:
          optimizer.learning_rate: {{low: 1.0e-4, high: 1.0, log: true}}
        {objective}
        """), encoding="utf-8")
    return load_spec(str(path))


def _run_without_evaluation(tmp_path, metric: str) -> str:
    """A real monitored run (msbridge.track) of 8 training steps and no evaluation, ranked on ``metric``."""
    config = {"experiment": "judge", "output_dir": str(tmp_path / "runs"), "sinks": ["jsonl"],
              "objective": {"metric": metric, "mode": "min"}}
    with msbridge.track(config, progress=False) as run:
        for i in range(8):
            run.step(loss=2.0 - i / 10)
    return run.run_dir


def test_a_run_that_never_evaluates_fails_with_the_line_that_ranks_it_on_its_training_loss(tmp_path):
    spec = _spec(tmp_path, "")
    state, value, reason = judge(spec, 0, _run_without_evaluation(tmp_path, spec.metric), str(tmp_path / "log"))
    assert (state, value) == ("FAIL", None)
    assert "no finite eval/loss" in reason
    assert f"objective: {{metric: train/loss}} in {spec.path}" in reason


def test_the_same_run_ranked_on_its_training_loss_completes_with_its_best_step(tmp_path):
    spec = _spec(tmp_path, "objective: {metric: train/loss}")
    state, value, reason = judge(spec, 0, _run_without_evaluation(tmp_path, spec.metric), str(tmp_path / "log"))
    assert (state, reason) == ("COMPLETE", "")
    assert value == pytest.approx(2.0 - 7 / 10)

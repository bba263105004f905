"""MSBridgeMonitor under mindformers' pynative Trainer (``mindformers.pynative``, 1.9 on) on CPU.

``examples/mindformers/pynative_train.py`` runs in a fresh process (mindformers fixes its log dir
per process) with ``- type: MSBridgeMonitor`` in the run YAML. The reference for every value is
the Trainer's own LossCallback line of the same step.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mindformers.pynative.trainer")

from msbridge.sinks.runlog import read_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.compat]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mindformers"
STEPS = 8
# LossCallback: "{ step:[    1/   12], loss:   4.413997, per_step_time:  12044ms, lr: 3.333333e-03,
#                  grad_norm:   3.970161, throughput:   0.00T }"
LOSS_LINE = re.compile(r"step:\[\s*(\d+)/\s*\d+\], loss:\s*([-\d.e+naN]+), per_step_time:\s*\d+ms, "
                       r"lr:\s*([-\d.e+]+), grad_norm:\s*([-\d.e+naN]+)")


def run_yaml(tmp_path: Path, more: str = "") -> Path:
    """The example's run YAML with STEPS steps and ``more`` lines at its end (in the MSBridgeMonitor entry
    when indented)."""
    text = (EXAMPLE / "tiny_pynative.yaml").read_text().replace("  steps: 12\n", f"  steps: {STEPS}\n")
    path = tmp_path / "run.yaml"
    path.write_text(text + more)
    return path


def train(work: Path, config: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LOG_MF_PATH"}  # mindformers logs under WORK/output/log
    return subprocess.run([sys.executable, str(EXAMPLE / "pynative_train.py"), "--config", str(config),
                           "--work", str(work)], env=dict(env, GLOG_v="3"), capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pynative")
    work = tmp / "work"
    out = train(work, run_yaml(tmp, "monitor:\n  train_state:\n    local_loss: True\n"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = (work / "output" / "log" / "rank_0" / "info.log").read_text()
    printed = {int(m[1]): (float(m[2]), float(m[3]), float(m[4])) for m in LOSS_LINE.finditer(text)}
    [run_dir] = [p for p in (work / "msbridge_runs" / "tiny-pynative").iterdir() if (p / "run.json").exists()]
    return work, run_dir, printed


def test_every_step_matches_the_trainers_own_log(trained):
    _, run_dir, printed = trained
    assert sorted(printed) == list(range(1, STEPS + 1))
    log = read_run(str(run_dir)).ranks[0]
    for name, column in (("train/loss", 0), ("train/grad_norm", 2)):
        series = log.series(name)
        assert [s for s, _ in series] == list(range(1, STEPS + 1)), name
        # LossCallback prints 6 decimals; msbridge keeps the float32 value
        np.testing.assert_allclose([v for _, v in series], [printed[s][column] for s, _ in series],
                                   rtol=2e-6, atol=5e-7, err_msg=name)
    # LossCallback prints lr_scheduler(global_step), the lr of the next update: the optimizer evaluates the
    # schedule at its own step count, then counts. msbridge records the lr each step's update used.
    lr = dict(log.series("train/lr"))
    assert sorted(lr) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([lr[s] for s in range(2, STEPS + 1)], [printed[s - 1][1] for s in range(2, STEPS + 1)],
                               rtol=1e-6, atol=1e-12)
    assert lr[1] == 0.0  # the warm-up starts at 0
    assert all(v == 0.0 for _, v in log.series("train/overflow"))


def test_the_run_yaml_is_read_and_the_run_closes_finished(trained):
    _, run_dir, _ = trained
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["outcome"]["status"] == "FINISHED" and meta["expected_steps"] == STEPS
    config = meta["config"]
    assert config["flush_steps"] == 5 and sorted(config["sinks"]) == ["jsonl", "tensorboard"]
    assert config["params"]["training"]["steps"] == STEPS  # the Trainer's run YAML, found through its config=
    assert config["params"]["lr_scheduler"]["type"] == "CosineWithWarmUpLR"
    # its monitor: section is mindformers' (nothing in 1.9 reads it) and is logged like the other sections
    assert config["params"]["monitor"] == {"train_state": {"local_loss": True}}


def test_tensorboard_holds_the_jsonl_series(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work, run_dir, _ = trained
    log = read_run(str(run_dir)).ranks[0]
    ea = EventAccumulator(str(work / "msbridge_runs" / "tiny-pynative" / "tensorboard" / run_dir.name / "rank_0"),
                          size_guidance={"scalars": 0})
    ea.Reload()
    for name in ("train/loss", "train/grad_norm", "train/lr"):
        want = log.series(name)
        got = [(e.step, e.value) for e in ea.Scalars(name)]
        assert [s for s, _ in got] == [s for s, _ in want], name
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6, err_msg=name)


def test_a_bad_entry_key_fails_before_training_naming_file_and_line(tmp_path):
    config = run_yaml(tmp_path, "    flush_step: 10\n")
    out = train(tmp_path / "work", config)
    assert out.returncode != 0
    line = config.read_text().splitlines().index("    flush_step: 10") + 1
    assert f"run.yaml:{line}: callbacks[0].flush_step: unknown key; did you mean 'flush_steps'?" in out.stderr
    assert "loss_callback" not in out.stdout + out.stderr, "no step ran"


def test_an_overflow_step_is_recorded_and_a_stop_ends_the_trainers_loop(tmp_path):
    """A huge lr blows the weights up after the first update: the next step's gradients are not finite,
    the Trainer skips its update and hands ``grad_norm=None``; health's nonfinite check stops the run."""
    config = run_yaml(tmp_path, "    health: {nonfinite: {action: stop}}\n")
    config.write_text(config.read_text().replace("learning_rate: 0.01", "learning_rate: 1.0e+30")
                      .replace("warmup_steps: 3", "warmup_steps: 1"))
    work = tmp_path / "work"
    out = train(work, config)
    assert out.returncode != 0 and "TrainingStopped: msbridge: nonfinite at step" in out.stderr
    [run_dir] = [p for p in (work / "msbridge_runs" / "tiny-pynative").iterdir() if (p / "run.json").exists()]
    log = read_run(str(run_dir)).ranks[0]
    overflow = dict(log.series("train/overflow"))
    stop = max(overflow)
    assert sorted(overflow) == list(range(1, stop + 1)) and overflow[stop] == 1.0
    grad_norm = dict(log.series("train/grad_norm"))
    assert all(np.isfinite(grad_norm[s]) for s in range(1, stop)) and np.isnan(grad_norm[stop])
    assert json.loads((run_dir / "run.json").read_text())["outcome"]["status"] == "FAILED"

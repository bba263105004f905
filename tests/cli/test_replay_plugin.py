"""``msbridge replay --to`` takes every registered sink, a plug-in's included, and ``--help`` lists them: a real
run (an ``msbridge.track`` loop on MindSpore CPU), then the ``msbridge`` command with a plug-in distribution
(a dist-info on ``PYTHONPATH``) replaying it, twice (its ``held()`` keeps the second from adding anything)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

import msbridge

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')
MSBRIDGE = str(Path(sys.executable).parent / "msbridge")
PLUGIN = '''
import json
import os

from msbridge.sinks.base import Held, Sink


class Lines(Sink):
    """Every record as a JSON line of lines.jsonl in the run dir; held() reads the file."""

    def _path(self):
        return os.path.join(self.run.run_dir, "lines.jsonl")

    def open(self, run):
        super().open(run)
        self._file = open(self._path(), "a", encoding="utf-8")

    def held(self):
        steps = [self.run.resumed_from_step]
        if os.path.exists(self._path()):
            with open(self._path(), encoding="utf-8") as fh:
                steps += [json.loads(line)["step"] for line in fh]
        return Held(max(steps))

    def write(self, records, events):
        for rec in records:
            self._file.write(json.dumps({"step": rec.step, "loss": rec.values.get("train/loss")}) + "\\n")

    def close(self, status="FINISHED"):
        self._file.close()
'''


def plugin_env(root: Path) -> dict:
    root.mkdir(parents=True)
    (root / "lines_sink.py").write_text(textwrap.dedent(PLUGIN))
    info = root / "lines_sink-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lines-sink\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[msbridge.sinks]\nlines = lines_sink:Lines\n")
    return dict(os.environ, PYTHONPATH=str(root), GLOG_v="3")


def a_run(tmp_path: Path, steps: int = 12) -> str:
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = ms.nn.Dense(4, 1)
    opt = ms.nn.SGD(net.trainable_params(), learning_rate=0.01)
    grad = ms.value_and_grad(lambda x, y: ms.ops.mse_loss(net(x), y), None, opt.parameters)
    x, y = ms.Tensor(np.ones((8, 4), np.float32)), ms.Tensor(np.zeros((8, 1), np.float32))
    config = {"experiment": "replay", "run_name": "plugin", "flush_steps": 4, "sinks": ["jsonl"],
              "output_dir": str(tmp_path / "runs" / "{experiment}" / "{run_name}")}
    with msbridge.track(config, progress=False) as run:
        for _ in range(steps):
            loss, grads = grad(x, y)
            opt(grads)
            run.step(loss=loss)
    return run.run_dir


def test_replay_to_a_plug_in_sink_and_help_lists_it(tmp_path):
    run_dir = a_run(tmp_path)
    env = plugin_env(tmp_path / "site")
    shown = subprocess.run([MSBRIDGE, "replay", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert shown.returncode == 0 and "lines" in shown.stdout and "tensorboard" in shown.stdout, shown.stdout
    for _ in range(2):
        done = subprocess.run([MSBRIDGE, "replay", run_dir, "--to", "lines"], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "replayed 12 records" in done.stdout
    lines = [json.loads(line) for line in (Path(run_dir) / "lines.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 13))  # once each: the second replay added nothing
    refused = subprocess.run([MSBRIDGE, "replay", run_dir, "--to", "nosuch"], capture_output=True, text=True,
                             env=env, timeout=120)
    assert refused.returncode == 2 and "invalid choice: 'nosuch'" in refused.stderr

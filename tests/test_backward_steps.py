"""Steps that go backwards on the callback path: a real ``Model.train`` whose step number, as the monitor sees it,
goes 10, 11, 5, 6, 6, 12 (a callback before it rewrites ``cur_step_num``, as a resume fix-up in a user's script
might, and one after it puts MindSpore's own back). A step at or below the last recorded one is refused, said
once, and counted; run.json, the README, the console and ``msbridge replay`` agree with the jsonl line for line.
Real MindSpore on CPU; every sink read back with its tracker's own reader."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from mindspore.train import Callback
import pytest

from helpers.sink_reads import every_sink
from helpers.training import train_regression
from msbridge import BridgeMonitor
from msbridge.cli.main import main
from msbridge.names import LOSS

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

SEEN_AS = (10, 11, 5, 6, 6, 12)
RECORDED = [10, 11, 12]


class Rewrite(Callback):
    """Shows the callbacks after it step ``SEEN_AS[i]`` at MindSpore's i-th step end; ``Restore`` undoes it."""

    def __init__(self):
        self.real = []

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        self.real.append(cb.cur_step_num)
        cb.cur_step_num = SEEN_AS[len(self.real) - 1]


class Restore(Callback):
    def __init__(self, rewrite):
        self.rewrite = rewrite

    def on_train_step_end(self, run_context):
        run_context.original_args().cur_step_num = self.rewrite.real[-1]


def test_backward_steps_in_model_train_are_refused_once_and_counted_everywhere(tmp_path, caplog, capsys):
    config = {"experiment": "back", "run_name": "r", "experiment_dir": str(tmp_path / "back"), "flush_steps": 2,
              "print_interval": 1, "sinks": ["jsonl", "tensorboard", "mindinsight", "mlflow"]}
    monitor = BridgeMonitor(config)
    rewrite = Rewrite()
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        train_regression([rewrite, monitor, Restore(rewrite)], steps=len(SEEN_AS))
    assert rewrite.real == [1, 2, 3, 4, 5, 6]  # MindSpore's own steps were untouched
    console = capsys.readouterr().out
    lines = [json.loads(x) for x in (Path(monitor.run_dir) / "metrics" / "rank_0.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in lines if LOSS in line.get("values", {})]
    assert steps == RECORDED  # coverage first: every step after the last recorded one, none twice
    for sink, series in every_sink(tmp_path / "back", "back", "r", LOSS).items():
        assert sorted(series) == RECORDED, sink
    said = [r.getMessage() for r in caplog.records if "is not after step" in r.getMessage()]
    assert len(said) == 1 and "step 5 is not after step 11" in said[0], said
    outcome = json.loads((Path(monitor.run_dir) / "run.json").read_text())["outcome"]
    assert outcome["steps recorded"] == len(RECORDED) and outcome["steps refused"] == 3, outcome
    assert "steps refused" in (Path(monitor.run_dir) / "README.md").read_text()
    shown = [int(m) for m in re.findall(r"\[msbridge\] step (\d+)", console)]
    assert shown == RECORDED, console[-1500:]  # a progress line per recorded step, none for a refused one
    fresh = f"sqlite:///{tmp_path / 'replayed.db'}"  # a store that holds nothing yet: every record is replayed
    assert main(["replay", monitor.run_dir, "--to", "mlflow", "--tracking-uri", fresh]) == 0
    assert f"replayed {len(RECORDED)} records" in capsys.readouterr().out

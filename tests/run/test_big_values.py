"""A 1 MB parameter value (a pasted prompt, a vocabulary) does not hold up the run: real MindSpore training
starts as soon after it as after an empty config, and the value is masked and kept."""
from __future__ import annotations

import json
import time

from helpers.training import train_regression
from mindspore.train import Callback

from msbridge import BridgeMonitor

#: A realistic 1 MB value: text with URLs and query strings in it, so masking has work to do.
BIG = ("see https://user:hunter2@host/x?token=abc&n=1 and plain words " * 17_000)[:1_000_000]


class FirstStep(Callback):
    """Records the process's CPU time when the first training step begins."""

    def __init__(self) -> None:
        super().__init__()
        self.at = None

    def on_train_step_begin(self, run_context) -> None:
        if self.at is None:
            self.at = time.process_time()


def _seconds_to_first_step(tmp_path, name, params):
    """CPU seconds from building the monitor to the first step: what the value costs, however busy the machine."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(json.dumps({"output_dir": str(tmp_path / name), "sinks": ["jsonl", "tensorboard"],
                                  "params": params}))  # JSON is YAML
    start = time.process_time()
    first = FirstStep()
    monitor = BridgeMonitor(str(config), progress=False)
    train_regression([monitor, first], steps=3, mode="pynative")
    return first.at - start, monitor.run_dir


def test_a_1_mb_parameter_value_starts_the_run_within_2_s_of_an_empty_config(tmp_path):
    empty = [_seconds_to_first_step(tmp_path, f"empty{i}", {})[0] for i in range(2)]
    big, run_dir = _seconds_to_first_step(tmp_path, "big", {"prompt": BIG})
    assert big < min(empty) + 2.0, (big, empty)
    saved = json.load(open(f"{run_dir}/run.json"))["config"]["params"]["prompt"]
    assert len(saved) > 900_000 and "hunter2" not in saved and "token=***" in saved

"""A 1 MB parameter value (a pasted prompt, a vocabulary) does not hold up the run: real MindSpore training
starts as soon after it as after an empty config, and the value is masked and kept."""
from __future__ import annotations

import json
import os
import time

from helpers.training import train_regression
from mindspore.train import Callback
import pytest

from msbridge import BridgeMonitor

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

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



def test_100k_params_close_every_sink_within_its_bound_mlflow_takes_all_the_file_trackers_1000(tmp_path, caplog):
    """Encoding 100,000 params for TensorBoard's HParams or MindInsight's lineage took 26 s and 23 s, past the
    sinks' close bounds; each takes the first 1,000 and says so, and run.json keeps every one. MLflow stores every
    one (1,000 calls of 100: 6 s into sqlite here, 48 s before its writer kept what the run holds), and so does the
    run's replay into a new store (timed: docs/sinks.md has the figure)."""
    import glob

    from helpers.mlflow_reads import only_run
    from mindspore.train.lineage_pb2 import LineageEvent
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata as hp_metadata

    import msbridge
    from msbridge.adapters._eventwire import read_records
    from msbridge.cli.main import main
    from msbridge.adapters._tracker_facts import TRACKER_PARAMS

    params = {f"group{g}": {f"p{i}": i * 0.5 for i in range(g * 1000, (g + 1) * 1000)} for g in range(100)}
    cfg = {"experiment": "big", "run_name": "p", "experiment_dir": str(tmp_path / "big"), "flush_steps": 10,
           "sinks": ["jsonl", "mlflow", "tensorboard", "mindinsight"], "params": params}
    with msbridge.track(cfg) as run:
        for step in range(1, 21):
            run.step(loss=1.0 / step)
    meta = json.loads((tmp_path / "big" / "p" / "run.json").read_text())
    assert meta["outcome"]["status"] == "FINISHED" and meta["outcome"]["not delivered"] == "none", meta["outcome"]
    assert sum(len(group) for group in meta["config"]["params"].values()) == 100_000
    said = [r.getMessage() for r in caplog.records if "100000 params" in r.getMessage()]
    assert len(said) == 2 and all(f"the first {TRACKER_PARAMS}" in m for m in said), said

    client = MlflowClient(f"sqlite:///{tmp_path / 'big' / 'mlflow.db'}")
    stored = only_run(client, "big").data.params
    assert sum(key.startswith("group") for key in stored) == 100_000 and stored["group99.p99999"] == "49999.5"
    fresh = f"sqlite:///{tmp_path / 'replayed.db'}"  # the replay of the run into a new store: every param read back
    start = time.monotonic()
    assert main(["replay", run.run_dir, "--to", "mlflow", "--tracking-uri", fresh]) == 0
    took = time.monotonic() - start
    print(f"replay of 100,036 params into a new sqlite store: {took:.1f} s (load {os.getloadavg()[0]:.1f})")
    replayed = MlflowClient(fresh)
    assert only_run(replayed, "big").data.params == stored
    assert took < 120, f"the replay took {took:.0f} s (issue 39: <= 60 s here); a hang guard, the figure is in docs"

    tb = EventAccumulator(str(tmp_path / "big" / "tensorboard" / "p"))
    tb.Reload()
    start = hp_metadata.parse_session_start_info_plugin_data(
        tb.PluginTagToContent("hparams")[hp_metadata.SESSION_START_INFO_TAG])
    taken = [k for k in start.hparams if k.startswith("group")]
    assert sorted(taken) == sorted(f"group{i // 1000}.p{i}" for i in range(TRACKER_PARAMS))  # the config's order

    [lineage] = glob.glob(str(tmp_path / "big" / "summary" / "p_rank_0" / "*_lineage"))
    keys = {entry.key if hasattr(entry, "key") else entry
            for body in read_records(lineage) for item in LineageEvent.FromString(body).user_defined_info.user_info
            for field in (item.map_str, item.map_int32, item.map_double) for entry in field}
    assert len([k for k in keys if k.startswith("group")]) == TRACKER_PARAMS

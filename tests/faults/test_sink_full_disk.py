"""A tracker's own full disk (a real tmpfs, root only): the sink is undelivered (exit 3, run.json, the replay
command), the failure is said once, and the printed replay command, run as printed once space is back, leaves
every step in the tracker exactly once (read with the tracker's own reader).

jsonl and the run dir are off the full disk; only the tracker's directory is on it.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys

import pytest
from helpers.disk import fill, small_tmpfs
from helpers.mindinsight_server import serve
from helpers.training import train_regression
from mindspore.train import Callback
from msbridge.adapters.mindinsight_sink import MindInsightSink
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge import BridgeMonitor
from msbridge.sinks.base import FINISHED
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS = 1000
FULL_AT = 116  # the step after which the tracker's disk is full


class FillAt(Callback):
    """Fills the disk of ``folder`` to the last byte after step ``step``."""

    def __init__(self, folder, step):
        super().__init__()
        self.folder, self.step, self.path = folder, step, None

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            self.path = fill(self.folder)


def train_with_a_full_tracker_disk(tmp_path, disk, sink, option):
    monitor = BridgeMonitor({"experiment": "full", "run_name": "r", "flush_steps": 50,
                             "output_dir": str(tmp_path / "runs" / "{run_name}"),
                             "sinks": {"jsonl": {}, sink: {option: str(disk)}}}, progress=False)
    filler = FillAt(disk, FULL_AT)
    train_regression([monitor, filler], steps=STEPS)
    return monitor, filler


def printed_replay(monitor, sink):
    """The replay command run.json's outcome prints for ``sink``, exactly as printed."""
    with open(os.path.join(monitor.run_dir, "run.json"), encoding="utf-8") as fh:
        missed = json.load(fh)["outcome"]["not delivered"]
    assert list(missed) == [sink], missed
    return missed[sink].split("fill it: ", 1)[1]


def run_as_printed(command):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def assert_said_once(caplog, capfd, sink, where):
    said = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"msbridge: {sink}: cannot write {where} (") and f"--to {sink}" in said[0], said[0]
    err = capfd.readouterr().err
    # MindSpore's writer prints its own error lines for the one write of each file that failed, not per write
    assert err.count("No space left on device") <= 6, err.count("No space left on device")
    assert "Traceback" not in err


def tensorboard_steps(folder):
    """Each scalar tag's steps in ``folder``, read with TensorBoard's EventAccumulator."""
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"] if not tag.startswith("hparams/")}


def test_tensorboard_full_disk_is_undelivered_and_the_printed_replay_fills_every_hole(tmp_path, caplog, capfd):
    caplog.set_level(logging.WARNING, logger="msbridge")
    with small_tmpfs(tmp_path / "tb", size="1m") as disk:
        monitor, filler = train_with_a_full_tracker_disk(tmp_path, disk, "tensorboard", "logdir")
        assert monitor.outcome.status == FINISHED and monitor.outcome.exit_code == 3
        assert list(monitor.outcome.undelivered) == ["tensorboard"], monitor.outcome.undelivered
        assert f"not written to {disk / 'r'}" in monitor.outcome.undelivered["tensorboard"]
        assert_said_once(caplog, capfd, "tensorboard", disk / "r")
        assert len(read_run(monitor.run_dir).ranks[0].records) == STEPS  # jsonl, off the full disk, holds all
        before = tensorboard_steps(disk / "r" / "rank_0")
        assert before and max(len(s) for s in before.values()) < STEPS  # the tracker really lacks steps

        os.remove(filler.path)
        command = printed_replay(monitor, "tensorboard")
        log = read_run(monitor.run_dir).ranks[0]
        assert [s for s, _ in log.series("train/loss")] == list(range(1, STEPS + 1))
        for _ in range(2):  # twice: the second finds nothing missing and adds nothing
            run_as_printed(command)
            for folder in (disk / "r" / "rank_0", disk / "r"):
                held = tensorboard_steps(folder)
                assert held, folder
                for tag, steps in held.items():  # each step the jsonl has for it, once (a per-window metric: sparse)
                    assert sorted(steps) == [s for s, _ in log.series(tag)], (folder, tag, len(steps))
        with open(os.path.join(monitor.run_dir, "run.json"), encoding="utf-8") as fh:
            assert json.load(fh)["outcome"]["not delivered"] == "none"


def test_mindinsight_full_disk_is_undelivered_and_the_printed_replay_completes_it(tmp_path, caplog, capfd):
    caplog.set_level(logging.WARNING, logger="msbridge")
    with small_tmpfs(tmp_path / "summary", size="1m") as disk:
        monitor, filler = train_with_a_full_tracker_disk(tmp_path, disk, "mindinsight", "summary_base_dir")
        assert monitor.outcome.exit_code == 3 and list(monitor.outcome.undelivered) == ["mindinsight"]
        assert_said_once(caplog, capfd, "mindinsight", disk / "r_rank_0")

        os.remove(filler.path)
        command = printed_replay(monitor, "mindinsight")
        sink = MindInsightSink(summary_base_dir=str(disk))
        run = read_run(monitor.run_dir)
        log = run.ranks[0]
        assert [s for s, _ in log.series("train/loss")] == list(range(1, STEPS + 1))
        files = []
        for _ in range(2):
            run_as_printed(command)
            files.append(sorted(glob.glob(os.path.join(disk, "r_rank_0", "*_MS"))))
            info = _run_info(monitor, run)
            for name, series in sink.read_back(info).items():
                if not name.startswith("events/"):
                    assert sorted(s for s, _ in series) == [s for s, _ in log.series(name)], (name, len(series))
        assert files[0] == files[1], "the second replay added no file"
        with serve(str(disk), str(tmp_path / "workspace")) as mindinsight:  # MindInsight's own read, over REST
            points = mindinsight.wait_for_points("./r_rank_0", "1_train/loss/scalar", STEPS)
            assert sorted(p["step"] for p in points) == list(range(1, STEPS + 1))


def _run_info(monitor, run):
    from msbridge.sinks.base import RunInfo

    return RunInfo(run_id=run.header["run_id"], run_name="r", experiment="full", rank=0, world_size=1,
                   is_global=True, run_dir=monitor.run_dir)


@pytest.fixture(autouse=True)
def _tell_afresh(monkeypatch):
    from msbridge.run import metadata

    monkeypatch.setattr(metadata, "_told", set())

"""The run dir removed under a real run (what a /tmp cleaner or an ``rm -r`` does): named at once, every step kept
where it can be (written again at its path, else at a rescue path), and the outcome never claims what the disk
does not hold: a log that is not at its path is the jsonl's ``undelivered`` (exit code 3), naming where it is or
that it is lost. ``msbridge.track`` loops and ``Model.train`` with jsonl; one with every sink."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time

import pytest
from helpers.training import train_regression
from mindspore.train import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import msbridge
from msbridge import BridgeMonitor
from msbridge.cli.main import main
from msbridge.run.outcome import EXIT_UNDELIVERED
from msbridge.sinks.runlog import rank_file, read_rank_file, read_run

STEPS, AT = 120, 50


@pytest.fixture
def rescue_root(tmp_path, monkeypatch):
    """Where a rescue copy goes: the test's own tmp dir (tempfile's root, as msbridge asks it)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def config(tmp_path, sinks=("jsonl",)):
    return {"experiment": "e", "run_name": "r", "output_dir": str(tmp_path / "out" / "{experiment}" / "{run_name}"),
            "flush_steps": 10, "overhead_budget": 0.9, "sinks": list(sinks)}


def remove_run_dir(run_dir: str, how: str) -> None:
    """``rm -r`` of the run dir, or of its metrics folder (moved away first: the sinks' threads write meanwhile);
    with ``blocked`` / ``lost``, a file takes the run dir's place, so it cannot be made again."""
    if how == "readonly":  # remounted read-only (the open files stay writable, as after a chmod)
        done = subprocess.run(["mount", "--bind", "-o", "ro", run_dir, run_dir], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return
    if how == "everything":  # the output root, trackers' files and all
        root = os.path.dirname(os.path.dirname(run_dir))
        os.rename(root, root + ".gone")
        shutil.rmtree(root + ".gone")
        return
    target = os.path.join(run_dir, "metrics") if how == "metrics" else run_dir
    os.rename(target, target + ".gone")
    shutil.rmtree(target + ".gone")
    if how in ("blocked", "lost"):
        blocker = run_dir + ".blocker"
        with open(blocker, "w", encoding="utf-8") as fh:
            fh.write("not a directory\n")
        for attempt in range(100):  # the jsonl's thread may make the dir again first: move it away, and again
            try:
                os.rename(blocker, run_dir)
                return
            except OSError:
                os.rename(run_dir, f"{run_dir}.again{attempt}")
        raise AssertionError("the run dir kept coming back")


def tracked(tmp_path, how: str, sinks=("jsonl",)):
    with msbridge.track(config(tmp_path, sinks), progress=False) as run:
        for step in range(1, STEPS + 1):
            run.step(loss=1.0 / step)
            if step == AT:
                written(tmp_path, run.run_dir, sinks)
                remove_run_dir(run.run_dir, how)
    return run


def written(tmp_path, run_dir: str, sinks) -> None:
    """Wait (bounded) until each sink's thread wrote a first window, so the removal takes steps with it."""
    folders = {"tensorboard": tmp_path / "out" / "e" / "tensorboard", "mindinsight": tmp_path / "out" / "e" / "summary"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = [f for sink in sinks if sink in folders for _, _, names in os.walk(folders[sink]) for f in names]
        if len(steps_in(rank_file(run_dir, 0))) >= 10 and len(files) >= len(set(sinks) & set(folders)):
            return
        time.sleep(0.05)
    raise AssertionError("the sinks wrote nothing in 60 s")


def steps_in(path: str) -> list:
    return [r.step for r in read_rank_file(path).records]


@pytest.mark.parametrize("how", ["run-dir", "metrics"])
def test_a_removed_run_dir_is_named_and_written_again_with_every_step(tmp_path, rescue_root, caplog, how):
    caplog.set_level(logging.ERROR, logger="msbridge")
    run = tracked(tmp_path, how)
    assert steps_in(rank_file(run.run_dir, 0)) == list(range(1, STEPS + 1)), "every step, at its own path"
    assert run.outcome.status == "FINISHED" and run.outcome.undelivered == {} and run.outcome.exit_code == 0
    said = [r.getMessage() for r in caplog.records if "was removed during the run" in r.getMessage()]
    assert len(said) == 1 and rank_file(run.run_dir, 0) in said[0], "named once"
    with open(os.path.join(run.run_dir, "run.json"), encoding="utf-8") as fh:
        assert json.load(fh)["outcome"]["status"] == "FINISHED"
    assert not os.listdir(rescue_root), "no rescue copy was needed"


def test_a_run_dir_that_cannot_be_made_again_goes_on_in_a_rescue_copy(tmp_path, rescue_root, caplog):
    run = tracked(tmp_path, "blocked")
    [rescued] = [os.path.join(root, f) for root, _, files in os.walk(rescue_root) for f in files]
    assert steps_in(rescued) == list(range(1, STEPS + 1)), "every step, in the rescue copy"
    assert run.outcome.exit_code == EXIT_UNDELIVERED
    assert run.outcome.undelivered["jsonl"].startswith(f"{rank_file(run.run_dir, 0)} was removed during the run and "
                                                       "its directory could not be made again (")
    assert run.outcome.undelivered["jsonl"].endswith(f": every line is in {rescued}")
    assert f"the log goes on in {rescued}" in caplog.text


def test_a_log_that_cannot_be_written_anywhere_is_said_lost(tmp_path, rescue_root, caplog):
    shutil.rmtree(rescue_root)
    rescue_root.write_text("a file: nothing can be made under it\n")
    run = tracked(tmp_path, "lost")
    said = run.outcome.undelivered["jsonl"]
    assert run.outcome.exit_code == EXIT_UNDELIVERED and run.outcome.status == "FINISHED"
    assert said.startswith(f"{rank_file(run.run_dir, 0)} was removed during the run and could not be written again")
    assert "line(s) up to step" in said and "are lost with it" in said
    assert "not delivered: none" not in caplog.text


class RemoveAt(Callback):
    """Removes the run dir at one step of a real ``Model.train``."""

    def __init__(self, monitor: BridgeMonitor, step: int) -> None:
        self.monitor, self.step = monitor, step

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            shutil.rmtree(self.monitor.run_dir)


@pytest.mark.slow
def test_model_train_with_every_sink_keeps_every_step_when_the_run_dir_goes(tmp_path, rescue_root, caplog):
    sinks = {"jsonl": {}, "tensorboard": {}, "mindinsight": {},
             "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    monitor = BridgeMonitor(dict(config(tmp_path), sinks=sinks), progress=False)
    train_regression([monitor, RemoveAt(monitor, 13)], steps=40)
    log = read_run(monitor.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 41))
    assert monitor.outcome.status == "FINISHED" and monitor.outcome.undelivered == {}
    assert "was removed during the run" in caplog.text


@pytest.mark.slow
def test_the_whole_output_tree_removed_is_named_per_sink_and_the_replay_fills_it(tmp_path, rescue_root, caplog):
    run = tracked(tmp_path, "everything", sinks=("jsonl", "tensorboard", "mindinsight"))
    assert steps_in(rank_file(run.run_dir, 0)) == list(range(1, STEPS + 1))
    assert run.outcome.exit_code == EXIT_UNDELIVERED and "jsonl" not in run.outcome.undelivered
    for sink in ("tensorboard", "mindinsight"):
        said = run.outcome.undelivered[sink]
        assert " were removed during the run, with every step up to " in said, said
        assert f"(msbridge replay {run.run_dir} --to {sink} writes them again)" in said
        assert "No space left" not in said, "a removed folder is not called a full disk"
    removed = [r.getMessage() for r in caplog.records
               if "was removed during the run (seen after step" in r.getMessage()]
    assert {m.split(":")[1].strip() for m in removed} == {"jsonl", "tensorboard", "mindinsight"}, removed
    assert "fsync of" not in caplog.text, "said as removed, not as a failed fsync at every flush"
    for sink in ("tensorboard", "mindinsight"):
        assert main(["replay", run.run_dir, "--to", sink]) == 0
    acc = EventAccumulator(str(tmp_path / "out" / "e" / "tensorboard" / "r" / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    assert sorted(e.step for e in acc.Scalars("train/loss")) == list(range(1, STEPS + 1)), "each step once"


@pytest.fixture
def can_mount(tmp_path):
    """Skips unless this test may bind-mount; unmounts what the test mounted under tmp_path afterwards."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    yield
    subprocess.run(["umount", "-l", str(tmp_path / "out" / "e" / "r")], capture_output=True, check=False)


def test_a_run_dir_made_read_only_is_named_at_once_and_the_open_log_keeps_every_step(tmp_path, can_mount, caplog):
    run = tracked(tmp_path, "readonly")
    said = [r.getMessage() for r in caplog.records if "is no longer writable (seen after step" in r.getMessage()]
    assert len(said) == 1 and run.run_dir in said[0], "named once, at the next flush"
    assert f"cannot write {run.run_dir}/run.json: Read-only file system" in caplog.text
    assert steps_in(rank_file(run.run_dir, 0)) == list(range(1, STEPS + 1))
    with open(os.path.join(run.run_dir, "run.json"), encoding="utf-8") as fh:
        assert "outcome" not in json.load(fh), "run.json claims no outcome it could not be given"
    assert run.outcome.exit_code == 3 and run.outcome.undelivered == {
        "run.json": f"the outcome could not be written to {run.run_dir}"}, "the exit code says it"

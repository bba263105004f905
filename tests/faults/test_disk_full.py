"""A real full disk: a 3 MB tmpfs as the output dir (root only), filled by a real training job's neighbour.

Writing run.json and README.md never raises out of a MindSpore hook and never leaves a
temp file; the full disk is named once, with the path and the space left; when space
comes back before the end, run.json and README carry the outcome. Without root,
``tests/run/test_run_files.py`` makes the same failure with a file-system shim.

MLflow's sqlite store on a tmpfs that fills mid-run: the full disk is named once (the store's
path and the space left, not "unreachable"), and once space is back the backlog is delivered.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import subprocess
import time

import pytest
from helpers.disk import fill, small_tmpfs
from helpers.mlflow_reads import assert_same_series, only_run, steps
from helpers.training import train_regression
from mindspore.train import Callback
from msbridge.adapters.mlflow_sink import LAST_STEP_TAG

from msbridge import BridgeMonitor
from msbridge.run import metadata
from msbridge.sinks.base import FINISHED

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

DISK_MB = 3


@pytest.fixture
def small_disk(tmp_path):
    """A real ``DISK_MB`` MB tmpfs mounted at ``tmp_path/disk``, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; tests/run/test_run_files.py fills the disk with a shim instead")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:  # lazy: a sink that failed to open may still hold its file (the process ends it)
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


class Filler(Callback):
    """Fills the disk at train begin (placed before the monitor, so before its run files are written)
    and deletes the filler after step ``free_at`` (never if None)."""

    def __init__(self, disk, free_at=None):
        super().__init__()
        self.path = os.path.join(disk, "filler")
        self.free_at = free_at

    def on_train_begin(self, run_context):
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT)
        try:
            chunk = b"\0" * 65536
            while chunk:  # halve the chunk at each ENOSPC, down to one byte: then not a byte is left
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    chunk = chunk[:len(chunk) // 2]
        finally:
            os.close(fd)

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.free_at:
            os.remove(self.path)


def run_with_a_full_disk(disk, free_at, caplog):
    monitor = BridgeMonitor({"output_dir": str(disk / "{experiment}" / "{run_name}"), "run_name": "full",
                             "flush_steps": 5, "sinks": ["jsonl", "tensorboard"]}, progress=False)
    caplog.set_level(logging.WARNING)
    train_regression([Filler(disk, free_at), monitor], steps=30)  # raises nothing
    return monitor


def leftovers(disk):
    return [os.path.join(root, name) for root, _, names in os.walk(disk) for name in names if ".tmp" in name]


@pytest.fixture(autouse=True)
def _tell_afresh(monkeypatch):
    monkeypatch.setattr(metadata, "_told", set())


def test_full_from_start_to_end(small_disk, caplog, capsys):
    monitor = run_with_a_full_disk(small_disk, None, caplog)
    assert monitor.outcome.status == FINISHED
    assert leftovers(small_disk) == []
    told = [r.getMessage() for r in caplog.records if "the disk is full" in r.getMessage()
            and "run.json" in r.getMessage()]
    assert told == [f"msbridge: the disk is full: cannot write {monitor.run_dir}/run.json "
                    f"({metadata.free_space(monitor.run_dir)} free on that file system); run.json and README.md "
                    "keep their last complete version"], "once, though both the start and the end failed"
    assert "Traceback" not in capsys.readouterr().err
    assert not any(r.exc_info for r in caplog.records if r.name == "msbridge")


def test_full_at_the_start_and_space_back_before_the_end(small_disk, caplog):
    monitor = run_with_a_full_disk(small_disk, 10, caplog)
    assert leftovers(small_disk) == []
    with open(os.path.join(monitor.run_dir, "run.json"), encoding="utf-8") as fh:
        outcome = json.load(fh)["outcome"]
    assert outcome["status"] == FINISHED and outcome["last step"] == 30
    readme = open(os.path.join(monitor.run_dir, "README.md"), encoding="utf-8").read()
    assert "- status: FINISHED" in readme
    assert sum("the disk is full" in r.getMessage() and "run.json" in r.getMessage() for r in caplog.records) == 1


class FillStore(Callback):
    """At step ``fill_at``: once MLflow holds some steps, fills the store's disk to the last byte. At step
    ``free_at``: once the sink has said the disk is full (``said``), frees the space."""

    def __init__(self, uri, disk, said, fill_at=10, free_at=30):
        super().__init__()
        self.uri, self.disk, self.said = uri, disk, said
        self.fill_at, self.free_at = fill_at, free_at
        self.filler = None

    def on_train_step_end(self, run_context):
        from mlflow.tracking import MlflowClient

        step = run_context.original_args().cur_step_num
        if step == self.fill_at:
            client = MlflowClient(self.uri)
            wait_until(lambda: any(int(r.data.tags.get(LAST_STEP_TAG, 0)) >= 5 for r in client.search_runs(
                [client.get_experiment_by_name("store").experiment_id])), "MLflow holds the first steps")
            self.filler = fill(self.disk)
        elif step == self.free_at:
            wait_until(self.said, "the sink names the full disk")
            os.remove(self.filler)


def wait_until(condition, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.2)


def test_mlflow_sqlite_store_on_a_full_disk_is_named_so_and_the_backlog_follows(tmp_path, caplog, capfd):
    from mlflow.tracking import MlflowClient

    with small_tmpfs(tmp_path / "store", size="16m") as disk:
        db = str(disk / "mlflow.db")
        uri = f"sqlite:///{db}"
        MlflowClient(uri).create_experiment("store", artifact_location=str(tmp_path / "artifacts"))
        caplog.set_level(logging.INFO, logger="msbridge")

        def said():
            return any("full disk" in r.getMessage() for r in caplog.records)

        mlflow = {"tracking_uri": uri, "backoff_initial": 0.2, "backoff_max": 0.5, "close_timeout": 60.0}
        monitor = BridgeMonitor({"experiment": "store", "run_name": "r", "flush_steps": 5,
                                 "output_dir": str(tmp_path / "runs" / "{run_name}"),
                                 "sinks": {"jsonl": {}, "mlflow": mlflow}}, progress=False)
        train_regression([monitor, FillStore(uri, disk, said)], steps=40)

        messages = [r.getMessage() for r in caplog.records]
        full = [m for m in messages if "full disk" in m]
        assert len(full) == 1 and not [m for m in messages if "unreachable" in m], messages
        assert full[0].startswith(f"msbridge: MLflow's store at {db} is on a full disk (")
        assert re.search(r"\((\d+ bytes|[\d.]+ kB) free\); training goes on, \d+ records are held in memory and retried",
                         full[0]), full[0]
        assert any("reachable again" in m for m in messages)
        assert "Traceback" not in capfd.readouterr().err  # MLflow's child process says nothing of its own
        assert monitor.outcome.status == FINISHED and monitor.outcome.undelivered == {}
        client = MlflowClient(uri)
        mlrun = only_run(client, "store")
        assert steps(client, mlrun.info.run_id) == list(range(1, 41))  # coverage first: every step, once
        assert_same_series(client, mlrun.info.run_id, monitor.run_dir)
        assert mlrun.info.status == FINISHED

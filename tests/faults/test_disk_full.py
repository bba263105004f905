"""A real full disk: a 3 MB tmpfs as the output dir (root only), filled by a real training job's neighbour.

Writing run.json and README.md never raises out of a MindSpore hook and never leaves a
temp file; the full disk is named once, with the path and the space left; when space
comes back before the end, run.json and README carry the outcome. Without root,
``tests/run/test_run_files.py`` makes the same failure with a file-system shim.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import subprocess

import pytest
from mindspore.train import Callback
from training import train_regression

from msbridge import BridgeMonitor
from msbridge.run import metadata
from msbridge.sinks.base import FINISHED

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

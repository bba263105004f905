"""run.json and README.md: masked, atomic, and never an exception out of a MindSpore hook.

A file-system shim makes every write fail as a full disk does (ENOSPC), on any machine;
``tests/faults/test_disk_full.py`` does it for real on a small tmpfs.
"""
from __future__ import annotations

import builtins
import errno
import json
import logging
import os

from msbridge.run import metadata
from msbridge.run.metadata import README, RUN_JSON, free_space, write_run_files

META = {"run_name": "r", "config": {"params": {"db": {"credentials": {"user": "u", "pw": "s3cr3t-1"}},
                                               "db_password_list": ["s3cr3t-2"],
                                               "data": "https://u:s3cr3t-3@host/x"}}}


class FullDisk:
    """``open`` for the metadata module: files open, and every write to one fails with ENOSPC."""

    def __call__(self, path, mode="r", *args, **kwargs):
        handle = builtins.open(path, mode, *args, **kwargs)
        if "w" in mode:
            def write(text):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            handle.write = write
        return handle


def files(directory):
    return sorted(os.listdir(directory))


def test_written_masked_at_any_depth(tmp_path):
    assert write_run_files(str(tmp_path), META, "# r\n\nuri: http://me:s3cr3t-4@127.0.0.1:5000\n") is True
    text = (tmp_path / RUN_JSON).read_text() + (tmp_path / README).read_text()
    assert "s3cr3t" not in text and "http://me:***@127.0.0.1:5000" in text
    assert json.loads((tmp_path / RUN_JSON).read_text())["config"]["params"]["db_password_list"] == ["***"]
    assert files(tmp_path) == [README, RUN_JSON]


def test_a_full_disk_is_told_once_with_the_path_and_leaves_the_last_complete_files(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(metadata, "_told", set())
    assert write_run_files(str(tmp_path), {"run_name": "r", "outcome": None}, "# r\n") is True
    before = {name: (tmp_path / name).read_text() for name in files(tmp_path)}
    caplog.set_level(logging.ERROR, logger="msbridge")
    monkeypatch.setattr(metadata, "open", FullDisk(), raising=False)  # from here every write fails
    for _ in range(3):
        assert write_run_files(str(tmp_path), {"run_name": "r", "outcome": {"status": "FINISHED"}}, "# r\n") is False
    assert {name: (tmp_path / name).read_text() for name in files(tmp_path)} == before, "no half file, no temp file"
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 1 and told[0].startswith("msbridge: the disk is full: cannot write ")
    assert f"cannot write {tmp_path / RUN_JSON} ({free_space(str(tmp_path))} free on that file system)" in told[0]


def test_a_failed_rename_removes_the_temp_file_and_raises_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(metadata, "_told", set())

    def no_rename(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO), dst)

    monkeypatch.setattr(metadata.os, "replace", no_rename)
    assert write_run_files(str(tmp_path), META, "# r\n") is False
    assert files(tmp_path) == []
    assert [r.getMessage() for r in caplog.records if r.name == "msbridge"] == [
        f"msbridge: cannot write {tmp_path / RUN_JSON}: Input/output error; run.json and README.md keep their "
        "last complete version"]


def test_an_unwritable_run_dir_is_told_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert write_run_files(str(blocker / "run"), META, "# r\n") is False
    assert "cannot write" in caplog.text


def test_run_json_and_the_readme_config_are_strict_json(tmp_path):
    meta = {"run_name": "r", "config": {"params": {"a": float("nan"), "b": float("inf"), "c": [float("-inf"), 1.5]}}}
    assert write_run_files(str(tmp_path), meta, metadata.render_readme("r", "id", meta, {}, str(tmp_path))) is True

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    data = json.loads((tmp_path / RUN_JSON).read_text(), parse_constant=refuse)
    assert data["config"]["params"] == {"a": "nan", "b": "inf", "c": ["-inf", 1.5]}
    readme = (tmp_path / README).read_text()
    block = readme.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(block, parse_constant=refuse)["params"]["a"] == "nan"


def test_a_line_break_in_the_run_name_or_command_keeps_the_readme_heading_one_line(tmp_path):
    meta = {"command": "train.py --note 'a\nb'"}
    readme = metadata.render_readme("run\n# injected\r\nheading", "id", meta, {}, str(tmp_path))
    lines = readme.splitlines()
    assert lines[0] == "# run # injected heading"
    assert [line for line in lines if line.startswith("#")] == ["# run # injected heading", "## Sinks",
                                                               "## Look at it", "## Resolved config"]
    assert "- command: `train.py --note 'a b'`" in lines

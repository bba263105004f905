"""The jsonl write-ahead log on a full disk: never a malformed line, held lines written when space returns,
what is finally dropped a ``gap`` event in the log, every other sink and the run's outcome.

ENOSPC comes from a file-system shim (``helpers.disk.DiskShim``: short writes, then ENOSPC or EIO) everywhere,
and from a real 3 MB tmpfs when the tests run as root (``tests/faults/test_wal_tmpfs.py``).
"""
from __future__ import annotations

import errno
import logging
import os

import pytest
from helpers.disk import DiskShim, assert_covered, parse_lines, steps_and_gaps
from helpers.runs import make_records, make_run
from msbridge.adapters import jsonl_sink
from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.adapters.tensorboard_sink import TensorBoardSink
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from msbridge.run.outcome import RunOutcome
from msbridge.sinks.base import FINISHED, Event
from msbridge.sinks.dispatch import Dispatcher
from msbridge.sinks.runlog import encode_record, read_rank_file


def batches(first, last, size=5):
    return [make_records(range(s, min(s + size, last + 1))) for s in range(first, last + 1, size)]


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture
def shim(monkeypatch, tmp_path):
    return DiskShim(monkeypatch, tmp_path / "exp")


def test_held_lines_are_written_when_space_returns_and_the_full_disk_is_said_once(tmp_path, shim, caplog):
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    caplog.set_level(logging.WARNING, logger="msbridge")
    for batch in batches(1, 10):
        sink.write(batch, [])
    shim.space = 0
    for batch in batches(11, 60):
        sink.write(batch, [])
        assert steps_and_gaps(parse_lines(sink.path))[0] == list(range(1, 11)), "only complete lines, ever"
    shim.space = None
    sink.flush()  # every flush retries
    sink.write(make_records([61]), [Event("anomaly", 61, 0, 1.0, {"check": "x"})])
    sink.close("FINISHED")

    assert assert_covered(parse_lines(sink.path), list(range(1, 62))) == [], "nothing dropped: no gap"
    said = warnings_of(caplog)
    assert len(said) == 2, said
    assert said[0].startswith(f"msbridge: jsonl: cannot write {sink.path}: the disk is full (")
    assert "free in" in said[0] and "retrying at every flush" in said[0]
    assert said[1] == f"msbridge: jsonl: {sink.path} is writable again; every held line is written"


def test_a_short_write_is_cut_back_to_the_last_complete_line(tmp_path, shim):
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    sink.write(make_records(range(1, 4)), [])
    good = os.path.getsize(sink.path)
    batch = make_records(range(4, 14))
    fits = len(encode_record(batch[0])) + len(encode_record(batch[1]))
    shim.space = fits + 100  # two whole lines of the batch and part of the third fit
    sink.write(batch, [])
    assert shim.failures == 1
    assert steps_and_gaps(parse_lines(sink.path))[0] == [1, 2, 3, 4, 5], "the whole lines that fit stay"
    assert os.path.getsize(sink.path) == good + fits, "the cut line is gone"
    shim.space = None
    sink.close("FINISHED")
    assert assert_covered(parse_lines(sink.path), list(range(1, 14))) == []


def test_a_failed_fsync_is_rolled_back_and_written_again(tmp_path, monkeypatch):
    shim = DiskShim(monkeypatch, tmp_path / "exp", error=errno.EIO)
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    sink.write(make_records(range(1, 6)), [])
    shim.fsync_errors = 1  # EIO: nothing of that write is known to be on disk
    sink.write(make_records(range(6, 11)), [])
    assert steps_and_gaps(parse_lines(sink.path))[0] == [1, 2, 3, 4, 5]
    sink.write(make_records(range(11, 16)), [])
    sink.close("FINISHED")
    assert steps_and_gaps(parse_lines(sink.path))[0] == list(range(1, 16)), "rewritten once, no duplicate"


def test_an_eio_write_is_named_as_such(tmp_path, monkeypatch, caplog):
    shim = DiskShim(monkeypatch, tmp_path / "exp", error=errno.EIO)
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    caplog.set_level(logging.WARNING, logger="msbridge")
    shim.space = 0
    sink.write(make_records(range(1, 6)), [])
    shim.space = None
    sink.close("FINISHED")
    assert "Input/output error (EIO)" in warnings_of(caplog)[0]
    assert steps_and_gaps(parse_lines(sink.path))[0] == [1, 2, 3, 4, 5]


def test_past_the_bound_the_oldest_lines_become_one_gap_event_in_every_sink(tmp_path, shim, monkeypatch, caplog):
    monkeypatch.setattr(jsonl_sink, "MAX_HELD_LINES", 12)
    run = make_run(tmp_path)
    tb_logdir = tmp_path / "tb"  # off the full disk
    dispatcher = Dispatcher([JsonlSink(), TensorBoardSink(logdir=str(tb_logdir))], run)
    caplog.set_level(logging.WARNING, logger="msbridge")
    for batch in batches(1, 10):
        dispatcher.submit(batch)
    assert dispatcher.flush(timeout=30)
    shim.space = 0
    for batch in batches(11, 40):
        dispatcher.submit(batch)
    dispatcher.submit([], [Event("anomaly", 40, 0, 1.0, {"check": "x"})])
    assert dispatcher.flush(timeout=30)
    shim.space = None
    for batch in batches(41, 50):
        dispatcher.submit(batch)
    dispatcher.close("FINISHED")

    path = read_rank_file(os.path.join(run.run_dir, "metrics", "rank_0.jsonl")).path
    lines = parse_lines(path)
    (gap,) = assert_covered(lines, list(range(1, 51)))
    assert (gap["first_step"], gap["last_step"], gap["records"], gap["events"]) == (11, 29, 19, 0)
    assert gap["sink"] == "jsonl" and gap["path"] == path and gap["reason"].startswith("the disk is full")
    kinds = [(line["type"], line.get("step")) for line in lines]
    assert kinds.index(("event", 29)) == kinds.index(("metrics", 10)) + 1, "the gap sits where its lines were"
    assert [e.kind for e in dispatcher.gaps] == ["gap"]
    assert sum("dropping the oldest" in w for w in warnings_of(caplog)) == 1, "said once, not per batch"
    lost = dispatcher.undelivered["jsonl"]  # the run's outcome: exit 3, the loss counted
    assert lost.startswith(f"19 record(s) and 0 event(s) of steps 11-29 lost from {path} (the disk is full"), lost
    assert RunOutcome(FINISHED, dispatcher.undelivered).exit_code == 3
    assert any(w == f"msbridge: jsonl: {lost}" for w in warnings_of(caplog)), "said at close, in one line"

    acc = EventAccumulator(str(tb_logdir / "r1" / "rank_0"), size_guidance={"tensors": 0})
    acc.Reload()
    (text,) = acc.Tensors("events/gap")
    assert text.step == 29 and b'"first_step": 11' in text.tensor_proto.string_val[0]


def test_lines_still_held_at_close_are_a_gap_for_the_other_sinks(tmp_path, shim, caplog):
    class Events(JsonlSink):  # records what the dispatcher hands over (its own log is off the full disk)
        name = "events"

        def open(self, run):
            super().open(make_run(tmp_path / "elsewhere"))

    run = make_run(tmp_path)
    other = Events()
    dispatcher = Dispatcher([JsonlSink(), other], run)
    dispatcher.submit(make_records(range(1, 6)))
    assert dispatcher.flush(timeout=30)
    shim.space = 0
    dispatcher.submit(make_records(range(6, 11)))
    dispatcher.close("KILLED")

    assert steps_and_gaps(parse_lines(os.path.join(run.run_dir, "metrics", "rank_0.jsonl")))[0] == [1, 2, 3, 4, 5]
    (gap,) = steps_and_gaps(parse_lines(other.path))[1]
    assert (gap["first_step"], gap["last_step"], gap["records"]) == (6, 10, 5)
    assert [e.kind for e in dispatcher.gaps] == ["gap"]
    assert any("could not take 5 record(s) and 0 event(s) of steps 6-10" in w for w in warnings_of(caplog))
    assert dispatcher.undelivered["jsonl"].startswith("5 record(s) and 0 event(s) of steps 6-10 lost from")
    assert RunOutcome(FINISHED, dispatcher.undelivered).exit_code == 3  # though nothing reached the file


def test_a_disk_full_from_the_start_gets_the_header_first(tmp_path, shim):
    shim.space = 0
    sink = JsonlSink()
    sink.open(make_run(tmp_path))  # does not raise: the header waits with the rest
    sink.write(make_records(range(1, 6)), [])
    shim.space = None
    sink.write(make_records(range(6, 8)), [])
    sink.close("FINISHED")
    assert assert_covered(parse_lines(sink.path), list(range(1, 8))) == []

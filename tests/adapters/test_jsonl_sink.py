"""The jsonl sink and its reader: schema, null for non-finite, fsync per batch, resume, cut lines."""
from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers.runs import Handed, make_records, make_run

from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.sinks.base import Event, Record
from msbridge.sinks.runlog import RunLogError, encode_record, rank_file, read_rank_file, read_run


def records(first, last, rank=0):
    return make_records(range(first, last + 1), rank=rank)


def test_schema_header_metrics_events(tmp_path):
    run, recs = make_run(tmp_path), records(1, 3)
    sink = JsonlSink()
    sink.open(run)
    sink.write(recs, [Event("anomaly", 2, 0, 1002.0, {"check": "nonfinite_loss", "value": math.nan})])
    sink.close("FINISHED")
    text = open(rank_file(run.run_dir, 0)).read()
    assert " " not in text, "compact separators (last_step finds a step by them)"
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0] == {"type": "header", "schema_version": 1, "run_id": "id-r1", "run_name": "r1",
                        "experiment": "exp", "rank": 0, "world_size": 1}
    assert lines[1] == {"type": "metrics", "step": 1, "rank": 0, "time": recs[0].time, "values": dict(recs[0].values)}
    assert lines[4] == {"type": "event", "kind": "anomaly", "step": 2, "rank": 0, "time": 1002.0,
                        "detail": {"check": "nonfinite_loss", "value": "nan"}}
    assert (text.splitlines()[1] + "\n").encode() == encode_record(recs[0]), "the sink writes runlog's encoding"


def test_non_finite_is_null_and_listed_and_reads_back_as_nan(tmp_path):
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    sink.write([Record(1, 0, 1.0, {"train/loss": math.nan, "train/grad_norm": math.inf, "train/lr": 0.1})], [])
    sink.close()
    line = json.loads(open(sink.path).read().splitlines()[1])
    assert line["values"] == {"train/loss": None, "train/grad_norm": None, "train/lr": 0.1}
    assert line["nonfinite"] == ["train/loss", "train/grad_norm"]
    back = read_rank_file(sink.path).records[0].values
    assert math.isnan(back["train/loss"]) and back["train/lr"] == 0.1


def test_every_batch_is_on_disk_before_close(tmp_path):
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    sink.write(records(1, 5), [])
    # Read through a separate file handle while the sink is still open: the batch is durable.
    assert len(read_rank_file(sink.path).records) == 5
    sink.close()


def test_resume_appends_and_never_writes_a_step_twice(tmp_path):
    first = JsonlSink()
    first.open(make_run(tmp_path))
    first.write(records(1, 10), [])
    first.close()
    second = Handed(JsonlSink())
    second.open(make_run(tmp_path))
    second.write(records(8, 15), [])  # resumed from a checkpoint at step 7
    second.close()
    log = read_rank_file(first.path)
    assert [r.step for r in log.records] == list(range(1, 16))
    assert sum(1 for line in open(first.path) if '"header"' in line) == 1


def test_a_line_cut_by_a_kill_is_skipped_counted_and_trimmed_on_resume(tmp_path):
    sink = JsonlSink()
    sink.open(make_run(tmp_path))
    sink.write(records(1, 4), [])
    sink.close()
    with open(sink.path, "a") as fh:
        fh.write('{"type":"metrics","step":5,"rank":0,"ti')  # the process died mid-line
    log = read_rank_file(sink.path)
    assert [r.step for r in log.records] == [1, 2, 3, 4] and log.truncated == 1

    resumed = JsonlSink()
    resumed.open(make_run(tmp_path))
    resumed.write(records(5, 6), [])
    resumed.close()
    log = read_rank_file(sink.path)
    assert [r.step for r in log.records] == [1, 2, 3, 4, 5, 6] and log.truncated == 0


def test_newer_schema_is_a_clear_error(tmp_path):
    path = tmp_path / "metrics" / "rank_0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"type": "header", "schema_version": 99, "rank": 0}) + "\n")
    with pytest.raises(RunLogError, match="schema version 99.*up to version 1"):
        read_run(str(tmp_path))


def test_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(RunLogError, match="metrics/rank_\\*.jsonl is missing"):
        read_run(str(tmp_path))


def test_ranks_write_their_own_files(tmp_path):
    for rank in (0, 1):
        sink = JsonlSink()
        sink.open(make_run(tmp_path, rank=rank, world_size=2))
        sink.write(records(1, 3, rank=rank), [])
        sink.close()
    run = read_run(make_run(tmp_path).run_dir)
    assert sorted(run.ranks) == [0, 1]
    assert all(r.rank == rank for rank, log in run.ranks.items() for r in log.records)
    assert os.path.basename(run.ranks[1].path) == "rank_1.jsonl"


@settings(max_examples=500, deadline=None)
@given(step=st.integers(0, 2 ** 62), rank=st.integers(0, 4096), time=st.floats(0, 4e9),
       values=st.dictionaries(st.text(max_size=12), st.one_of(
           st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 53, 2 ** 53), st.booleans()), max_size=6))
def test_a_line_reads_back_as_exactly_the_record_it_encodes(step, rank, time, values):
    """encode_record (orjson) writes each value as a float whose text parses back to it exactly, a non-finite one
    as null and named, the fields in order, without spaces between them."""
    as_floats = {name: float(value) for name, value in values.items()}
    nonfinite = [name for name, value in as_floats.items() if not math.isfinite(value)]
    line = {"type": "metrics", "step": step, "rank": rank, "time": time,
            "values": {name: value if math.isfinite(value) else None for name, value in as_floats.items()}}
    if nonfinite:
        line["nonfinite"] = nonfinite
    encoded = encode_record(Record(step, rank, time, values))
    assert encoded.endswith(b"}\n") and encoded.count(b"\n") == 1
    assert encoded.startswith(b'{"type":"metrics","step":%d,"rank":%d,"time":' % (step, rank))
    decoded = json.loads(encoded)
    assert list(decoded) == list(line) and list(decoded["values"]) == list(line["values"])
    assert decoded == line


def test_a_metric_name_orjson_refuses_is_escaped_as_json_does():
    """A lone surrogate is not UTF-8: orjson refuses it, and json's escape keeps the name as it was."""
    encoded = encode_record(Record(1, 0, 1.0, {"loss\ud800": 2.0, "lr": math.inf}))
    assert json.loads(encoded) == {"type": "metrics", "step": 1, "rank": 0, "time": 1.0,
                                   "values": {"loss\ud800": 2.0, "lr": None}, "nonfinite": ["lr"]}



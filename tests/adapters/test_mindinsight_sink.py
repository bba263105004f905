"""MindInsightSink: files read back with MindSpore's protobuf classes and CRC framing, then by a real
MindInsight 2.3.1 over its REST API, compared with the jsonl log of the same records."""
from __future__ import annotations

import glob
import math
import os
import struct
import time

import numpy as np
import pytest
from helpers.mindinsight_server import require_mindinsight, serve
from helpers.runs import Handed, make_records, make_run
from helpers.training import train_regression
from helpers.wire_cases import SCALAR_EVENTS
from mindspore.train.lineage_pb2 import LineageEvent
from mindspore.train.summary_pb2 import Event as SummaryEvent

from msbridge import BridgeMonitor
from msbridge.adapters._eventwire import MINDSPORE_VALUE, scalar_event
from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.adapters.mindinsight_sink import MindInsightSink, mindinsight_tag
from msbridge.names import HEADLINE
from msbridge.sinks.base import FAILED, FINISHED, KILLED, Event
from msbridge.sinks.registry import resolve
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)

HEADLINE_TAGS = [f"{mindinsight_tag(name)}/scalar" for name in HEADLINE]
PARAMS = {"lr": 0.01, "optimizer": {"type": "AdamW", "betas": [0.9, 0.95]}, "epochs": 3, "model": {"hidden": 4}}


def mi_run(root, **fields):
    """A run whose params and metadata fill MindInsight's lineage page."""
    return make_run(root, config={"params": PARAMS}, metadata={"batch_size": 8, "parallel_mode": "data_parallel"},
                    **fields)


# -- MindSpore's own format: its protobuf classes and its record framing -----------------
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC MindSpore's event writer puts after each length and body (TFRecord's masked CRC32C)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_framed(path):
    """Bodies of a summary file: u64 length, masked CRC of it, body, masked CRC of the body."""
    raw, pos, bodies = open(path, "rb").read(), 0, []
    while pos < len(raw):
        header = raw[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        body = raw[pos + 12:pos + 12 + length]
        (header_crc,), (body_crc,) = struct.unpack("<I", raw[pos + 8:pos + 12]), \
            struct.unpack("<I", raw[pos + 12 + length:pos + 16 + length])
        assert header_crc == masked_crc32c(header), f"{path}@{pos}: header CRC"
        assert body_crc == masked_crc32c(body), f"{path}@{pos}: body CRC"
        bodies.append(body)
        pos += 16 + length
    return bodies


def one(pattern):
    [path] = glob.glob(pattern)
    return path


def scalars(path):
    """{tag: [(step, value)]} from a summary file, after MindSpore's version event."""
    events = [SummaryEvent.FromString(b) for b in read_framed(path)]
    assert events[0].version == "MindSpore.Event:1"
    out = {}
    for ev in events[1:]:
        for value in ev.summary.value:
            out.setdefault(value.tag, []).append((ev.step, value.scalar_value))
    return out


def user_info(lineage_path):
    info = {}
    for body in read_framed(lineage_path):
        event = LineageEvent.FromString(body)
        for item in event.user_defined_info.user_info:
            for field in (item.map_str, item.map_int32, item.map_double):
                info.update(map_entries(field))
    return info


def map_entries(field):
    """(key, value) pairs of a lineage map field: a real protobuf map (MindSpore 2.10's generated
    code) or repeated key/value entries (up to 2.9's)."""
    return field.items() if hasattr(field, "items") else [(entry.key, entry.value) for entry in field]


def same(got, want):
    """MindInsight stores float32; jsonl keeps float64 and reads non-finite values back as NaN."""
    assert [s for s, _ in got] == [s for s, _ in want]
    for (step, g), (_, w) in zip(got, want):
        if math.isfinite(w):
            assert g == np.float32(w), (step, g, w)
        else:
            assert g is None or not math.isfinite(g), (step, g, w)


def test_crc_check_matches_mindspore_framing(tmp_path):
    """The test's CRC check accepts a file MindSpore's SummaryRecord wrote and rejects a changed byte."""
    from mindspore import Tensor
    from mindspore.train.summary import SummaryRecord

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    with SummaryRecord(str(tmp_path / "ms")) as summary_record:
        summary_record.add_value("scalar", "loss", Tensor(0.5))
        summary_record.record(3)
    assert scalars(one(str(tmp_path / "ms" / "*_MS"))) == {"loss": [(3, 0.5)]}

    sink = MindInsightSink(summary_base_dir=str(tmp_path / "mine"))
    sink.open(mi_run(tmp_path))
    sink.write(make_records([1, 2]), [])
    sink.close(FINISHED)
    path = one(str(tmp_path / "mine" / "r1_rank_0" / "*_MS"))
    data = bytearray(open(path, "rb").read())
    data[-6] ^= 0xFF  # inside the last record's body
    os.chmod(path, 0o600)
    open(path, "wb").write(bytes(data))
    with pytest.raises(AssertionError, match="body CRC"):
        read_framed(path)


@pytest.mark.parametrize("step, wall_time, values", SCALAR_EVENTS)
def test_scalar_event_is_byte_for_byte_mindspore_protobuf(step, wall_time, values):
    event = SummaryEvent(wall_time=wall_time, step=step)
    for tag, value in values.items():
        event.summary.value.add(tag=tag, scalar_value=value)
    assert scalar_event(step, wall_time, values, MINDSPORE_VALUE, {}) == event.SerializeToString()


def test_records_events_and_lineage_parse_back_with_mindspore_classes(tmp_path):
    run = mi_run(tmp_path, world_size=2)
    sink, jsonl = MindInsightSink(), JsonlSink()
    assert resolve("mindinsight") is MindInsightSink
    base = str(tmp_path / "exp" / "summary")
    assert sink.describe(run) == {"where": os.path.join(base, "r1_rank_0")}
    events = [Event("anomaly", 3, 0, time.time(), {"check": "nonfinite_loss"}), Event("anomaly", 3, 0),
              Event("checkpoint", 4, 0)]
    for s in (sink, jsonl):
        s.open(run)
        s.write(make_records(range(1, 4), world_size=2, nan_step=3), events[:2])
        s.write(make_records(range(4, 6), world_size=2), events[2:])
        s.close(FAILED)

    rank_dir = os.path.join(base, "r1_rank_0")
    got = scalars(one(os.path.join(rank_dir, "*_MS")))
    log = read_run(run.run_dir).ranks[0]
    assert set(got) == {mindinsight_tag(n) for n in log.metric_names()} | {"events/anomaly", "events/checkpoint"}
    for name in log.metric_names():
        same(got[mindinsight_tag(name)], log.series(name))
    assert math.isnan(dict(got["1_train/loss"])[3]) and dict(got["dist/loss_std"])[3] == math.inf
    assert got["events/anomaly"] == [(3, 2.0)] and got["events/checkpoint"] == [(4, 1.0)]

    [train, *_] = [LineageEvent.FromString(b) for b in read_framed(one(os.path.join(rank_dir, "*_lineage")))]
    hyper = train.train_lineage.hyper_parameters
    assert (hyper.device_num, hyper.batch_size, hyper.optimizer, hyper.epoch, hyper.parallel_mode) == \
        (2, 8, "AdamW", 3, "data_parallel")
    assert hyper.learning_rate == np.float32(0.01)
    info = user_info(one(os.path.join(rank_dir, "*_lineage")))
    assert info["lr"] == 0.01 and info["optimizer.type"] == "AdamW" and info["optimizer.betas"] == "[0.9, 0.95]"
    assert info["model.hidden"] == 4 and info["msbridge.world_size"] == 2 and info["msbridge.run_id"] == "id-r1"
    assert info["msbridge.status"] == FAILED  # the last user-defined event wins


@pytest.mark.slow
def test_batches_reach_the_file_flush_fsyncs_resume_adds_a_file_and_an_open_sink_is_idle(tmp_path, monkeypatch):
    def threads_and_children():
        tasks = os.listdir("/proc/self/task")  # native threads too, not only Python's
        return len(tasks), {pid for task in tasks for pid in open(f"/proc/self/task/{task}/children").read().split()}

    before = threads_and_children()
    sink = MindInsightSink(summary_base_dir=str(tmp_path / "s"))
    sink.open(mi_run(tmp_path))
    sink.write(make_records(range(1, 6)), [])
    first = one(str(tmp_path / "s" / "r1_rank_0" / "*_MS"))
    assert [s for s, _ in scalars(first)["1_train/loss"]] == [1, 2, 3, 4, 5]  # each batch reaches the file
    cpu = time.process_time()
    time.sleep(1.0)
    idle = time.process_time() - cpu
    assert threads_and_children() == before  # no writer thread, no writer process
    assert idle < 0.05, f"an open MindInsightSink used {idle:.3f} CPU-s in 1 s"
    synced = []
    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
        sink.flush()  # durable without close: both files fsynced
    assert sorted(synced) == sorted(glob.glob(str(tmp_path / "s" / "r1_rank_0" / "*")))
    sink.close(KILLED)

    resumed = Handed(MindInsightSink(summary_base_dir=str(tmp_path / "s")))  # its host skips the held steps
    resumed.open(mi_run(tmp_path, resumed_from_step=5))  # at once: same second, so a later file name
    resumed.write(make_records(range(4, 8)), [])
    resumed.close(FINISHED)
    files = sorted(glob.glob(str(tmp_path / "s" / "r1_rank_0" / "*_MS")))
    assert len(files) == 2 and files[0] == first
    assert [s for s, _ in scalars(first)["1_train/loss"]] == [1, 2, 3, 4, 5]  # the old file is untouched
    assert [s for s, _ in scalars(files[1])["1_train/loss"]] == [6, 7]
    assert user_info(files[0].replace("_MS", "_lineage"))["msbridge.status"] == KILLED


# -- a real MindInsight 2.3.1 -------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two sink-written runs (one with two ranks) and one real training run, all under exp/summary."""
    require_mindinsight()  # before writing anything: a missing venv fails at once, saying how to build it
    root = tmp_path_factory.mktemp("mi")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        written = {}
        for name, world in (("r1", 2), ("r2", 1)):
            for rank in range(world):
                run = mi_run(root, name=name, rank=rank, world_size=world)
                for sink in (JsonlSink(), MindInsightSink()):
                    sink.open(run)
                    sink.write(make_records(range(1, 13), rank=rank, world_size=world, nan_step=5), [])
                    sink.write(make_records(range(13, 21), rank=rank, world_size=world),
                               [Event("anomaly", 5, rank, time.time(), {"check": "nonfinite_loss"})])
                    sink.close(FINISHED)
                written[f"./{name}_rank_{rank}"] = (run.run_dir, rank)
        monitor = BridgeMonitor({"experiment": "exp", "run_name": "trained", "flush_steps": 7,
                                 "sinks": ["jsonl", "mindinsight"], "output_dir": str(root / "{experiment}/{run_name}"),
                                 "params": {"lr": 0.01}}, progress=False)
        train_regression([monitor], steps=24)
        written["./trained_rank_0"] = (monitor.run_dir, 0)
        with serve(str(root / "exp" / "summary"), str(root / "workspace")) as client:
            yield client, written
    finally:
        os.chdir(cwd)


@pytest.mark.slow
def test_mindinsight_lists_every_run_and_rank(served):
    client, written = served
    jobs = client.train_jobs()
    assert set(jobs) == set(written)
    assert all(job["summary_files"] == 1 and job["lineage_files"] == 1 for job in jobs.values())


def test_mindinsight_serves_the_jsonl_series(served):
    client, written = served
    for train_id, (run_dir, rank) in written.items():
        log = read_run(run_dir).ranks[rank]
        names = log.metric_names()
        assert "train/loss" in names
        for name in names:
            want = log.series(name)
            points = client.wait_for_points(train_id, f"{mindinsight_tag(name)}/scalar", len(want))
            same([(p["step"], p["value"]) for p in points], want)
    trained = read_run(written["./trained_rank_0"][0]).ranks[0]
    assert [s for s, _ in trained.series("train/loss")] == list(range(1, 25))


def test_mindinsight_shows_nan_as_null_and_events_as_markers(served):
    client, _ = served
    points = {p["step"]: p["value"] for p in client.wait_for_points("./r1_rank_1", "1_train/loss/scalar", 20)}
    assert points[5] is None and points[6] is not None
    markers = client.wait_for_points("./r1_rank_1", "events/anomaly/scalar", 1)
    assert [(p["step"], p["value"]) for p in markers] == [(5, 1.0)]


def test_mindinsight_lists_the_loss_first(served):
    """The dashboard plots the first two tags of ``single-job?plugin_name=scalar`` (MindInsight sorts them)."""
    client, written = served
    for train_id in written:
        client.wait_for_points(train_id, "1_train/loss/scalar", 20)
        [job] = client.get("/datavisual/single-job", train_id=train_id, plugin_name="scalar")["train_jobs"]
        tags = job["tags"]
        lead = [tag for tag in tags if tag in HEADLINE_TAGS]  # the headline metrics this job has, in their order
        assert tags[:len(lead)] == lead and lead == sorted(lead, key=HEADLINE_TAGS.index), (train_id, tags)
        assert lead[0] == "1_train/loss/scalar" and len(lead) >= 2, (train_id, tags)


@pytest.mark.slow
def test_mindinsight_lineage_shows_the_hyperparameters(served):
    client, written = served
    deadline, rows = time.monotonic() + 60, {}
    while time.monotonic() < deadline and set(rows) != set(written):
        rows = {o["summary_dir"]: o["model_lineage"] for o in client.post("/lineagemgr/lineages", {})["object"]}
        time.sleep(0.5)
    assert set(rows) == set(written)
    r1 = rows["./r1_rank_1"]
    assert (r1["device_num"], r1["batch_size"], r1["optimizer"], r1["epoch"]) == (2, 8, "AdamW", 3)
    assert r1["user_defined"]["model.hidden"] == 4 and r1["user_defined"]["msbridge.rank"] == 1
    assert r1["user_defined"]["msbridge.status"] == FINISHED
    assert rows["./trained_rank_0"]["learning_rate"] == pytest.approx(0.01)
    assert rows["./trained_rank_0"]["user_defined"]["msbridge.run_name"] == "trained"

"""The whole experiment dir (run dir, mlflow.db, tensorboard/, summary/) on a real 4 MB tmpfs (root only), filled
mid-run; 4 MB, so that the room freed holds what MLflow's sqlite store (1 MB when new) writes afterwards.

(a) freed again during training: every step reaches jsonl, MLflow, TensorBoard and MindInsight exactly once (read
back with MlflowClient, TensorBoard's EventAccumulator and MindSpore's summary protobuf), and run.json says FINISHED
with nothing undelivered. (b) never freed: run.json has its outcome (the reserved room), which names each sink's
lost range exactly (the steps its reader does not find: for TensorBoard and MindInsight the batch that met the full
disk, then the steps they did not read from jsonl), the gap events say the same (MLflow's are not lost but
undelivered: its replay fills them), and the exit code is 3.
(c) a batch past the wait bound (made small here): its oldest are dropped as one gap, written into every sink; the
later batches are read from jsonl once space is back.
(d) (a) again under a real MindSpore ``Model.train`` with ``BridgeMonitor``.
"""
from __future__ import annotations

import ast
import glob
import json
import logging
import os
import re
import time
from collections import Counter

import pytest
from helpers.disk import fill, small_tmpfs
from helpers.training import train_regression
from mindspore.train import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import msbridge
from msbridge import BridgeMonitor
from msbridge.adapters import _diskwait
from msbridge.sinks.base import FINISHED
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS, FULL_AT, FREE_AT = 600, 60, 200
SINKS = ("jsonl", "mlflow", "tensorboard", "mindinsight")
#: The sinks' config: MLflow retries a store on a full disk for 5 s at the close (30 s by default)
SINK_CONFIG = {sink: {"close_timeout": 5.0} if sink == "mlflow" else {} for sink in SINKS}
ALL = list(range(1, STEPS + 1))


def wait_until_said(caplog, what="cannot write", timeout=60.0):
    """Until both trackers have said ``what`` of their full disk (their threads lag the loop on a busy machine)."""
    deadline = time.monotonic() + timeout
    while not all(any(r.getMessage().startswith(f"msbridge: {sink}: {what}") for r in caplog.records)
                  for sink in ("tensorboard", "mindinsight")):
        assert time.monotonic() < deadline, "the trackers never met the full disk"
        time.sleep(0.05)


def train(disk, free_at, caplog=None, said="cannot write"):
    """600 steps of ``msbridge.track`` with the disk filled after step 60 and freed after ``free_at``, once the
    trackers have ``said`` so (in ``caplog``)."""
    cfg = {"experiment": "full", "run_name": "r", "experiment_dir": str(disk / "full"), "flush_steps": 10,
           "sinks": SINK_CONFIG}
    filler = None
    with msbridge.track(cfg, progress=False) as run:
        for step in ALL:
            run.step(loss=1.0 / step, lr=0.01)
            if step == FULL_AT:  # every sink opened and holds steps 1-60 (MLflow's child starts late on a busy host)
                run.monitor.flush()
                assert run.monitor.dispatcher.flush(timeout=60)
                filler = fill(disk)
            if step == free_at:
                wait_until_said(caplog, said)
                os.remove(filler)
                filler = None
            time.sleep(0.003)
    if filler:
        os.remove(filler)
    with open(os.path.join(run.run_dir, "run.json"), encoding="utf-8") as fh:
        return run, json.load(fh)["outcome"]


def mlflow_steps(disk):
    """The steps of ``train/loss`` in the experiment's MLflow run (``MlflowClient`` on its sqlite store)."""
    from helpers.mlflow_reads import only_run, steps
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{disk / 'full' / 'mlflow.db'}")
    return steps(client, only_run(client, "full").info.run_id)


def tensorboard_steps(disk):
    acc = EventAccumulator(str(disk / "full" / "tensorboard" / "r" / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars("train/loss")] if "train/loss" in acc.Tags()["scalars"] else []


def tensorboard_gaps(disk):
    acc = EventAccumulator(str(disk / "full" / "tensorboard" / "r" / "rank_0"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("events/gap")] \
        if "events/gap" in acc.Tags()["tensors"] else []
    return [json.loads(text.split("`")[1]) for text in texts]


def mindinsight_points(disk, tag="1_train/loss"):
    """``[(step, value)]`` of ``tag`` in every summary file of the rank, in file order (MindSpore's protobuf)."""
    from mindspore.train.summary_pb2 import Event as SummaryEvent
    from msbridge.adapters._eventwire import read_records

    out = []
    for path in sorted(glob.glob(str(disk / "full" / "summary" / "r_rank_0" / "*_MS"))):
        for body in read_records(path):
            event = SummaryEvent.FromString(body)
            out += [(event.step, v.scalar_value) for v in event.summary.value if v.tag == tag]
    return out


def jsonl_steps(run_dir):
    log = read_run(run_dir).ranks[0]
    return [s for s, _ in log.series("train/loss")], [dict(e.detail) for e in log.events if e.kind == "gap"]


def lost_ranges(text):
    """``[(first, last, records)]`` that a sink's "not delivered" line names."""
    return [tuple(map(int, m)) for m in re.findall(r"steps (\d+)-(\d+) \((\d+) record", text)]


def outcome_gaps(outcome):
    """sink -> the gap events' ``(first_step, last_step, records)`` in run.json's anomalies."""
    out = {}
    for detail in re.findall(r"gap (\{.*?\})(?:; step |$)", outcome["anomalies"]):
        gap = ast.literal_eval(detail)
        out.setdefault(gap["sink"], []).append((gap["first_step"], gap["last_step"], gap["records"]))
    return out


def assert_waited(caplog):
    """Both trackers really met the full disk (said once) and wrote again once space was back."""
    said = [r.getMessage() for r in caplog.records if r.name == "msbridge"]
    for sink in ("tensorboard", "mindinsight"):
        assert sum(m.startswith(f"msbridge: {sink}: cannot write") for m in said) == 1, (sink, said)
        assert any(m.startswith(f"msbridge: {sink}: ") and "is writable again" in m for m in said), sink


def test_freed_during_training_every_step_reaches_every_sink(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="msbridge")
    with small_tmpfs(tmp_path / "disk", size="4m") as disk:
        run, outcome = train(disk, FREE_AT, caplog)
        steps, gaps = jsonl_steps(run.run_dir)
        assert steps == ALL and gaps == []
        tb = tensorboard_steps(disk)
        assert tb == ALL, (len(tb), sorted(set(ALL) - set(tb))[:10])  # each once, in order: none lost or doubled
        assert mlflow_steps(disk) == ALL
        assert len(glob.glob(str(disk / "full" / "tensorboard" / "r" / "rank_0" / "events.*"))) >= 2  # a fresh file
        mi = mindinsight_points(disk)
        assert [s for s, _ in mi] == ALL, len(mi)
        assert all(abs(v - 1.0 / s) < 1e-6 * (1.0 / s) for s, v in mi)
        assert outcome["status"] == FINISHED and outcome["not delivered"] == "none", outcome["not delivered"]
        assert run.outcome.exit_code == 0
        assert_waited(caplog)
        assert not os.path.exists(os.path.join(run.run_dir, ".outcome-reserve"))


def test_never_freed_the_outcome_names_every_lost_range_exactly(tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO)
    with small_tmpfs(tmp_path / "disk", size="4m") as disk:
        run, outcome = train(disk, None)
        said = capsys.readouterr()
        for text in (said.out, said.err, caplog.text, json.dumps(outcome)):
            assert "the other sinks received them" not in text  # false: none holds steps 81-600
        held = {"jsonl": jsonl_steps(run.run_dir)[0], "mlflow": mlflow_steps(disk),
                "tensorboard": tensorboard_steps(disk),
                "mindinsight": [s for s, _ in mindinsight_points(disk)]}
        missed, gaps = outcome["not delivered"], outcome_gaps(outcome)
        assert sorted(missed) == sorted(SINKS) and run.outcome.exit_code == 3
        with open(os.path.join(run.run_dir, "README.md"), encoding="utf-8") as fh:
            readme = fh.read()
        assert "- status: FINISHED" in readme and all(missed[sink] in readme for sink in SINKS)
        for sink in SINKS:
            steps = held[sink]
            assert steps and steps == list(range(1, len(steps) + 1)), sink  # coverage: a prefix, each once
            lost = (len(steps) + 1, STEPS, STEPS - len(steps))
            if sink == "jsonl":
                assert f"{lost[2]} record(s) and 0 event(s) of steps {lost[0]}-{lost[1]} lost" in missed[sink]
            elif sink == "mlflow":  # the store on the full disk answers reads: what it holds is read back
                assert lost_ranges(missed[sink]) == [lost], (sink, missed[sink])
                assert f"read back, the store holds steps up to {len(steps)})" in missed[sink], missed[sink]
            else:  # the batch that met the full disk waited and is lost; the later ones stayed in jsonl, unread
                (first, last, records), = lost_ranges(missed[sink])
                lost = (first, last, records)
                assert first == len(steps) + 1 and records == last - first + 1 and last < STEPS, (sink, missed[sink])
                assert (f"behind from step {last + 1}: it read the write-ahead log up to step {last} of {STEPS}"
                        in missed[sink]), missed[sink]
            if sink != "jsonl":
                assert f"status FINISHED not {'delivered' if sink == 'mlflow' else 'written'}" in missed[sink]
            assert gaps.get(sink) == (None if sink == "mlflow" else [lost]), (sink, gaps)


def test_past_the_bound_the_oldest_are_one_gap_in_every_sink(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_diskwait, "MAX_WAITING_EVENTS", 5)  # under the 10 steps of the batch that meets the disk
    caplog.set_level(logging.WARNING, logger="msbridge")
    with small_tmpfs(tmp_path / "disk", size="4m") as disk:
        run, outcome = train(disk, FREE_AT, caplog, said="more than 5 events")
        tb, mi = tensorboard_steps(disk), [s for s, _ in mindinsight_points(disk)]
        jsonl, jsonl_gaps = jsonl_steps(run.run_dir)
        assert jsonl == ALL  # jsonl holds 4096 lines: it lost nothing
        for sink, steps in (("tensorboard", tb), ("mindinsight", mi)):
            assert steps == sorted(set(steps)) and steps[-1] == STEPS, sink  # each once, to the end
            missing = sorted(set(ALL) - set(steps))
            assert missing and missing == list(range(missing[0], missing[-1] + 1)), (sink, missing)
            lost = (missing[0], missing[-1], len(missing))
            assert lost_ranges(outcome["not delivered"][sink]) == [lost], outcome["not delivered"][sink]
            assert outcome_gaps(outcome)[sink] == [lost]
            assert [(g["first_step"], g["last_step"], g["records"]) for g in jsonl_gaps if g["sink"] == sink] \
                == [lost], jsonl_gaps  # the other sinks hold it too
            if sink == "mindinsight":  # a hole a replay cannot fill (MindInsight drops points that go back a step)
                assert f"steps {lost[0]}-{lost[1]} stay missing after a replay too" in outcome["not delivered"][sink]
        every_gap = sorted((s, g) for s, gaps in outcome_gaps(outcome).items() for g in gaps)
        assert sorted((g["sink"], (g["first_step"], g["last_step"], g["records"])) for g in tensorboard_gaps(disk)) \
            == every_gap  # both sinks' gaps in each, once: a gap reaches the other trackers through the log
        in_mindinsight = Counter()  # two gaps in one batch are one point of 2
        for step, count in mindinsight_points(disk, "events/gap"):
            in_mindinsight[step] += int(count)
        assert in_mindinsight == Counter(g[1] for _, g in every_gap)
        assert run.outcome.exit_code == 3


class FullBetween(Callback):
    """Fills the disk of ``folder`` after step ``full_at`` and frees it after step ``free_at``."""

    def __init__(self, folder, full_at, free_at, caplog):
        super().__init__()
        self.folder, self.full_at, self.free_at, self.path = folder, full_at, free_at, None
        self.caplog = caplog

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if step == self.full_at:
            self.path = fill(self.folder)
        elif step == self.free_at:
            wait_until_said(self.caplog)
            os.remove(self.path)


def test_freed_during_model_train_every_step_reaches_every_sink(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="msbridge")
    steps = list(range(1, 401))
    with small_tmpfs(tmp_path / "disk", size="4m") as disk:
        monitor = BridgeMonitor({"experiment": "full", "run_name": "r", "experiment_dir": str(disk / "full"),
                                 "flush_steps": 10, "sinks": SINK_CONFIG}, progress=False)
        train_regression([monitor, FullBetween(disk, FULL_AT, FREE_AT, caplog)], steps=len(steps))
        assert jsonl_steps(monitor.run_dir) == (steps, [])
        assert tensorboard_steps(disk) == steps and mlflow_steps(disk) == steps
        assert [s for s, _ in mindinsight_points(disk)] == steps
        with open(os.path.join(monitor.run_dir, "run.json"), encoding="utf-8") as fh:
            outcome = json.load(fh)["outcome"]
        assert outcome["status"] == FINISHED and outcome["not delivered"] == "none"
        assert monitor.outcome.exit_code == 0
        assert_waited(caplog)


@pytest.fixture(autouse=True)
def _tell_afresh(monkeypatch):
    from msbridge.run import metadata

    monkeypatch.setattr(metadata, "_told", set())

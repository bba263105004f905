"""Issue 49's must-holds for a tracker that falls behind and reads the write-ahead log from a cursor of its own
(``msbridge/sinks/host.py``; the rules in docs/how-it-works.md), each on a real training job and read back with
the tracker's own reader, its step coverage checked first:

- a kill -9 of the job while MLflow catches up from the log after a freeze (SIGSTOP of a real ``mlflow server``),
  then the job resumed: MLflow goes on from what its store holds, and every step is in MLflow and TensorBoard once;
- MLflow handed batches of 100 records while frozen, past max_pending=20: every step in it before the close;
- a plug-in sink whose ``write`` blocks for 60 s once: every step reaches it before the close, with no replay, and
  training's steps take no longer meanwhile; jsonl holds every step;
- TensorBoard's logdir on a real full disk (a tmpfs) that is freed later: every step in its files at the close;
- msbridge's memory while a PostgreSQL ``mlflow server`` is frozen for 60 s (``msbridge.bench.freeze``; the
  10-minute figures are in docs/how-it-works.md).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest
from helpers.disk import fill, small_tmpfs
from helpers.postgres import postgres  # noqa: F401  (a fixture)
from helpers.training import train_regression
from mindspore.train import Callback

from msbridge import BridgeMonitor, Sink
from msbridge.sinks.base import FINISHED
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test here takes a minute or more

mlflow_tracking = pytest.importorskip("mlflow.tracking", reason="pip install 'msbridge[mlflow]'")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                        reason="pip install 'msbridge[tensorboard]'")

from helpers.mlflow_reads import assert_same_series, only_run, steps  # noqa: E402  (imports mlflow)
from msbridge.bench.freeze import measure, mlflow_last_step  # noqa: E402
from msbridge.bench.servers import MlflowServer  # noqa: E402

from cursor_job import EXPERIMENT, RUN_NAME  # noqa: E402  (tests/faults: the job this module starts)

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cursor_job.py")


def wait_until(condition, what, timeout=300.0, every=0.2):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(every)


def tensorboard_steps(folder):
    """Each scalar tag's steps in ``folder``, read with TensorBoard's EventAccumulator."""
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"] if not tag.startswith("hparams/")}


def assert_every_step_once_in_tensorboard(logdir, run_dir, total):
    """TensorBoard's run folder and its rank folder hold each step the jsonl has for each tag, once."""
    log = read_run(run_dir).ranks[0]
    assert [s for s, _ in log.series("train/loss")] == list(range(1, total + 1)), "jsonl: every step, once"
    for folder in (logdir / RUN_NAME / "rank_0", logdir / RUN_NAME):
        held = tensorboard_steps(folder)
        assert held, folder
        for tag, got in held.items():  # a per-window metric is sparse: the jsonl's steps for it
            want = [s for s, _ in log.series(tag)]
            assert len(got) == len(set(got)), (folder, tag, "a step twice")
            assert sorted(got) == want, (folder, tag, len(got), len(want))


class Job:
    """``cursor_job.py`` in a process group of its own; its stdout read on a thread: the last ``step`` and ``epoch``
    it printed, and its closing JSON line (``result``)."""

    def __init__(self, out, uri, steps_per_epoch, epochs, initial_epoch=None):
        resume = [] if initial_epoch is None else [str(initial_epoch)]
        command = [sys.executable, JOB, str(out), uri, str(steps_per_epoch), str(epochs), *resume]
        self.err_path = os.path.join(out, f"job-{initial_epoch}.err")
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(command, cwd=out, stdout=subprocess.PIPE, stderr=err, text=True,
                                         start_new_session=True, env=dict(os.environ, GLOG_v="3"))
        self.step = self.epoch = 0
        self.result = None
        threading.Thread(target=self._read, daemon=True).start()

    def stderr(self):
        with open(self.err_path, errors="replace") as fh:
            return fh.read()

    def _read(self):
        for line in self.proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "step":
                self.step = int(rest)
            elif word == "epoch":
                self.epoch = int(rest)
            elif word.startswith("{"):
                self.result = json.loads(line)

    def kill9(self):
        """SIGKILL the job's whole group at once (as a scheduler or the OOM killer ends it): no close runs."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def wait(self, timeout=600):
        assert self.proc.wait(timeout) == 0, self.stderr()[-3000:]
        wait_until(lambda: self.result is not None, "the job's closing line", timeout=10)
        return self.result


def log_last_step(run_dir):
    return max((r.step for r in read_run(run_dir).ranks[0].records), default=0)


STEPS_PER_EPOCH, EPOCHS = 3000, 6  # 18,000 steps: the job still trains when it is killed
FROZEN_STEPS = 2500  # past max_pending; the kill lands mid catch-up (asserted)


def test_kill_9_while_mlflow_catches_up_then_resumed_holds_every_step_once(tmp_path):
    """Frozen while the job trains 2,500 steps, past max_pending=1,000, MLflow reads them from jsonl once thawed; the
    job is killed (SIGKILL of its group) when MLflow has read some of them, then resumed from the last epoch its log
    holds whole (as from a checkpoint): MLflow goes on from the step its store holds, and every step is in MLflow and in
    TensorBoard exactly once at the close, with no replay."""
    total = STEPS_PER_EPOCH * EPOCHS
    with MlflowServer(str(tmp_path / "server")) as server:
        client = mlflow_tracking.MlflowClient(server.uri)
        job = Job(tmp_path, server.uri, STEPS_PER_EPOCH, EPOCHS)
        wait_until(lambda: mlflow_last_step(client, EXPERIMENT) > 0, "MLflow holds the first steps", every=0.05)
        os.killpg(server.proc.pid, signal.SIGSTOP)  # the whole group: mlflow server, its workers
        try:
            frozen_at = job.step
            wait_until(lambda: job.step >= frozen_at + FROZEN_STEPS, "steps trained while MLflow is frozen")
        finally:
            os.killpg(server.proc.pid, signal.SIGCONT)
        thawed_at = job.step
        wait_until(lambda: mlflow_last_step(client, EXPERIMENT) > frozen_at + 200, "MLflow reads the log",
                   every=0.05)
        job.kill9()
        run_dir = tmp_path / EXPERIMENT / RUN_NAME
        held, logged = mlflow_last_step(client, EXPERIMENT), log_last_step(str(run_dir))
        assert held < min(logged, thawed_at), f"killed while catching up: MLflow held {held} of {logged} steps"
        # A kill just after an epoch's end can take the log's last window: such a resume names them lost (test_rerun).
        epoch = min(job.epoch, logged // STEPS_PER_EPOCH)
        assert epoch < EPOCHS, (job.epoch, logged)

        resumed = Job(tmp_path, server.uri, STEPS_PER_EPOCH, EPOCHS, initial_epoch=epoch)
        result = resumed.wait()
        assert result["status"] == FINISHED and result["undelivered"] == {}, (result, resumed.stderr()[-3000:])
        assert result["run_dir"] == str(run_dir)
        mlrun = only_run(client, EXPERIMENT)  # the resumed job reattached to the killed job's run
        assert steps(client, mlrun.info.run_id) == list(range(1, total + 1)), "coverage first: every step, once"
        assert_same_series(client, mlrun.info.run_id, str(run_dir))  # every metric: same steps, same values
        assert mlrun.info.status == FINISHED
    assert_every_step_once_in_tensorboard(tmp_path / EXPERIMENT / "tensorboard", str(run_dir), total)


def test_batches_larger_than_max_pending_on_a_frozen_server_reach_mlflow_once_thawed(tmp_path):
    """A frozen server (SIGSTOP) handed batches of 100 records, as a flush window of 100 steps makes them, past
    max_pending=20: every step is in MLflow before the close, with no replay. The first batch after the freeze
    must not be cut to max_pending (its oldest records are in jsonl, and the cursor reads on past them)."""
    from helpers.runs import make_records, make_run

    from msbridge.adapters.jsonl_sink import JsonlSink
    from msbridge.adapters.mlflow_sink import MlflowSink
    from msbridge.sinks.dispatch import Dispatcher

    with MlflowServer(str(tmp_path / "server")) as server:
        sink = MlflowSink(tracking_uri=server.uri, max_pending=20, http_timeout=1, backoff_initial=0.2,
                          backoff_max=1.0, close_timeout=60)
        d = Dispatcher([JsonlSink(), sink], make_run(tmp_path, experiment="windows"), tracker_batches=4)
        d.submit(make_records(range(1, 101)))
        assert d.flush(timeout=120), "MLflow reached before the freeze"
        os.killpg(server.proc.pid, signal.SIGSTOP)
        try:
            for first in range(101, 1101, 100):
                d.submit(make_records(range(first, first + 100)))
                time.sleep(0.5)
        finally:
            os.killpg(server.proc.pid, signal.SIGCONT)
        assert d.flush(timeout=120), "caught up from jsonl once thawed, before the close"
        d.close(FINISHED)
        client = mlflow_tracking.MlflowClient(server.uri)
        mlrun = only_run(client, "windows")
        held = steps(client, mlrun.info.run_id)
        lacks = sorted(set(range(1, 1101)) - set(held))
        assert held == list(range(1, 1101)), f"lacks {len(lacks)} steps from {lacks[:1]}; {d.undelivered}"
        assert d.undelivered == {} and mlrun.info.status == FINISHED


BLOCK_S = 60.0


class BlockOnce(Sink):
    """A plug-in sink (default options and bounds) whose ``write`` blocks for ``BLOCK_S`` once, at its first batch
    past step 200, and keeps each step it is handed; ``at_close``: the steps it held when its close began."""

    name = "block_once"

    def __init__(self):
        super().__init__()
        self.steps, self.at_close, self.blocked = [], None, None

    def write(self, records, events):
        if self.blocked is None and records and records[-1].step > 200:
            start = time.monotonic()
            time.sleep(BLOCK_S)
            self.blocked = (start, time.monotonic())
        self.steps.extend(r.step for r in records)

    def close(self, status=FINISHED):
        self.at_close = list(self.steps)


class Clock(Callback):
    """Each step's end time (``time.monotonic``); with ``pace``, each step takes that many seconds more."""

    def __init__(self, pace=0.0):
        super().__init__()
        self.pace, self.ends = pace, []

    def on_train_step_end(self, run_context):
        time.sleep(self.pace)
        self.ends.append(time.monotonic())


def test_a_plug_in_whose_write_blocks_60_s_once_gets_every_step_before_the_close(tmp_path):
    steps_total = 4500  # 20 ms a step: training goes on for a while after the block
    sink, clock = BlockOnce(), Clock(pace=0.02)
    monitor = BridgeMonitor({"experiment": "block", "run_name": RUN_NAME, "output_dir": str(tmp_path / "{run_name}"),
                             "sinks": {"jsonl": {}}}, sinks=[sink], progress=False)
    train_regression([clock, monitor], steps=steps_total)

    assert sink.blocked is not None and sink.blocked[1] - sink.blocked[0] >= BLOCK_S
    assert sink.blocked[1] < clock.ends[-1] - 5, "the block ended while training still ran"
    log = read_run(monitor.run_dir).ranks[0]
    assert [s for s, _ in log.series("train/loss")] == list(range(1, steps_total + 1)), "jsonl: every step, once"
    assert sink.at_close == list(range(1, steps_total + 1)), "every step, once, in order, before its close"
    assert monitor.outcome.status == FINISHED and monitor.outcome.undelivered == {}, "no replay named"
    times = [b - a for a, b in zip(clock.ends[10:], clock.ends[11:])]  # after the compile
    during = [t for t, end in zip(times, clock.ends[11:]) if sink.blocked[0] + 1 < end < sink.blocked[1] - 1]
    outside = [t for t, end in zip(times, clock.ends[11:]) if not sink.blocked[0] < end < sink.blocked[1]]
    assert len(during) > 1000, len(during)
    assert statistics.median(during) <= 1.5 * statistics.median(outside) + 0.002, (
        statistics.median(during), statistics.median(outside))


class FullDisk(Callback):
    """Fills the file system of ``folder`` to the last byte after step ``full_at``, frees it after ``free_at``."""

    def __init__(self, folder, full_at, free_at):
        super().__init__()
        self.folder, self.full_at, self.free_at, self.filler = folder, full_at, free_at, None

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        if step == self.full_at:
            self.filler = fill(self.folder)
        elif step == self.free_at:
            os.remove(self.filler)


def test_tensorboard_on_a_full_disk_freed_later_holds_every_step_at_the_close(tmp_path, caplog):
    """Full for 2,900 steps (5,800 event records: past what TensorBoard's sink keeps waiting in memory), then
    freed: every step is in TensorBoard's files at the close, read with TensorBoard's reader, with no replay."""
    steps_total = 3500
    caplog.set_level(logging.WARNING, logger="msbridge")
    with small_tmpfs(tmp_path / "tb", size="16m") as disk:
        monitor = BridgeMonitor({"experiment": "full", "run_name": RUN_NAME,
                                 "output_dir": str(tmp_path / "runs" / "{run_name}"),
                                 "sinks": {"jsonl": {}, "tensorboard": {"logdir": str(disk)}}}, progress=False)
        train_regression([FullDisk(disk, full_at=100, free_at=3000), monitor], steps=steps_total)
        said = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
        assert said and str(disk) in said[0], "the disk was full: TensorBoard said so"
        assert_every_step_once_in_tensorboard(disk, monitor.run_dir, steps_total)
        assert monitor.outcome.status == FINISHED and monitor.outcome.undelivered == {}, monitor.outcome.undelivered


def test_rss_while_a_postgresql_mlflow_server_is_frozen_60_s(postgres, tmp_path):  # noqa: F811
    """``msbridge.bench.freeze`` for 60 s (the bench runs 10 minutes): the job's RSS, its MLflow client process
    included, stays within 50 MB of what it was before the freeze; MLflow (max_pending=300: the freeze passes it)
    holds every step, once, before the close."""
    figures = measure(postgres.create_database("freeze_rss"), str(tmp_path / "freeze"), freeze_s=60.0,
                      before_s=10.0, max_pending=300)
    assert figures["status"] == FINISHED and figures["undelivered"] == {}, figures
    assert figures["steps_at_thaw"] - figures["steps_at_freeze"] > 300 + 200, figures  # past max_pending
    assert figures["mlflow_steps"] == figures["jsonl_steps"] == figures["steps"], figures  # coverage first
    assert figures["mlflow_steps_each_once"] and figures["mlflow_status"] == FINISHED, figures
    assert figures["rss_growth_mb"] < 50, figures

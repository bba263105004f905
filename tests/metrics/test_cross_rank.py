"""Data-parallel training on CPU under msrun: global loss, spread, outlier, one MLflow run, per-rank files,
and ranks that leave or crash. Every msrun call and every wait has a timeout."""
from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List

import numpy as np
import pytest
from helpers.msrun_job import Job

from msbridge import BridgeMonitor, ConfigError
from msbridge.capture.collective import Watchdog
from msbridge.metrics.cross_rank import cross_rank_metrics, make_reducer
from msbridge.names import GLOBAL_LOSS, LOSS, LOSS_MAX, LOSS_MIN, LOSS_STD, OUTLIER_RANK, is_global_metric, rank_loss
from msbridge.run.rank_sync import agree_timestamp
from msbridge.run.ranks import Ranks, detect_ranks, release_rank_file
from msbridge.sinks.base import RunInfo
from msbridge.sinks.runlog import RankLog


def losses(log: RankLog) -> Dict[int, float]:
    return dict(log.series(LOSS))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Job:
    """2 ranks, jsonl + MLflow; rank 1's labels are scaled (harder data) and it starts its monitor late."""
    job = Job(tmp_path_factory.mktemp("two"), 2, "--steps", "20", "--flush", "5", "--sinks", "jsonl,mlflow",
              "--hard-rank", "1", "--late-rank", "1")
    assert job.proc.returncode == 0, job.logs()
    return job


@pytest.mark.slow
def test_every_rank_writes_its_own_file_with_only_its_own_records(two_ranks):
    logs = two_ranks.rank_logs()
    assert sorted(logs) == [0, 1]
    for rank, log in logs.items():
        assert log.header["rank"] == rank and log.header["world_size"] == 2
        assert {r.rank for r in log.records} == {rank}, f"rank {rank}'s file holds another rank's records"
        assert [r.step for r in log.records] == list(range(1, 21))
    assert not [n for n in logs[1].metric_names() if is_global_metric(n)], "only rank 0 writes global metrics"
    assert logs[0].header["run_name"] == logs[1].header["run_name"], "rank 1 started late but shares rank 0's name"


@pytest.mark.slow
def test_global_loss_is_the_mean_of_the_ranks_losses_at_every_step(two_ranks):
    logs = two_ranks.rank_logs()
    local = {rank: losses(log) for rank, log in logs.items()}
    by_step = {r.step: r.values for r in logs[0].records}
    for step in range(1, 21):
        pair = [local[0][step], local[1][step]]
        values = by_step[step]
        assert values[GLOBAL_LOSS] == pytest.approx(np.mean(pair), rel=1e-6), f"step {step}"
        assert values[rank_loss(0)] == pytest.approx(pair[0], rel=1e-6)
        assert values[rank_loss(1)] == pytest.approx(pair[1], rel=1e-6)
        assert (values[LOSS_MIN], values[LOSS_MAX]) == pytest.approx((min(pair), max(pair)), rel=1e-6)
        assert values[LOSS_STD] == pytest.approx(np.std(pair), rel=1e-5)


@pytest.mark.slow
def test_the_rank_with_harder_data_is_named_the_outlier(two_ranks):
    outliers = {v for _, v in two_ranks.rank_logs()[0].series(OUTLIER_RANK)}
    assert outliers == {1.0}


@pytest.mark.slow
def test_exactly_one_mlflow_run_holds_the_global_curves(two_ranks):
    from mlflow.tracking import MlflowClient

    runs = two_ranks.mlflow_runs()
    assert len(runs) == 1, f"one MLflow run per job, found {len(runs)}"
    run = runs[0]
    assert run.info.status == "FINISHED"
    client = MlflowClient(tracking_uri=f"sqlite:///{two_ranks.root / 'runs' / 'dist' / 'mlflow.db'}")
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, GLOBAL_LOSS)}
    expected = dict(two_ranks.rank_logs()[0].series(GLOBAL_LOSS))
    assert sorted(history) == list(range(1, 21))
    np.testing.assert_allclose([history[s] for s in expected], list(expected.values()), rtol=1e-6)
    assert {rank_loss(0), rank_loss(1)} <= set(run.data.metrics)


@pytest.mark.slow
def test_four_ranks_group_and_batch_weighted_mean(tmp_path):
    """Rank 1 has twice the batch, rank 2 harder data, rank 3 is left out of the reduction group;
    every rank also checks that a contradicting RANK_ID is refused."""
    job = Job(tmp_path, 4, "--steps", "12", "--flush", "4", "--batches", "8,16,8,8", "--hard-rank", "2",
              "--reduce-ranks", "0,1,2", "--check-ranks")
    assert job.proc.returncode == 0, job.logs()
    for rank in range(4):  # a RANK_ID that contradicts the communication group is refused on every rank
        said = (tmp_path / "runs" / f"rank_check_{rank}.txt").read_text()
        assert said.startswith(f"ConfigError: mindspore.communication says rank {rank}, but the environment has "
                               f"RANK_ID={(rank + 1) % 4}"), said
    logs = job.rank_logs()
    assert sorted(logs) == [0, 1, 2, 3]
    local = {rank: losses(log) for rank, log in logs.items()}
    weights = np.array([8.0, 16.0, 8.0])
    for rec in logs[0].records:
        group = np.array([local[r][rec.step] for r in (0, 1, 2)])
        assert rec.values[GLOBAL_LOSS] == pytest.approx(float(group @ weights / weights.sum()), rel=1e-6)
        assert rec.values[OUTLIER_RANK] == 2.0
        assert rank_loss(3) not in rec.values, "a rank outside reduce_ranks is not part of the global metrics"
    assert all(len(log.records) == 12 and {r.rank for r in log.records} == {rank} for rank, log in logs.items())


@pytest.mark.slow
def test_a_rank_that_leaves_at_a_flush_fails_the_run_through_the_watchdog(tmp_path):
    """Rank 1 exits (status 0) at step 10, before its flush: rank 0 waits in the step-10 collective until
    the watchdog (2 s) keeps its window, writes the event and closes every sink FAILED."""
    job = Job(tmp_path, 2, "--steps", "20", "--flush", "5", "--sinks", "jsonl,mlflow", "--timeout", "2",
              "--exit-rank", "1", "--exit-step", "10", "--exit-code", "0", node_timeout_s=10)
    assert job.proc.returncode != 0, "the job must fail, not hang or pass"
    logs = job.rank_logs()
    assert [r.step for r in logs[0].records] == list(range(1, 11)), job.logs()
    assert [r.step for r in logs[1].records] == list(range(1, 6)), "rank 1 left before its step-10 flush"
    timeouts = [e for e in logs[0].events if e.kind == "collective_timeout"]
    assert len(timeouts) == 1 and (timeouts[0].detail["first_step"], timeouts[0].detail["last_step"]) == (6, 10)
    runs = job.mlflow_runs()
    assert len(runs) == 1 and runs[0].info.status == "FAILED"


@pytest.mark.slow
def test_a_crashed_rank_leaves_the_others_logs_flushed(tmp_path):
    """Rank 1 crashes (status 1) at step 12: msrun kills rank 0 at once (SIGKILL, nothing of it runs), so
    rank 0's log ends at its last flush, step 10; msrun itself ends, nothing hangs."""
    job = Job(tmp_path, 2, "--steps", "20", "--flush", "5", "--exit-rank", "1", "--exit-step", "12", node_timeout_s=5)
    assert job.proc.returncode != 0
    logs = job.rank_logs()
    assert [r.step for r in logs[0].records] == list(range(1, 11)), job.logs()
    assert [r.step for r in logs[1].records] == list(range(1, 11))


# -- single process: the parts that need no second rank ----------------------------------------------------------

def test_a_rank_outside_the_world_size_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK_ID", "2")
    monkeypatch.setenv("RANK_SIZE", "2")
    with pytest.raises(ConfigError, match="rank 2 is outside world size 2"):
        BridgeMonitor({"output_dir": str(tmp_path / "run")}, progress=False)
    assert detect_ranks({"RANK_ID": "1", "RANK_SIZE": "2"}) == Ranks(1, 2, "env")
    with pytest.raises(ConfigError, match="RANK_ID='x' is not an integer"):
        detect_ranks({"RANK_ID": "x"})


def hold_rank_file(run_dir: str) -> subprocess.Popen:
    """Another live process that claims rank 0's files of ``run_dir`` and keeps them until killed."""
    code = ("import sys; from msbridge.run.ranks import claim_rank_file; claim_rank_file(sys.argv[1], 0); "
            "print('held', flush=True); sys.stdin.read()")
    return subprocess.Popen([sys.executable, "-c", code, run_dir], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def test_a_second_live_process_on_one_rank_file_is_refused_a_dead_one_is_not(tmp_path):
    run_dir = str(tmp_path / "run")
    holder = hold_rank_file(run_dir)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid} on host {socket.gethostname()}"):
            BridgeMonitor({"output_dir": run_dir}, progress=False)
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the kernel drops the lock
        holder.wait(timeout=30)
    assert BridgeMonitor({"output_dir": run_dir}, progress=False).run_dir == run_dir

    release_rank_file(run_dir, 0)  # the end of this process's run: the next job may take the files
    holder = hold_rank_file(run_dir)
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_cross_rank_metrics_definitions():
    losses = np.array([[1.0, 2.0, np.nan], [3.0, 2.0, 4.0], [8.0, 2.0, 6.0]])
    out = cross_rank_metrics(losses, np.array([1.0, 1.0, 2.0]), [0, 2, 5])
    np.testing.assert_allclose(out[GLOBAL_LOSS], [(1 + 3 + 16) / 4, 2.0, np.nan])  # NaN on one rank: NaN
    np.testing.assert_allclose(out[LOSS_MIN], [1.0, 2.0, 4.0])
    np.testing.assert_allclose(out[LOSS_MAX], [8.0, 2.0, 6.0])
    np.testing.assert_allclose(out[LOSS_STD], [np.std([1, 3, 8]), 0.0, 1.0])
    np.testing.assert_allclose(out[rank_loss(5)], losses[2])
    assert set(out[OUTLIER_RANK]) == {5.0}, "the rank furthest from the mean in std units, over the window"

    two = cross_rank_metrics(np.array([[1.0, 1.5], [4.0, 0.5]]), np.ones(2), [0, 1])
    assert set(two[OUTLIER_RANK]) == {1.0}, "2 ranks always tie: the higher mean loss is named"
    same = cross_rank_metrics(np.array([[1.0], [1.0]]), np.ones(2), [0, 1])
    assert np.isnan(same[OUTLIER_RANK]).all() and same[LOSS_STD][0] == 0.0


def test_watchdog_calls_the_hook_while_a_call_is_stuck_and_logs_the_late_return(caplog):
    called: List[object] = []
    dog = Watchdog(0.2, called.append)
    release = threading.Event()
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        with dog.guard("the reduction for steps 6-10", "window"):
            assert release.wait(0.1) is False  # a call that returns in time
        assert called == []
        with dog.guard("the reduction for steps 6-10", "window"):
            deadline = time.monotonic() + 10
            while not called and time.monotonic() < deadline:
                release.wait(0.05)
    assert called == ["window"]
    assert "steps 6-10 has not returned after 0 s" in caplog.text and "returned after" in caplog.text


def test_timestamp_from_env_else_local_with_one_warning(monkeypatch, caplog):
    monkeypatch.setenv("MSBRIDGE_TIMESTAMP", "20260101-000000")
    assert agree_timestamp(Ranks(1, 2, "env"), needed=True) == "20260101-000000"
    monkeypatch.delenv("MSBRIDGE_TIMESTAMP")
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        assert agree_timestamp(Ranks(0, 1, "single"), needed=True, now=0) == agree_timestamp(
            Ranks(1, 2, "env"), needed=False, now=0)
        assert not caplog.records
        agree_timestamp(Ranks(1, 2, "env"), needed=True)
    assert len(caplog.records) == 1 and "MSBRIDGE_TIMESTAMP" in caplog.text


def test_a_distributed_world_without_communication_is_a_clear_error():
    run = RunInfo(run_id="x", run_name="r", experiment="e", rank=0, world_size=2, is_global=True, run_dir="/tmp/r")
    with pytest.raises(ConfigError, match=r"communication\.init\(\)"):
        make_reducer(run, batch_size=8, capacity=100)

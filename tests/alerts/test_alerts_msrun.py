"""A real ``msrun`` job whose rank 1 stops calling the collective for a while: each rank's watchdog records a
``stall`` and alerts once, then ``resumed``. Rank 1 sleeps before step 13; rank 0 waits for it inside step 13's
own gradient AllReduce (data parallel), so both were last seen "in a step" after step 12."""
from __future__ import annotations

import pytest
from helpers.msrun_job import Job
from helpers.webhook_server import WebhookServer

pytestmark = pytest.mark.slow


def test_rank_1_that_stops_calling_the_collective_is_a_stall_on_both_ranks(tmp_path):
    with WebhookServer() as server:
        job = Job(tmp_path, 2, "--steps", "24", "--flush", "4", "--stall-rank", "1", "--stall-step", "13",
                  "--stall-s", "12", "--stall-seconds", "4", "--timeout", "60",
                  "--alert-url", server.url("webhook/hook/T"), timeout=240)
        assert job.proc.returncode == 0, job.logs()
        server.wait_for(4, 10)
    logs = job.rank_logs()
    stalls = {rank: [e for e in log.events if e.kind == "stall"] for rank, log in logs.items()}
    assert [len(stalls[r]) for r in (0, 1)] == [1, 1], stalls
    for rank in (0, 1):
        assert stalls[rank][0].detail["doing"] == "in a step" and stalls[rank][0].step == 12, stalls[rank]
        assert stalls[rank][0].detail["seconds_since_step"] >= 4
    assert all(any(e.kind == "resumed" for e in log.events) for log in logs.values())
    sent = [(r.body["rank"], r.body["kind"]) for r in server.received]
    assert sorted(k for k in sent if k[1] == "stall") == [(0, "stall"), (1, "stall")]  # one each, every rank its own
    for rank in (0, 1):
        [alert] = [r for r in server.received if r.body["kind"] == "stall" and r.body["rank"] == rank]
        last_step_end = stalls[rank][0].time - stalls[rank][0].detail["seconds_since_step"]
        assert alert.time - last_step_end < 4 + 10  # within stall_seconds + 10 s of the last step's end


def test_a_nan_that_every_rank_sees_reaches_the_webhook_once_within_5_s_of_its_flush(tmp_path):
    """Rank 1's batch 20 is NaN; the averaged gradients carry it to rank 0, whose loss is NaN from step 21."""
    with WebhookServer() as server:
        job = Job(tmp_path, 2, "--steps", "32", "--flush", "4", "--nan-rank", "1", "--nan-step", "20",
                  "--alert-url", server.url("webhook/hook/T"), timeout=240)
        assert job.proc.returncode == 0, job.logs()
        server.wait_for(1, 10)
    logs = job.rank_logs()
    assert [e.step for e in logs[1].events if e.kind == "anomaly"] == [20]
    assert [e.step for e in logs[0].events if e.kind == "anomaly"] == [21], "rank 0 sees it too"
    [only] = server.received
    assert (only.body["kind"], only.body["step"], only.body["category"]) == ("blame", 20, "nonfinite")
    assert "first on rank 1" in only.body["message"] and only.body["rank"] == 0
    flushed = max(r.time for r in logs[0].records if r.step == 20)  # steps 17-20 flush when step 20 ends
    assert only.time - flushed < 5.0

"""``AlertSink``: run-end alerts, the other sinks' losses, a bounded close, and the next start sending
what an earlier one kept (real HTTP server on 127.0.0.1)."""
from __future__ import annotations

import os
import time

from helpers.webhook_server import WebhookServer
import pytest

from msbridge.alerts.message import alert_for
from msbridge.alerts.outbox import Outbox
from msbridge.alerts.sink import AlertSink
from msbridge.alerts.spec import AlertSpec
from msbridge.sinks.base import Event, RunInfo, Sink


def run_info(tmp_path, rank=0):
    return RunInfo(run_id="id", run_name="r", experiment="e", rank=rank, world_size=1, is_global=rank == 0,
                   run_dir=str(tmp_path))


def spec(url, **more):
    return AlertSpec.parse({"targets": [{"type": "webhook", "url": url}], **more})


class Lossy(Sink):
    name = "tracker"
    lost = ""

    def write(self, records, events):
        pass

    def undelivered(self):
        return self.lost


def test_a_failed_run_and_a_sink_that_gave_up_alert_at_close(tmp_path):
    tracker = Lossy()
    tracker.lost = "30 records and status FAILED"
    with WebhookServer() as server:
        sink = AlertSink(spec(server.url("webhook/x")))
        sink.open(run_info(tmp_path))
        sink.write([], [Event("exception", 12, 0, time.time(), {"type": "RuntimeError", "message": "boom"})])
        sink.observe({tracker.name: tracker.undelivered()})  # what the dispatcher does once the others closed
        sink.close("FAILED")
    bodies = sorted((r.body for r in server.received), key=lambda b: b["category"])
    assert [b["category"] for b in bodies] == ["failed", "undelivered"]
    assert bodies[0]["values"]["status"] == "FAILED" and bodies[0]["values"]["cause"] == "exception"
    assert bodies[0]["step"] == 12 and "tracker: 30 records" in bodies[1]["message"]
    assert sink.undelivered() == ""


def test_a_finished_run_sends_nothing_unless_end_is_asked_for(tmp_path):
    with WebhookServer() as server:
        quiet = AlertSink(spec(server.url("webhook/x")))
        quiet.open(run_info(tmp_path / "a"))
        quiet.close("FINISHED")
        ends = AlertSink(spec(server.url("webhook/x"), on=["end"]))
        ends.open(run_info(tmp_path / "b"))
        ends.close("FINISHED")
    assert [r.body["category"] for r in server.received] == ["end"]


@pytest.mark.slow
def test_the_close_waits_a_bounded_time_and_the_next_start_sends_what_was_kept(tmp_path):
    nan = Event("anomaly", 20, 0, time.time(), {"check": "nonfinite", "nonfinite": ["train/loss"]})
    with WebhookServer(mode="hang", hang_s=30) as server:
        sink = AlertSink(spec(server.url("webhook/x"), timeout_s=20, close_wait_s=1))
        sink.open(run_info(tmp_path))
        sink.write([], [nan])
        start = time.monotonic()
        sink.close("FINISHED")
        assert time.monotonic() - start < 5  # close_wait_s 1, not the request's 20 s timeout
    assert "1 alert(s) kept in" in sink.undelivered()
    box = Outbox(str(tmp_path), 0)
    [kept] = box.entries()
    assert kept["alert"]["step"] == 20 and "url" not in kept
    with WebhookServer() as fixed:
        again = AlertSink(spec(fixed.url("webhook/x")))
        again.open(run_info(tmp_path))  # the run's next start
        assert fixed.wait_for(1, 10)
        again.close("FINISHED")
    assert fixed.received[0].body["step"] == 20 and box.entries() == []
    assert not os.path.exists(box.path)


def test_an_alert_from_rank_1_is_sent_only_when_it_is_its_own_stall(tmp_path):
    with WebhookServer() as server:
        sink = AlertSink(spec(server.url("webhook/x")))
        sink.open(run_info(tmp_path, rank=1))
        sink.write([], [Event("anomaly", 20, 1, 1.0, {"check": "nonfinite"}),
                        Event("stall", 20, 1, 1.0, {"seconds_since_step": 900, "doing": "in the collective"})])
        sink.close("FAILED")  # the job's end is the global rank's to say
    [only] = [r.body for r in server.received]
    assert only["kind"] == "stall" and only["rank"] == 1 and "in the collective" in only["message"]
    assert alert_for(Event("stall", 20, 1, 1.0, {}), "stall", run_info(tmp_path)).title.startswith("msbridge:")

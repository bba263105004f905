"""The alert sender is an observer: with the real Dispatcher and a real webhook receiver on 127.0.0.1, it hears
each other sink's final ``undelivered`` only after that sink closed (or hit its bound), so a tracker that
closes slowly and gives up records is named in exactly one ``undelivered`` alert."""
from __future__ import annotations

import time

from helpers.runs import make_records, make_run
from helpers.webhook_server import WebhookServer
import pytest

from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.alerts.sink import AlertSink
from msbridge.alerts.spec import AlertSpec
from msbridge.options import Option
from msbridge.sinks.base import Sink
from msbridge.sinks.dispatch import Dispatcher

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')


class SlowToGiveUp(Sink):
    """A tracker whose close takes 1 s and only then knows what it could not deliver (as MLflow's close retries
    its last batch before it gives up): a test double for an unreachable tracker, which cannot be made here
    to fail on cue at its close."""

    name = "tracker"
    options = {"close_timeout": Option(float, 3.0, "seconds", low=0, low_open=True)}

    def open(self, run):
        super().open(run)
        self.got, self.lost = 0, ""

    def write(self, records, events):
        self.got += len(records)

    def close(self, status="FINISHED"):
        time.sleep(1.0)
        self.lost = f"{self.got} records and status {status} not delivered (unreachable)"

    def undelivered(self):
        return self.lost


class Slower(SlowToGiveUp):
    name = "tracker_b"

    def close(self, status="FINISHED"):
        time.sleep(2.0)
        self.lost = "status not delivered"


def test_a_tracker_that_closes_slowly_and_gives_up_gives_one_undelivered_alert(tmp_path):
    with WebhookServer() as server:
        spec = AlertSpec.parse({"targets": [{"type": "webhook", "url": server.url("webhook/x")}]})
        alerts = AlertSink(spec)
        d = Dispatcher([JsonlSink(), SlowToGiveUp(), Slower(), alerts], make_run(tmp_path))
        for step in range(1, 6):
            d.submit(make_records([step]))
        d.close("FINISHED")
        assert server.wait_for(1, 10)
        time.sleep(0.5)  # nothing more arrives
    bodies = [r.body for r in server.received]
    assert [b["category"] for b in bodies] == ["undelivered"], bodies
    message = bodies[0]["message"]
    assert "tracker: 5 records and status FINISHED not delivered" in message
    assert "tracker_b: status not delivered" in message
    assert set(d.undelivered) == {"tracker", "tracker_b"}  # the alert was delivered: alerts lacks nothing

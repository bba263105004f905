"""``close_timeout`` is the close's bound: a real MLflow tracker that accepts connections and never answers (a
listening socket nobody serves; MLflow's client waits ``http_timeout`` = 300 s per request) holds the run's
close for ``close_timeout`` + 5 s, not longer, and the run says so: FINISHED, exit code 3, mlflow undelivered
with the replay command, every step in jsonl."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from helpers.disk import assert_covered, parse_lines
from helpers.training import train_regression
from mindspore.train import Callback
import pytest

from msbridge import BridgeMonitor
from msbridge.run.outcome import EXIT_UNDELIVERED
from msbridge.sinks.base import CLOSE_GRACE

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS = 10


class EndClock(Callback):
    """Notes the time at train end: when the close starts (the monitor closes in its ``__exit__``, after every
    callback's ``on_train_end``, so a ModelCheckpoint's last file is seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.at = 0.0

    def on_train_end(self, run_context):
        self.at = time.monotonic()


def test_a_tracker_that_never_answers_holds_the_close_for_close_timeout_plus_grace_only(tmp_path):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes the connections; nothing ever answers them
        mlflow = {"tracking_uri": f"http://127.0.0.1:{silent.getsockname()[1]}", "close_timeout": 1,
                  "http_timeout": 300}
        monitor = BridgeMonitor({"experiment": "e", "run_name": "r", "flush_steps": 5,
                                 "output_dir": str(tmp_path / "runs" / "{experiment}" / "{run_name}"),
                                 "sinks": {"jsonl": {}, "mlflow": mlflow}}, progress=False)
        before = EndClock()
        train_regression([before, monitor], steps=STEPS)
        took = time.monotonic() - before.at
    bound = 1 + CLOSE_GRACE
    assert bound - 0.5 <= took < bound + 60, f"the close took {took:.1f} s; its bound is {bound:g} s (not 120 s)"
    outcome = monitor.outcome
    assert outcome.status == "FINISHED" and outcome.exit_code == EXIT_UNDELIVERED
    assert set(outcome.undelivered) == {"mlflow"}
    assert outcome.undelivered["mlflow"].startswith(f"its close had not finished after {bound:g} s")
    assert outcome.undelivered["mlflow"].endswith("and what it stored is not confirmed"), outcome.undelivered
    run_dir = Path(monitor.run_dir)
    assert assert_covered(parse_lines(run_dir / "metrics" / "rank_0.jsonl"), list(range(1, STEPS + 1))) == []
    missed = json.loads((run_dir / "run.json").read_text())["outcome"]["not delivered"]
    assert missed["mlflow"].endswith(f"fill it: msbridge replay {run_dir} --to mlflow")

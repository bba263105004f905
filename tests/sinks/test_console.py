"""The progress line: every ``print_interval`` steps and the last one, loss, samples/s and ETA; events as they come."""
from __future__ import annotations

import io

import pytest
from helpers.runs import make_records, make_run

from msbridge.errors import ConfigError
from msbridge.sinks.base import Event
from msbridge.sinks.console import ConsoleSink


def test_a_line_every_interval_and_at_the_last_step(tmp_path):
    out = io.StringIO()
    sink = ConsoleSink(print_interval=4, stream=out)
    sink.open(make_run(tmp_path, metadata={"expected_steps": 10}, resumed_from_step=6))
    records = make_records(range(1, 11))
    sink.write(records, [Event("anomaly", 7, 0, 0.0, {"check": "loss_spike"})])
    lines = out.getvalue().splitlines()
    assert [line.split("|")[0].strip() for line in lines[:3]] == \
        ["[msbridge] step  4/10", "[msbridge] step  8/10", "[msbridge] step 10/10"], \
        "progress, not a store: a resumed run's steps are shown again"
    loss, speed = records[7].values["train/loss"], records[7].values["perf/samples_per_s"]
    assert f"loss {loss:.4f}" in lines[1] and f"{speed:.1f} samples/s" in lines[1] and "ETA 0:00:00" in lines[1]
    assert lines[3] == "[msbridge] step 7 rank 0: anomaly {'check': 'loss_spike'}"


def test_print_interval_is_declared_and_checked():
    assert ConsoleSink().print_interval == 20
    with pytest.raises(ConfigError, match="sinks.console.print_interval: expected an integer >= 1, got 0"):
        ConsoleSink(print_interval=0)

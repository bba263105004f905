"""The contract every available sink keeps (``msbridge.testing``), checked with each tracker's own reader.

The sinks come from the registry: every built-in whose packages are installed and every sink an
entry point registers. A new sink is checked here without touching this file.
"""
from __future__ import annotations

import math

import pytest

from msbridge.errors import MissingDependencyError
from msbridge.options import Option
from msbridge.sinks.base import Event, Sink
from msbridge.sinks.registry import available, resolve
from msbridge.testing import CHECKS, ContractError, assert_events, check_sink, contract_records

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)


def installed(name: str):
    try:
        return resolve(name)
    except MissingDependencyError as exc:
        pytest.skip(f"sink {name!r} is not installed here: {exc}")


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", available())
def test_every_available_sink_keeps_the_contract(tmp_path, name, check):
    if (name, check) == ("jsonl", "replay_twice"):
        pytest.skip("replay reads jsonl, never writes it")
    CHECKS[check](installed(name), str(tmp_path))


class ForgetsSteps(Sink):
    """A sink that drops every tenth step: the contract must catch it."""

    name = "forgets"
    options = {"every": Option(int, 10, "drop the steps divisible by this", 1)}

    def open(self, run):
        super().open(run)
        self.stored, self.events = {}, []

    def write(self, records, events):
        for rec in records:
            if rec.step % self.settings["every"]:
                for key, value in rec.values.items():
                    self.stored.setdefault(key, []).append((rec.step, value))
        self.events += [(ev.kind, ev.step) for ev in events]

    def read_back(self, run):
        return dict(self.stored)


def test_the_contract_names_the_check_and_the_difference(tmp_path):
    with pytest.raises(ContractError, match=r"ForgetsSteps \(forgets\) fails records_and_events: 'train/loss': "
                                            r"steps 45 steps 1\.\.49 read back, 50 steps 1\.\.50 handed over"):
        check_sink(ForgetsSteps, str(tmp_path), steps=100)


def test_events_are_compared_by_kind_and_step():
    events = [Event("anomaly", 30, 0), Event("anomaly", 30, 0), Event("gap", 41, 0)]
    assert_events({"events/anomaly": [(30, 2.0)], "events/gap": [(41, 1.0)], "train/loss": [(1, 2.0)]}, events)
    with pytest.raises(ContractError, match=r"events read back \{'events/anomaly': \{30: 1\.0\}\}"):
        assert_events({"events/anomaly": [(30, 1.0)]}, events)


def test_records_are_reproducible_and_finite():
    first, again = contract_records(range(1, 4)), contract_records(range(1, 4))
    assert first == again and all(math.isfinite(v) for r in first for v in r.values.values())

"""``check_sink`` is as strict as production: it drives a sink through ``SinkHost`` with a per-call timeout and
fails, naming the check, on a hang, a raise, a wrong return type, and a replay twice that adds records."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from msbridge.sinks.base import Held, Sink, events_series
from msbridge.testing import ContractError, check_sink


class Lines(Sink):
    """A sink that keeps every record and event as a JSON line of a file in the run dir, and reads it back;
    ``held()`` reads the file, so a replay into it adds nothing. It passes the contract."""

    name = "lines"

    def _path(self, run):
        return os.path.join(run.run_dir, "lines.jsonl")

    def open(self, run):
        super().open(run)
        os.makedirs(run.run_dir, exist_ok=True)
        self._file = open(self._path(run), "a", encoding="utf-8")

    def write(self, records, events):
        for rec in records:
            self._file.write(json.dumps({"step": rec.step, "values": dict(rec.values)}) + "\n")
        for ev in events:
            self._file.write(json.dumps({"step": ev.step, "kind": ev.kind}) + "\n")

    def close(self, status="FINISHED"):
        self._file.close()

    def _lines(self, run):
        if not os.path.exists(self._path(run)):
            return []
        with open(self._path(run), encoding="utf-8") as fh:
            return [json.loads(line) for line in fh]

    def held(self):
        lines = self._lines(self.run)
        steps = [line["step"] for line in lines if "values" in line] + [self.run.resumed_from_step]
        return Held(max(steps), frozenset((line["kind"], line["step"]) for line in lines if "kind" in line))

    def read_back(self, run):
        out = {}
        for line in self._lines(run):
            for name, value in line.get("values", {}).items():
                out.setdefault(name, []).append((line["step"], value))
        return {**out, **events_series((line["kind"], line["step"]) for line in self._lines(run) if "kind" in line)}


RELEASE = threading.Event()


@pytest.fixture(autouse=True)
def release_blocked():
    RELEASE.clear()
    yield
    RELEASE.set()


def test_a_sink_that_keeps_the_contract_passes_every_check(tmp_path):
    assert check_sink(Lines, str(tmp_path), steps=300) == ["records_and_events", "empty_run", "non_finite",
                                                          "resume", "replay_twice", "many_steps"]


@pytest.mark.slow
def test_a_flush_that_blocks_fails_within_the_timeout_naming_the_check(tmp_path):
    class BlocksInFlush(Lines):
        def flush(self):
            RELEASE.wait(120)

    started = time.monotonic()
    with pytest.raises(ContractError, match=r"BlocksInFlush \(lines\) fails records_and_events: flush\(\): did not "
                                            r"return within 1 s"):
        check_sink(BlocksInFlush, str(tmp_path), steps=100, timeout=1.0)
    assert time.monotonic() - started < 10


def test_a_raise_in_write_names_the_check_and_the_error(tmp_path):
    class RaisesInEmit(Lines):
        def write(self, records, events):
            raise OSError("disk gone")

    with pytest.raises(ContractError, match=r"RaisesInEmit \(lines\) fails records_and_events: write\(\): OSError: "
                                            r"disk gone"):
        check_sink(RaisesInEmit, str(tmp_path), steps=100)


@pytest.mark.parametrize("method, returns, said", [
    ("describe", "here", r"describe\(\): WrongType: describe\(\) returned str"),
    ("undelivered", ["3 records"], r"undelivered\(\): WrongType: undelivered\(\) returned list, not str"),
    ("flush", True, r"flush\(\): WrongType: flush\(\) returned bool, not None or a list of Events"),
    ("read_back", [("train/loss", 1.0)], r"read_back\(\): WrongType: read_back\(\) returned list"),
])
def test_a_wrong_return_type_fails_naming_the_call(tmp_path, method, returns, said):
    def wrong(self, *args):
        getattr(Lines, method)(self, *args)
        return returns

    broken = type(f"Wrong_{method}", (Lines,), {method: wrong})
    with pytest.raises(ContractError, match=rf"Wrong_{method} \(lines\) fails records_and_events: {said}"):
        check_sink(broken, str(tmp_path), steps=100)


def test_a_sink_without_held_fails_replay_twice_with_what_it_added(tmp_path):
    class NoHeld(Lines):
        def held(self):
            return Sink.held(self)  # the default: only the resumed step; a replay writes everything again

    with pytest.raises(ContractError, match=r"NoHeld \(lines\) fails replay_twice: after the first replay: "
                                            r"'train/loss': steps 40 steps 1\.\.20 read back, 20 steps 1\.\.20"):
        check_sink(NoHeld, str(tmp_path), steps=100)


@pytest.mark.slow
def test_a_describe_over_its_production_bound_fails_though_the_timeout_is_longer(tmp_path):
    """Production waits 2 s for ``describe`` (``DESCRIBE_BOUND``): a 5 s one fails check_sink in 2 s, as it fails
    a training, though ``timeout`` allows 60 s."""
    class SlowDescribe(Lines):
        def describe(self, run):
            time.sleep(5.0)
            return {"where": run.run_dir}

    started = time.monotonic()
    with pytest.raises(ContractError, match=r"SlowDescribe \(lines\) fails records_and_events: describe\(\): did not "
                                            r"return within 2 s"):
        check_sink(SlowDescribe, str(tmp_path), steps=100, timeout=60.0)
    assert time.monotonic() - started < 5.0

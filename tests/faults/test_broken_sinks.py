"""Eighteen broken sinks beside real trainings (MindSpore ``Model.train`` on CPU and an ``msbridge.track`` loop): each
a different failure (a raise, a wrong return type, a call that blocks, a call that is slow) in a different call.
Training goes on to its last step, jsonl holds every step, the exit code is 3, and run.json's outcome names each
broken sink with its reason and the replay that fills it."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from helpers.training import train_regression

import msbridge
from msbridge import BridgeMonitor
from msbridge.options import Option
from msbridge.sinks.base import Sink
from msbridge.sinks.runlog import read_rank_file

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS = 30
RELEASE = threading.Event()  # lets the blocked sinks' threads go once a test is done


class Broken(Sink):
    """A sink whose every call works (it stores nothing) unless a subclass breaks one. Its bound is
    close_timeout 0.5 s + the 5 s grace: a call over 5.5 s has overrun."""

    options = {"close_timeout": Option(float, 0.5, "seconds", low=0, low_open=True)}
    reason = ""  # what its undelivered text must say

    def write(self, records, events):
        return None


def _block():
    RELEASE.wait(120)


class DescribeWrongType(Broken):
    name, reason = "describe_str", "describe(): WrongType: describe() returned str"

    def describe(self, run):
        return "somewhere"


class DescribeBlocks(Broken):
    name, reason = "describe_blocks", "describe(): did not return within 2 s"

    def describe(self, run):
        _block()


class OpenRaises(Broken):
    name, reason = "open_raises", "open(): ConnectionError: tracker down"

    def open(self, run):
        raise ConnectionError("tracker down")


class OpenBlocks(Broken):
    name, reason = "open_blocks", "open() running for"

    def open(self, run):
        _block()


class HeldWrongType(Broken):
    name, reason = "held_list", "held(): WrongType: held() returned list, not Held"

    def held(self):
        return [3]


class WriteRaises(Broken):
    name, reason = "write_raises", "write(): ZeroDivisionError"

    def write(self, records, events):
        return 1 / 0


class WriteWrongType(Broken):
    name, reason = "write_int", "write(): WrongType: write() returned int, not None or a list of Events"

    def write(self, records, events):
        return len(records)


class CloseSlow(Broken):
    """Returns, but after its bound (5.5 s): the close is listed as not seen to finish."""

    name, reason = "close_slow", "its close had not finished after 5.5 s (its close bound; close() running for"

    def close(self, status="FINISHED"):
        time.sleep(8.0)


class CloseRaises(Broken):
    name, reason = "close_raises", "close(): RuntimeError: cannot close"

    def close(self, status="FINISHED"):
        raise RuntimeError("cannot close")


class CloseBlocks(Broken):
    name, reason = "close_blocks", "close() running for"

    def close(self, status="FINISHED"):
        _block()


class UndeliveredWrongType(Broken):
    name, reason = "undelivered_list", "undelivered(): WrongType: undelivered() returned list, not str"

    def undelivered(self):
        return ["10 records"]


class DescribeRaises(Broken):
    name, reason = "describe_raises", "describe(): ValueError: no store configured"

    def describe(self, run):
        raise ValueError("no store configured")


class HeldRaises(Broken):
    name, reason = "held_raises", "held(): KeyError: 'last_step'"

    def held(self):
        raise KeyError("last_step")


class HeldBlocks(Broken):
    """Nobody waits for ``held()`` (it is queued after ``open``): its writes queue behind it, and the close,
    queued behind them too, is not seen to finish within its bound."""

    name, reason = "held_blocks", "held() running for"

    def held(self):
        _block()


class WriteBlocks(Broken):
    name, reason = "write_blocks", "write() running for"

    def write(self, records, events):
        _block()


class FlushRaises(Broken):
    """Fails at the host's first flush, right after ``open``, and at every flush after."""

    name, reason = "flush_raises", "flush(): OSError: disk gone"

    def flush(self):
        raise OSError("disk gone")


class UndeliveredRaises(Broken):
    name, reason = "undelivered_raises", "undelivered(): RuntimeError: lost count"

    def undelivered(self):
        raise RuntimeError("lost count")


class UndeliveredBlocks(Broken):
    """Its close returns; its final ``undelivered()`` never does: the close is not seen to finish."""

    name, reason = "undelivered_blocks", "undelivered() running for"

    def undelivered(self):
        _block()


class OpenSlow(Broken):
    """Not broken: its open takes 3 s (a tracker slow to connect) and returns; its writes queue behind it, so it
    gets every record and is not listed."""

    name = "open_slow"

    def open(self, run):
        time.sleep(3.0)
        super().open(run)
        self.got = 0

    def write(self, records, events):
        self.got += len(records)


BROKEN = (DescribeWrongType, DescribeBlocks, DescribeRaises, OpenRaises, OpenBlocks, HeldWrongType, HeldRaises,
          HeldBlocks, WriteRaises, WriteWrongType, WriteBlocks, FlushRaises, CloseSlow, CloseRaises, CloseBlocks,
          UndeliveredWrongType, UndeliveredRaises, UndeliveredBlocks)


@pytest.fixture(autouse=True)
def release_blocked():
    RELEASE.clear()
    yield
    RELEASE.set()


def config(tmp_path: Path, name: str) -> dict:
    return {"experiment": "broken", "run_name": name, "flush_steps": 5, "sinks": ["jsonl"],
            "output_dir": str(tmp_path / "{experiment}" / "{run_name}")}


def check_outcome(run_dir: str, exit_code: int, broken) -> None:
    """Every step in jsonl, exit code 3, and each broken sink in run.json's outcome: its reason and its replay."""
    steps = sorted({rec.step for rec in read_rank_file(str(Path(run_dir) / "metrics" / "rank_0.jsonl")).records})
    assert steps == list(range(1, STEPS + 1))
    assert exit_code == 3
    outcome = json.loads((Path(run_dir) / "run.json").read_text())["outcome"]
    assert outcome["status"] == "FINISHED"
    said = outcome["not delivered"]
    assert set(said) == {cls.name for cls in broken}, said
    for cls in broken:
        assert cls.reason in said[cls.name], (cls.name, said[cls.name])
        assert f"msbridge replay {run_dir} --to {cls.name}" in said[cls.name]


def test_eighteen_broken_sinks_beside_model_train_leave_training_and_jsonl_whole(tmp_path):
    slow = OpenSlow()
    monitor = BridgeMonitor(config(tmp_path, "model-train"), sinks=[cls() for cls in BROKEN] + [slow],
                            progress=False)
    started = time.monotonic()
    train_regression([monitor], steps=STEPS)
    took = time.monotonic() - started
    assert monitor.steps_recorded == STEPS
    check_outcome(monitor.run_dir, monitor.outcome.exit_code, BROKEN)  # open_slow is not among them
    assert slow.got == STEPS
    # the close waited each bound in parallel (5.5 s), not one after another (99 s)
    assert took < 40, took


def test_broken_sinks_beside_an_msbridge_track_loop(tmp_path):
    broken = (OpenBlocks, WriteRaises, WriteWrongType, CloseBlocks, UndeliveredWrongType)
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = ms.nn.Dense(4, 1)
    opt = ms.nn.SGD(net.trainable_params(), learning_rate=0.01)
    grad = ms.value_and_grad(lambda x, y: ms.ops.mse_loss(net(x), y), None, opt.parameters)
    x = ms.Tensor(np.ones((8, 4), np.float32))
    y = ms.Tensor(np.zeros((8, 1), np.float32))
    with msbridge.track(config(tmp_path, "track"), sinks=[cls() for cls in broken], progress=False) as run:
        for _ in range(STEPS):
            loss, grads = grad(x, y)
            opt(grads)
            run.step(loss=loss)
    check_outcome(run.run_dir, run.outcome.exit_code, broken)


def test_a_refused_run_is_refused_within_the_close_bound_of_a_sink_whose_close_hangs(tmp_path):
    """A run refused at train begin (its run dir holds steps, training starts at step 1) closes its sinks, never
    opened, each on its own thread within its close bound (5.5 s): a plug-in whose close hangs, or raises, delays
    the refusal that long, and the refusal is what is raised."""
    train_regression([BridgeMonitor(config(tmp_path, "refused"), progress=False)], steps=4)
    second = BridgeMonitor(config(tmp_path, "refused"), sinks=[CloseBlocks(), CloseRaises()], progress=False)
    started = time.monotonic()
    with pytest.raises(msbridge.ConfigError, match="already holds the run 'refused' up to step 4"):
        train_regression([second], steps=4)
    took = time.monotonic() - started
    assert CloseBlocks().close_bound <= took < CloseBlocks().close_bound + 15, took

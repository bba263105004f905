"""``msbridge replay`` drives its sink as a training does (``msbridge.sinks.host.Driver``: its own thread, typed
calls, each bounded): a plug-in that raises, returns a wrong type or hangs in any call fails the replay into it
with one line naming the call and exit code 2, never a traceback or a hang, and it is not marked delivered."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from helpers.runs import make_records, make_run
from msbridge.adapters.jsonl_sink import JsonlSink

from msbridge.cli.main import main
from msbridge.options import Option
from msbridge.run.metadata import write_run_files
from msbridge.sinks.base import Event, Held, Sink
from msbridge.sinks.registry import register_sink

STEPS = 2_500  # three batches of replay's 1000
RELEASE = threading.Event()  # lets the blocked sinks' threads go once a test is done
ADVICE = "the jsonl log still holds everything: replay again once the sink is fixed"


class Kept(Sink):
    """A plug-in-like sink that keeps what it is handed, in memory; a subclass breaks one call. Its bound is
    close_timeout 0.5 s + the 5 s grace."""

    options = {"close_timeout": Option(float, 0.5, "seconds", low=0, low_open=True)}
    kept: list = []

    def write(self, records, events):
        Kept.kept += [r.step for r in records]


def _block(*args):
    RELEASE.wait(120)


def broken(method: str, body):
    """A ``Kept`` whose ``method`` is ``body``."""
    return type(f"Broken_{method}", (Kept,), {method: body})


def _raise(exc):
    def body(self, *args):
        raise exc
    return body


# (class, what the one line says after "msbridge: error: broken: ")
FAILS = [
    (broken("write", _raise(ZeroDivisionError("division by zero"))), "write(): ZeroDivisionError: division by zero"),
    (broken("write", lambda self, records, events: len(records)),
     "write(): WrongType: write() returned int, not None or a list of Events"),
    (broken("open", _raise(ConnectionError("tracker down"))), "open(): ConnectionError: tracker down"),
    (broken("held", lambda self: [3]), "held(): WrongType: held() returned list, not Held"),
    (broken("flush", _raise(OSError("disk gone"))), "flush(): OSError: disk gone"),
    (broken("close", _raise(RuntimeError("cannot close"))), "close(): RuntimeError: cannot close"),
    (broken("undelivered", lambda self: ["10 records"]),
     "undelivered(): WrongType: undelivered() returned list, not str"),
    (broken("undelivered", _raise(KeyError("count"))), "undelivered(): KeyError: 'count'"),
    (broken("__init__", _raise(ImportError("no client library"))),
     "Broken___init__(...) raised ImportError: no client library"),
]
HANGS = [
    (broken("open", _block), "open(): did not return within 5.5 s (flush waited for it)"),
    (broken("held", _block), "held(): did not return within 5.5 s (flush waited for it)"),
    (broken("write", _block), "write(): did not return within 5.5 s"),
    (broken("close", _block), "close(): did not return within 5.5 s (close waited for it)"),
    (broken("undelivered", _block), "undelivered(): did not return within 5.5 s (close waited for it)"),
]


@pytest.fixture(autouse=True)
def released():
    """Each test starts with its blocked calls held (what it registers is gone after it: conftest's
    ``_plugins_forgotten``)."""
    RELEASE.clear()
    Kept.kept = []
    yield
    RELEASE.set()


@pytest.fixture
def run_dir(tmp_path) -> str:
    """A run of ``STEPS`` steps and an event, with its outcome: the sink ``broken`` is listed not delivered."""
    run = make_run(tmp_path, name="r", experiment="replay", config={"experiment": "replay"})
    wal = JsonlSink()
    wal.open(run)
    wal.write(make_records(range(1, STEPS + 1)), [Event("anomaly", 7, 0, 1.0, {"check": "loss_spike"})])
    wal.close()
    outcome = {"status": "FINISHED", "not delivered": {"broken": "missed 10 records"}}
    write_run_files(run.run_dir, {"run_id": run.run_id, "run_name": "r", "config": {"experiment": "replay"},
                                  "outcome": outcome}, "# r\n")
    return run.run_dir


def replay_into(cls, run_dir: str, capsys):
    """``msbridge replay RUN_DIR --to broken`` with ``cls`` registered as ``broken``: exit code, stderr, seconds."""
    register_sink("broken")(cls)
    started = time.monotonic()
    code = main(["replay", run_dir, "--to", "broken"])
    return code, capsys.readouterr().err, time.monotonic() - started


def not_delivered(run_dir: str) -> dict:
    return json.loads(Path(run_dir, "run.json").read_text())["outcome"]["not delivered"]


def test_a_plug_in_that_keeps_the_contract_gets_every_record_and_is_marked_delivered(run_dir, capsys):
    class Good(Kept):
        def held(self):
            return Held(0)

    code, err, _ = replay_into(Good, run_dir, capsys)
    assert code == 0 and err == "", err
    assert Kept.kept == list(range(1, STEPS + 1)) and not_delivered(run_dir) == "none"


@pytest.mark.parametrize("cls, said", FAILS, ids=[cls.__name__ + "-" + said.split(":")[1].strip()
                                                  for cls, said in FAILS])
def test_a_sink_that_raises_or_returns_a_wrong_type_fails_in_one_line(run_dir, capsys, cls, said):
    code, err, took = replay_into(cls, run_dir, capsys)
    assert code == 2 and "Traceback" not in err, err
    line = "msbridge: error: broken: " + said
    assert err.startswith(line) and err.count("\n") == 1, err
    assert ADVICE in err or "raised" in said
    assert "broken" in not_delivered(run_dir), "a failed replay is not marked delivered"
    assert took < 5.0, took


@pytest.mark.slow
@pytest.mark.parametrize("cls, said", HANGS, ids=[cls.__name__ for cls, _ in HANGS])
def test_a_sink_that_hangs_fails_within_its_bound_in_one_line(run_dir, capsys, cls, said):
    code, err, took = replay_into(cls, run_dir, capsys)
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith("msbridge: error: broken: " + said) and err.count("\n") == 1, err
    assert took < 2 * 5.5 + 5, "waited one bound (two for a write that fills the queue), never for the hang"
    assert "broken" in not_delivered(run_dir)

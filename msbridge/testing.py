"""The sink contract, runnable: what every sink keeps, checked through the sink's own ``read_back``.

A plug-in's author runs ``check_sink(MySink)`` (in a test of theirs, or once by hand); msbridge's own contract
test runs it over every available sink. Each check opens the sink on a fresh run under ``directory`` and drives
it through the same ``SinkHost`` as a training does (its own thread, typed calls, each waited for at most its
production bound or ``timeout`` s: a raise, a wrong return type or a hang fails the check, named; each batch
through the host's hand-off, which skips what ``held()`` says the store holds and what it was handed), then
compares what ``read_back`` gives back, step for step: every metric with exactly its steps (checked first), then
its values (to float32's precision; a non-finite value stays non-finite), and every event as ``events/<kind>``
at its step. A replay into the same store, twice, must add nothing (``held()``).

Example:
    >>> from msbridge.testing import check_sink
    >>> check_sink(CsvSink)                       # raises ContractError naming the check and what differs
    >>> check_sink(MlflowSink, steps=1_000, directory="/tmp/contract")
"""
from __future__ import annotations

import math
import os
import random
import tempfile
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

from .names import GLOBAL_LOSS, GRAD_NORM, LOSS, LR, SAMPLES_PER_S
from .sinks.base import FAILED, FINISHED, KILLED, WAL_NAME, Event, Record, RunInfo, Series, Sink
from .sinks.calls import Call
from .sinks.host import Driver, SinkHost

#: float32 keeps 7 significant digits: a value read back is this close to the one handed over.
REL_TOLERANCE = 1e-6


class ContractError(AssertionError):
    """A sink broke the contract: the message names the check, the sink and what differs."""


def contract_run(directory: str, name: str, **fields: Any) -> RunInfo:
    """A run as ``plan_run`` makes one, on the global rank: run dir ``{directory}/contract/{name}``."""
    return RunInfo(run_id=f"id-{name}", run_name=name, experiment="contract", rank=0, world_size=1, is_global=True,
                   run_dir=os.path.join(os.path.abspath(directory), "contract", name),
                   config={"params": {"optimizer": {"learning_rate": 0.01}}, "experiment": "contract"},
                   metadata={"world_size": 1}, readme="# contract\n", **fields)


def contract_records(steps: Sequence[int], seed: int = 0) -> List[Record]:
    """Records as the stream makes them on rank 0 (loss, global loss, grad norm, lr, throughput), values from
    ``seed``: the same for the same arguments."""
    rng = random.Random(seed)
    return [Record(step, 0, 1_700_000_000.0 + step,
                   {LOSS: rng.uniform(1, 3), GLOBAL_LOSS: rng.uniform(1, 3), GRAD_NORM: rng.uniform(0.1, 10),
                    LR: 1e-3 * step, SAMPLES_PER_S: rng.uniform(100, 900)}) for step in steps]


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise ContractError(what)


def assert_series(got: Series, records: Sequence[Record]) -> None:
    """Every metric of ``records`` read back with exactly their steps (checked first), then their values."""
    for name in records[0].values:
        _expect(name in got, f"{name!r} was not read back (read back: {sorted(got)})")
        want = [(r.step, r.values[name]) for r in records]
        steps = [s for s, _ in got[name]]
        _expect(steps == [s for s, _ in want], f"{name!r}: steps {_span(steps)} read back, {_span(want)} handed over")
        for (step, value), (_, expected) in zip(got[name], want):
            if math.isfinite(expected):
                close = value is not None and math.isclose(value, expected, rel_tol=REL_TOLERANCE)
                _expect(close, f"{name!r} at step {step}: {value!r} read back, {expected!r} handed over")
            else:
                _expect(value is None or not math.isfinite(value),
                        f"{name!r} at step {step}: {value!r} read back, {expected!r} handed over")


def assert_events(got: Series, events: Sequence[Event]) -> None:
    """Every event read back as ``events/<kind>``: the count of that kind at each step, and nothing more."""
    want: Dict[str, Dict[int, float]] = {}
    for ev in events:
        counts = want.setdefault(f"events/{ev.kind}", {})
        counts[ev.step] = counts.get(ev.step, 0.0) + 1.0
    back = {name: dict(points) for name, points in got.items() if name.startswith("events/")}
    _expect(back == want, f"events read back {back}, handed over {want}")


def _span(points: Sequence[Any]) -> str:
    steps = [p[0] if isinstance(p, tuple) else p for p in points]
    return f"{len(steps)} steps {steps[0]}..{steps[-1]}" if steps else "no steps"


class Driven(Driver):
    """A sink driven as production drives it: a ``Driver`` (its ``SinkHost``, typed calls), each call waited for
    at most its production bound or ``timeout`` s, whichever is less (``describe`` 2 s, ``close`` its close bound).
    A raise, a wrong return type or a hang is a ``ContractError`` naming it.

    Example:
        >>> sink = Driven(CsvSink, contract_run("/tmp/c", "records"), {}, timeout=60)
        >>> sink.write(contract_records(range(1, 4)), []); sink.close(FINISHED); sink.read_back()
    """

    error = ContractError

    def __init__(self, cls: Type[Sink], run: RunInfo, options: Dict[str, Any], timeout: float) -> None:
        try:
            sink = cls(**options)
        except Exception as exc:
            raise ContractError(f"{cls.__name__}(**{options!r}) raised {type(exc).__name__}: {exc}") from None
        super().__init__(sink, limit=timeout, max_batches=1_000_000)
        self.run = run
        self.ask(Call("describe", run=run))
        self.open(run)

    def read_back(self) -> Series:
        """``read_back(run)`` after the close, on a thread of its own, bounded too."""
        host = SinkHost(self.sink, quiet=True)
        try:
            return self.ask(Call("read_back", run=self.run), host)
        finally:
            host.retire()


def check_records_and_events(cls: Type[Sink], directory: str, steps: int = 50, timeout: float = 60.0,
                             **options: Any) -> None:
    """open, write, flush, write with events, close FINISHED: records and events read back."""
    run, records = contract_run(directory, "records"), contract_records(range(1, steps + 1))
    events = [Event("anomaly", 30, 0, 1_700_000_030.0, {"check": "loss_spike", "value": 9.5}),
              Event("checkpoint", 40, 0, 1_700_000_040.0, {"path": "ckpt/step_40"})]
    sink = Driven(cls, run, options, timeout)
    sink.write(records[:20], [])
    sink.flush()
    sink.write(records[20:], events)
    sink.close(FINISHED)
    got = sink.read_back()
    assert_series(got, records)
    assert_events(got, events)


def check_empty_run(cls: Type[Sink], directory: str, timeout: float = 60.0, **options: Any) -> None:
    """open and close KILLED with nothing handed over: nothing read back."""
    sink = Driven(cls, contract_run(directory, "empty"), options, timeout)
    sink.close(KILLED)
    held = sorted(n for n, points in sink.read_back().items() if points and n.startswith(("train/", "events/")))
    _expect(not held, f"an empty run read back {held}")


def check_non_finite(cls: Type[Sink], directory: str, timeout: float = 60.0, **options: Any) -> None:
    """A NaN loss and an infinite global loss at step 3: kept visible, the other steps untouched."""
    run, records = contract_run(directory, "nonfinite"), contract_records(range(1, 6))
    records[2] = Record(3, 0, records[2].time, {**records[2].values, LOSS: math.nan, GLOBAL_LOSS: math.inf})
    sink = Driven(cls, run, options, timeout)
    sink.write(records, [])
    sink.close(FAILED)
    assert_series(sink.read_back(), records)


def check_resume(cls: Type[Sink], directory: str, timeout: float = 60.0, **options: Any) -> None:
    """The job dies after step 10 and resumes from its step-6 checkpoint: steps 7-10 come again, once stored."""
    run = contract_run(directory, "resumed")
    first = Driven(cls, run, options, timeout)
    first.write(contract_records(range(1, 11)), [])
    first.close(KILLED)
    again = Driven(cls, replace(run, resumed_from_step=10), options, timeout)
    again.write(contract_records(range(7, 16), seed=1), [])
    again.close(FINISHED)
    assert_series(again.read_back(), contract_records(range(1, 11)) + contract_records(range(7, 16), seed=1)[4:])


def check_replay_twice(cls: Type[Sink], directory: str, timeout: float = 60.0, **options: Any) -> None:
    """A run, then ``msbridge replay`` into it twice (a fresh sink, opened as replay opens it): its ``held()``
    says what the store holds, so each replay adds no record and no event. Not for jsonl: replay reads the
    write-ahead log, never writes it."""
    if cls.name == WAL_NAME:
        return
    run, records = contract_run(directory, "replayed"), contract_records(range(1, 21))
    events = [Event("anomaly", 12, 0, 1_700_000_012.0, {"check": "loss_spike"})]
    for attempt in ("the run", "the first replay", "the second replay"):
        sink = Driven(cls, run, options, timeout)
        sink.write(records, events)
        sink.close(FINISHED)
        got = sink.read_back()
        try:
            assert_series(got, records)
            assert_events(got, events)
        except ContractError as exc:
            raise ContractError(f"after {attempt}: {exc} (does held() read back what the store holds?)") from None


def check_many_steps(cls: Type[Sink], directory: str, steps: int = 10_000, timeout: float = 60.0,
                     **options: Any) -> None:
    """``steps`` steps in batches of 100, as flush windows: every step read back, the last value too."""
    run, records = contract_run(directory, "many"), contract_records(range(1, steps + 1))
    sink = Driven(cls, run, options, timeout)
    for start in range(0, len(records), 100):
        sink.write(records[start:start + 100], [])
    sink.close(FINISHED)
    assert_series(sink.read_back(), records)


#: Every check of the contract, by name: ``CHECKS[name](cls, directory, **options)``.
CHECKS: Dict[str, Callable[..., None]] = {
    "records_and_events": check_records_and_events,
    "empty_run": check_empty_run,
    "non_finite": check_non_finite,
    "resume": check_resume,
    "replay_twice": check_replay_twice,
    "many_steps": check_many_steps,
}


def check_sink(cls: Type[Sink], directory: Optional[str] = None, steps: int = 10_000, timeout: float = 60.0,
               **options: Any) -> List[str]:
    """Run every check of the contract on ``cls(**options)``; returns the names of the checks passed.

    ``directory`` holds the runs (a temporary directory, removed after, when None); ``steps`` is the long
    check's length; ``timeout`` caps each call's production bound (``describe`` 2 s, ``close`` the sink's close
    bound ...): a hang fails the check in that time, as it fails the run. Raises ``ContractError`` at the first
    check that fails, naming it.

    Example:
        >>> from msbridge.adapters.jsonl_sink import JsonlSink
        >>> check_sink(JsonlSink, steps=1_000)
        ['records_and_events', 'empty_run', 'non_finite', 'resume', 'replay_twice', 'many_steps']
    """
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="msbridge-contract-") as scratch:
            return check_sink(cls, scratch, steps, timeout, **options)
    passed = []
    for name, check in CHECKS.items():
        extra: Dict[str, Any] = {"steps": steps} if name == "many_steps" else {}
        try:
            check(cls, directory, timeout=timeout, **extra, **options)
        except ContractError as exc:
            raise ContractError(f"{cls.__name__} ({cls.name}) fails {name}: {exc}") from None
        passed.append(name)
    return passed


__all__: Tuple[str, ...] = ("CHECKS", "ContractError", "assert_events", "assert_series", "check_sink",
                            "contract_records", "contract_run")

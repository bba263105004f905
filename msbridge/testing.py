"""The sink contract, runnable: what every sink keeps, checked through the sink's own ``read_back``.

A plug-in's author runs ``check_sink(MySink)`` (in a test of theirs, or once by hand); msbridge's own contract
test runs it over every available sink. Each check opens the sink on a fresh run under ``directory``, hands it
records and events as the dispatcher does (``write``, ``flush``, ``close``) and compares what ``read_back`` gives
back, step for step: every metric with exactly its steps (checked first), then its values (to float32's
precision; a non-finite value stays non-finite), and every event as ``events/<kind>`` at its step.

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
from .sinks.base import FAILED, FINISHED, KILLED, Event, Record, RunInfo, Series, Sink

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


def check_records_and_events(cls: Type[Sink], directory: str, steps: int = 50, **options: Any) -> None:
    """open, write, flush, write with events, close FINISHED: records and events read back."""
    run, records = contract_run(directory, "records"), contract_records(range(1, steps + 1))
    events = [Event("anomaly", 30, 0, 1_700_000_030.0, {"check": "loss_spike", "value": 9.5}),
              Event("checkpoint", 40, 0, 1_700_000_040.0, {"path": "ckpt/step_40"})]
    sink = _opened(cls, run, options)
    sink.write(records[:20], [])
    sink.flush()
    sink.write(records[20:], events)
    sink.close(FINISHED)
    got = sink.read_back(run)
    assert_series(got, records)
    assert_events(got, events)


def check_empty_run(cls: Type[Sink], directory: str, **options: Any) -> None:
    """open and close KILLED with nothing handed over: nothing read back."""
    run = contract_run(directory, "empty")
    sink = _opened(cls, run, options)
    sink.close(KILLED)
    held = sorted(n for n, points in sink.read_back(run).items() if points and n.startswith(("train/", "events/")))
    _expect(not held, f"an empty run read back {held}")


def check_non_finite(cls: Type[Sink], directory: str, **options: Any) -> None:
    """A NaN loss and an infinite global loss at step 3: kept visible, the other steps untouched."""
    run, records = contract_run(directory, "nonfinite"), contract_records(range(1, 6))
    records[2] = Record(3, 0, records[2].time, {**records[2].values, LOSS: math.nan, GLOBAL_LOSS: math.inf})
    sink = _opened(cls, run, options)
    sink.write(records, [])
    sink.close(FAILED)
    assert_series(sink.read_back(run), records)


def check_resume(cls: Type[Sink], directory: str, **options: Any) -> None:
    """The job dies after step 10 and resumes from its step-6 checkpoint: steps 7-10 come again, once stored."""
    run = contract_run(directory, "resumed")
    first = _opened(cls, run, options)
    first.write(contract_records(range(1, 11)), [])
    first.close(KILLED)
    again = _opened(cls, replace(run, resumed_from_step=10), options)
    again.write(contract_records(range(7, 16), seed=1), [])
    again.close(FINISHED)
    assert_series(again.read_back(run), contract_records(range(1, 11)) + contract_records(range(7, 16), seed=1)[4:])


def check_many_steps(cls: Type[Sink], directory: str, steps: int = 10_000, **options: Any) -> None:
    """``steps`` steps in batches of 100, as flush windows: every step read back, the last value too."""
    run, records = contract_run(directory, "many"), contract_records(range(1, steps + 1))
    sink = _opened(cls, run, options)
    for start in range(0, len(records), 100):
        sink.write(records[start:start + 100], [])
    sink.close(FINISHED)
    assert_series(sink.read_back(run), records)


def _opened(cls: Type[Sink], run: RunInfo, options: Dict[str, Any]) -> Sink:
    sink = cls(**options)
    sink.open(run)
    return sink


#: Every check of the contract, by name: ``CHECKS[name](cls, directory, **options)``.
CHECKS: Dict[str, Callable[..., None]] = {
    "records_and_events": check_records_and_events,
    "empty_run": check_empty_run,
    "non_finite": check_non_finite,
    "resume": check_resume,
    "many_steps": check_many_steps,
}


def check_sink(cls: Type[Sink], directory: Optional[str] = None, steps: int = 10_000, **options: Any) -> List[str]:
    """Run every check of the contract on ``cls(**options)``; returns the names of the checks passed.

    ``directory`` holds the runs (a temporary directory, removed after, when None); ``steps`` is the long
    check's length. Raises ``ContractError`` at the first check that fails, naming it.

    Example:
        >>> from msbridge.adapters.jsonl_sink import JsonlSink
        >>> check_sink(JsonlSink, steps=1_000)
        ['records_and_events', 'empty_run', 'non_finite', 'resume', 'many_steps']
    """
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="msbridge-contract-") as scratch:
            return check_sink(cls, scratch, steps, **options)
    passed = []
    for name, check in CHECKS.items():
        extra: Dict[str, Any] = {"steps": steps} if name == "many_steps" else {}
        try:
            check(cls, directory, **extra, **options)
        except ContractError as exc:
            raise ContractError(f"{cls.__name__} ({cls.name}) fails {name}: {exc}") from None
        passed.append(name)
    return passed


__all__: Tuple[str, ...] = ("CHECKS", "ContractError", "assert_events", "assert_series", "check_sink",
                            "contract_records", "contract_run")

"""How a run ended, for the training script and the command line: status, sinks short of records, exit code.

``BridgeMonitor.outcome`` returns a ``RunOutcome``. Its ``exit_code`` is what
``msbridge demo`` exits with, so a training script can do the same
(``sys.exit(monitor.outcome.exit_code)``):

==  =====================================================================
0   FINISHED, and every sink received everything
3   FINISHED, but a sink did not receive everything (``undelivered``);
    ``msbridge replay RUN_DIR --to SINK`` fills it from the jsonl log
0   PRUNED: an Optuna trial's pruner stopped training (``msbridge.sweep``),
    and every sink received everything (else 3)
4   FAILED: a health action stopped training, training raised, or the
    ranks' collective timed out
5   KILLED: SIGTERM, SIGHUP or SIGINT (the process normally ends by the signal
    itself; the code is for a script that catches it)
==  =====================================================================

1 and 2 stay what they are for every ``msbridge`` command: ``config check``
found problems, and any other msbridge error.

``RunTally`` is the callback's bookkeeping behind it: steps recorded, losses,
events, and once the run has ended its status and undelivered sinks.

Example:
    >>> RunOutcome(FINISHED, {"mlflow": "2 failed call(s)"}).exit_code
    3
    >>> RunOutcome(FINISHED, {"mlflow": "2 failed call(s)"}).not_delivered("/runs/a")
    {'mlflow': '2 failed call(s); fill it: msbridge replay /runs/a --to mlflow'}
"""
from __future__ import annotations

import logging
import math
import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..sinks.base import FAILED, FINISHED, KILLED, Event

log = logging.getLogger("msbridge")

EXIT_OK = 0
EXIT_UNDELIVERED = 3
EXIT_FAILED = 4
EXIT_KILLED = 5
#: The status of a run an Optuna pruner stopped; its trackers close FINISHED, with a ``pruned`` event.
PRUNED = "PRUNED"
_BY_STATUS = {FINISHED: EXIT_OK, PRUNED: EXIT_OK, FAILED: EXIT_FAILED, KILLED: EXIT_KILLED}
#: The sink that is the write-ahead log: the others are rebuilt from it, it cannot be.
WAL_SINK = "jsonl"
#: What ``undelivered`` names when the run's own files (run.json, README.md) could not take the outcome.
RUN_FILES = "run.json"
_NO_REPLAY = {WAL_SINK: "the write-ahead log itself: the records it lost are gone",
              RUN_FILES: "the run dir could not take it: the outcome is in this exit code and the console only"}


@dataclass(frozen=True)
class RunOutcome:
    """``status``: FINISHED, PRUNED, FAILED or KILLED; None while the run has not ended (or never started).
    ``undelivered``: sink name -> what it may lack: its failed calls ("2 failed call(s)"), what it gave
    up delivering when it closed ("30 records and status FINISHED not delivered ...").

    Example:
        >>> monitor.outcome
        RunOutcome(status='FINISHED', undelivered={})
    """

    status: Optional[str] = None
    undelivered: Mapping[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0, 3, 4 or 5, see the module's table; 0 while the run has not ended."""
        if self.status in (FINISHED, PRUNED) and self.undelivered:
            return EXIT_UNDELIVERED
        return _BY_STATUS.get(self.status or FINISHED, EXIT_OK)

    def not_delivered(self, run_dir: str) -> Dict[str, str]:
        """For run.json and README: each sink that may lack records, and how to fill it."""
        out = {}
        for name, what in sorted(self.undelivered.items()):
            fix = _NO_REPLAY.get(name) or f"fill it: msbridge replay {shlex.quote(run_dir)} --to {name}"
            out[name] = f"{what}; {fix}"
        return out


def run_summary(status: str, counts: Mapping[str, Any], events: Sequence[Any], undelivered: Mapping[str, str],
                run_dir: str) -> Dict[str, Any]:
    """How the run went, for run.json and README: status, ``counts`` (steps, wall time, losses, health
    counters), the anomalies, and what each sink did not receive (with the replay that fills it)."""
    anomalies = [f"step {e.step}: {e.kind} {dict(e.detail)}" for e in events]
    return {"status": status, **counts, "anomalies": "; ".join(anomalies) if anomalies else "none",
            "not delivered": RunOutcome(status, undelivered).not_delivered(run_dir) or "none"}


class RunTally:
    """What a run recorded so far and how it ended: the callback's outcome bookkeeping.

    Example:
        >>> tally = RunTally()
        >>> tally.track_loss([2.5, 2.1, None, float("nan")])
        >>> tally.final_loss, tally.best_loss
        (nan, 2.1)
        >>> tally.ended(FINISHED, {"mlflow": "2 failed call(s)"})
        >>> tally.outcome.exit_code
        3
    """

    def __init__(self) -> None:
        self.steps_recorded = 0
        self.refused_steps = 0  # steps given at or below the last recorded one: not recorded (``refuse``)
        self.final_loss: Optional[float] = None
        self.best_loss: Optional[float] = None  # the smallest finite loss
        self.events: List[Event] = []
        self.started = time.perf_counter()
        self.status: Optional[str] = None  # set when the run has ended
        self.undelivered: Dict[str, str] = {}

    def refuse(self, what: str, last: int) -> None:
        """A step at or below the last recorded one is not recorded: counted in the outcome (run.json, README),
        said once per run. ``what`` names it as the user gave it (``step 5``, ``run.step(step=5)``)."""
        self.refused_steps += 1
        if self.refused_steps == 1:
            log.warning("msbridge: %s is not after step %d, the last recorded: refused (steps are recorded once, in "
                        "increasing order; the run's outcome counts the refused steps)", what, last)

    def track_loss(self, loss: Optional[Sequence[Optional[float]]]) -> None:
        """Take a flush's losses (one per recorded step, in step order, None where a step gave none; None when
        the flush had none)."""
        given = [float(v) for v in loss or () if v is not None]
        if not given:
            return
        finite = [v for v in given if math.isfinite(v)]
        self.final_loss = given[-1]
        if finite:
            self.best_loss = min(finite) if self.best_loss is None else min(self.best_loss, *finite)

    def ended(self, status: str, undelivered: Mapping[str, str], raised: Sequence[Event] = ()) -> None:
        """The run closed with ``status``; ``undelivered`` and ``raised`` (what a sink finally lost,
        such as a jsonl gap, as events) come from the closed dispatcher."""
        self.status, self.undelivered = status, dict(undelivered)
        self.events.extend(raised)

    @property
    def outcome(self) -> RunOutcome:
        return RunOutcome(self.status, dict(self.undelivered))

    def summary(self, last_step: int, health: Mapping[str, Any], run_dir: str,
                late: Optional[Mapping[str, Any]] = None,
                objective: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """``run_summary`` of the ended run; ``late``: a signal that arrived while the sinks were closing;
        ``objective``: its metric, mode, best (and its step) and final value (``metrics.objective``)."""
        refused = {"steps refused": self.refused_steps} if self.refused_steps else {}
        counts = {"steps recorded": self.steps_recorded, **refused, "last step": last_step,
                  "wall time": f"{time.perf_counter() - self.started:.1f} s", "final loss": self.final_loss,
                  "best loss": self.best_loss, **({"objective": dict(objective)} if objective else {}), **health}
        summary = run_summary(self.status or FINISHED, counts, self.events, self.undelivered, run_dir)
        if late:
            summary["interrupted"] = f"{late['signal']} while the sinks were closing (held until they closed)"
        return summary

"""How a run ended, for the training script and the command line: status, sinks short of records, exit code.

``BridgeMonitor.outcome`` returns a ``RunOutcome``. Its ``exit_code`` is what
``msbridge demo`` exits with, so a training script can do the same
(``sys.exit(monitor.outcome.exit_code)``):

==  =====================================================================
0   FINISHED, and every sink received everything
3   FINISHED, but a sink did not receive everything (``undelivered``);
    ``msbridge replay RUN_DIR --to SINK`` fills it from the jsonl log
4   FAILED: a health action stopped training, training raised, or the
    ranks' collective timed out
5   KILLED: SIGTERM or SIGINT (the process normally ends by the signal
    itself; the code is for a script that catches it)
==  =====================================================================

1 and 2 stay what they are for every ``msbridge`` command: ``config check``
found problems, and any other msbridge error.

Example:
    >>> RunOutcome(FINISHED, {"mlflow": "2 failed call(s)"}).exit_code
    3
    >>> RunOutcome(FINISHED, {"mlflow": "2 failed call(s)"}).not_delivered("/runs/a")
    {'mlflow': '2 failed call(s); fill it: msbridge replay /runs/a --to mlflow'}
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence

from ..sinks.base import FAILED, FINISHED, KILLED

EXIT_OK = 0
EXIT_UNDELIVERED = 3
EXIT_FAILED = 4
EXIT_KILLED = 5
_BY_STATUS = {FINISHED: EXIT_OK, FAILED: EXIT_FAILED, KILLED: EXIT_KILLED}
#: The sink that is the write-ahead log: the others are rebuilt from it, it cannot be.
WAL_SINK = "jsonl"


@dataclass(frozen=True)
class RunOutcome:
    """``status``: FINISHED, FAILED or KILLED; None while the run has not ended (or never started).
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
        if self.status == FINISHED and self.undelivered:
            return EXIT_UNDELIVERED
        return _BY_STATUS.get(self.status or FINISHED, EXIT_OK)

    def not_delivered(self, run_dir: str) -> Dict[str, str]:
        """For run.json and README: each sink that may lack records, and how to fill it."""
        out = {}
        for name, what in sorted(self.undelivered.items()):
            fix = ("the write-ahead log itself: the records it lost are gone" if name == WAL_SINK
                   else f"fill it: msbridge replay {shlex.quote(run_dir)} --to {name}")
            out[name] = f"{what}; {fix}"
        return out


def run_summary(status: str, counts: Mapping[str, Any], events: Sequence[Any], undelivered: Mapping[str, str],
                run_dir: str) -> Dict[str, Any]:
    """How the run went, for run.json and README: status, ``counts`` (steps, wall time, losses, health
    counters), the anomalies, and what each sink did not receive (with the replay that fills it)."""
    anomalies = [f"step {e.step}: {e.kind} {dict(e.detail)}" for e in events]
    return {"status": status, **counts, "anomalies": "; ".join(anomalies) if anomalies else "none",
            "not delivered": RunOutcome(status, undelivered).not_delivered(run_dir) or "none"}

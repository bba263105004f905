"""The jsonl log read as columns: what ``msbridge plot`` and ``diagnose`` read, memory flat in the run's length.

``read_rank_columns`` reads a rank file with the same line checks as ``runlog.read_rank_file`` (the same
``iter_rank_lines``), but keeps each metric as two arrays (its steps' indices and values) instead of a
``Record`` per step: about 9 bytes a value.

Example:
    >>> run = read_run_columns("msbridge_runs/long/run-1")
    >>> steps, values = run.ranks[0].arrays("train/loss")
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from .base import Event, Record
from .runlog import RunLog, finish_rank_log, iter_rank_lines, read_run

if TYPE_CHECKING:
    import numpy as np


class ColumnLog:
    """One rank's jsonl file read line by line into columns: what ``RankLog`` offers (``header``, ``events``,
    ``truncated``, ``skipped``, ``series``, ``metric_names``, ``records``), in about 9 bytes per value instead
    of a ``Record`` object per step. ``records`` builds each ``Record`` when it is read.

    Example:
        >>> log = read_rank_columns("runs/long/run-1/metrics/rank_0.jsonl")
        >>> steps, values = log.arrays("train/loss")
    """

    def __init__(self, path: str) -> None:
        self.path, self.header = path, {}
        self.events: List[Event] = []
        self.truncated = 0
        self.skipped: List[Tuple[int, str]] = []
        self._steps, self._ranks, self._times = array("q"), array("q"), array("d")
        self._rows: Dict[str, array] = {}  # name -> indices of the records holding it
        self._values: Dict[str, array] = {}
        self._view: Optional[_ColumnRecords] = None

    @property
    def rank(self) -> int:
        return int(self.header.get("rank", 0))

    def append(self, rec: Record) -> None:
        i = len(self._steps)
        self._steps.append(rec.step)
        self._ranks.append(rec.rank)
        self._times.append(rec.time)
        for name, value in rec.values.items():
            if name not in self._rows:
                self._rows[name], self._values[name] = array("q"), array("d")
            self._rows[name].append(i)
            self._values[name].append(value)

    def arrays(self, name: str) -> Tuple["np.ndarray", "np.ndarray"]:
        """``(steps, values)`` of one metric as numpy arrays (NaN where the log holds null)."""
        import numpy as np

        rows = np.frombuffer(self._rows[name], dtype=np.int64) if name in self._rows else np.zeros(0, np.int64)
        values = np.frombuffer(self._values[name], dtype=np.float64) if name in self._values else np.zeros(0)
        return np.frombuffer(self._steps, dtype=np.int64)[rows] if len(rows) else rows, values

    def series(self, name: str) -> List[Tuple[int, Optional[float]]]:
        """As ``RankLog.series``."""
        steps, values = self.arrays(name)
        return list(zip(steps.tolist(), values.tolist()))

    def metric_names(self) -> List[str]:
        return list(self._rows)

    def steps(self) -> "np.ndarray":
        """Every record's step, in file order."""
        import numpy as np

        return np.frombuffer(self._steps, dtype=np.int64)

    @property
    def records(self) -> "_ColumnRecords":
        if self._view is None or len(self._view) != len(self._steps):
            self._view = _ColumnRecords(self)
        return self._view


class _ColumnRecords(Sequence):
    """A ``ColumnLog``'s records, each built when it is read."""

    def __init__(self, log: ColumnLog) -> None:
        import numpy as np

        self._log = log
        n = len(log._steps)
        self._names = list(log._rows)
        self._matrix = np.full((n, len(self._names)), np.nan)
        self._present = np.zeros((n, len(self._names)), dtype=bool)
        for j, name in enumerate(self._names):
            index = np.frombuffer(log._rows[name], dtype=np.int64)
            self._matrix[index, j] = np.frombuffer(log._values[name], dtype=np.float64)
            self._present[index, j] = True
        self._full = self._present.all(axis=1)

    def __len__(self) -> int:
        return len(self._log._steps)

    def __iter__(self) -> Iterator[Record]:
        log, names, chunk = self._log, self._names, 8192
        for start in range(0, len(self), chunk):
            stop = min(start + chunk, len(self))
            rows = self._matrix[start:stop].tolist()
            for i, row in zip(range(start, stop), rows):
                values = dict(zip(names, row)) if self._full[i] else \
                    {n: v for n, v, p in zip(names, row, self._present[i]) if p}
                yield Record(log._steps[i], log._ranks[i], log._times[i], values)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        log = self._log
        values = {n: float(v) for n, v, p in zip(self._names, self._matrix[i], self._present[i]) if p}
        return Record(log._steps[i], log._ranks[i], log._times[i], values)


def read_rank_columns(path: str, strict: bool = False) -> ColumnLog:
    """``read_rank_file`` streamed into a ``ColumnLog``: memory grows with the values, not with Python objects."""
    log = ColumnLog(path)
    for rec in iter_rank_lines(path, log, strict):
        log.append(rec)
    return finish_rank_log(log, strict)


def read_run_columns(run_dir: str, strict: bool = False) -> RunLog:
    """``read_run`` with every rank file streamed into a ``ColumnLog`` (for plot and diagnose of long runs)."""
    return read_run(run_dir, strict, reader=read_rank_columns)

"""What monitoring cost a run, and how msbridge's CPU is counted (the one owner of that count; ``msbridge bench``'s
probes use it too).

msbridge's CPU is: its threads (the live threads named ``msbridge-*``: the sink hosts, the stall watchdog, the
alerts ...), each to the nanosecond from Linux's ``/proc/self/task/TID/schedstat``; its child processes (the
MLflow client's), every thread of each; and its step hooks on the training thread, the wall time the callback
charges to the overhead budget (``capture.budget``). ``CostMeter`` counts it from the monitor's start (before
its sinks are built) to the end of its close, reading ``/proc`` three times (start, close, end) and adding to two
numbers a step.

A thread or child that ends in the close (a sink host once its close returned, the MLflow child) has no
``/proc`` entry left to read. The close is therefore counted from the kernel's totals, which keep what ended:
the process's CPU over the close (``CLOCK_PROCESS_CPUTIME_ID``, ended threads included) minus what every other
thread still alive spent meanwhile, and for children the reaped children's CPU (``RUSAGE_CHILDREN``) over the
close minus what each had spent before it. A thread or child of msbridge that ended before the close (a
``hurry`` thread, an MLflow child that was replaced) is not counted.

Example:
    >>> meter = CostMeter()
    >>> meter.start()                       # the monitor is built, before its sinks are
    >>> meter.hooks_s += 40e-6              # each step hook: its time (what the budget is charged) ...
    >>> meter.steps += 1                    # ... and the steps it ended
    >>> meter.closing()                     # the close begins
    >>> sorted(meter.finish())              # the close ended: the outcome's "monitoring cost"
    ['close_cpu_s', 'cpu_s', 'off_training_thread_us_per_step', 'steps', 'training_thread_us_per_step', 'us_per_step']
"""
from __future__ import annotations

import os
import resource
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional

#: The prefix of the name of every thread msbridge starts.
THREAD_PREFIX = "msbridge-"
#: A child process is msbridge's when its command line holds this: the MLflow client's does
#: (``msbridge.adapters.mlflow_tracker.client.process``), a forked worker of a script named msbridge does not.
CHILD_MARK = "msbridge.adapters."
#: The outcome's key in run.json and README.
KEY = "monitoring cost"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def task_cpu_s(pid: int, tid: int) -> Optional[float]:
    """CPU seconds of thread ``tid`` of process ``pid``: to the nanosecond from schedstat (the stat file's clock ticks
    where there is none); None when it has ended (or there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def tasks_cpu(pid: int, tids: Optional[Iterable[int]] = None) -> Dict[int, float]:
    """Thread id -> CPU seconds of process ``pid``'s threads ``tids`` (default: all of them) that are alive."""
    if tids is None:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return {}
    out = {}
    for tid in tids:
        cpu = task_cpu_s(pid, tid)
        if cpu is not None:
            out[tid] = cpu
    return out


def own_thread_ids(prefix: str = THREAD_PREFIX) -> List[int]:
    """Native ids of this process's live threads whose names start with ``prefix``."""
    return [t.native_id for t in threading.enumerate() if t.name.startswith(prefix) and t.native_id is not None]


def threads_cpu_s(prefix: str = THREAD_PREFIX) -> Optional[float]:
    """CPU seconds of this process's live threads named ``prefix...`` (None if there is none): the bench's count."""
    ids = own_thread_ids(prefix)
    return sum(tasks_cpu(os.getpid(), ids).values()) if ids else None


def child_pids(pid: Optional[int] = None) -> List[int]:
    """The live descendants of ``pid`` (default: this process), children first."""
    out, todo = [], [pid or os.getpid()]
    while todo:
        parent = todo.pop(0)
        kids = _kids(parent)
        out.extend(kids)
        todo.extend(kids)
    return out


def _kids(pid: int) -> List[int]:
    found = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found.update(int(p) for p in fh.read().split())
    except OSError:
        return []
    return sorted(found)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def children_cpu(mark: Optional[str] = None) -> Dict[int, float]:
    """Pid -> CPU seconds (all its threads) of each live descendant process; ``mark``: only those whose command line
    holds it (``CHILD_MARK``: msbridge's own)."""
    out = {}
    for pid in child_pids():
        if mark is not None and mark not in _cmdline(pid):
            continue
        cpu = tasks_cpu(pid)
        if cpu:
            out[pid] = sum(cpu.values())
    return out


def live_children_cpu_s() -> float:
    """CPU seconds of every live descendant process (a reaped one is in ``reaped_children_cpu_s``): the bench's
    count."""
    return sum(children_cpu().values())


def reaped_children_cpu_s() -> float:
    """CPU seconds of this process's child processes that ended and were reaped (``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _since(now: Mapping[int, float], before: Mapping[int, float]) -> float:
    return sum(max(cpu - before.get(key, 0.0), 0.0) for key, cpu in now.items())


class _Snapshot:
    """The counts at one moment: the process's CPU, each of its threads', msbridge's threads and children."""

    def __init__(self) -> None:
        self.process_s = time.process_time()  # every thread, ended ones included
        self.tasks = tasks_cpu(os.getpid())
        self.own = set(own_thread_ids())
        self.children = children_cpu()
        self.own_children = {pid for pid in self.children if CHILD_MARK in _cmdline(pid)}
        self.reaped_s = reaped_children_cpu_s()

    def own_cpu(self, base: "_Snapshot") -> float:
        """msbridge's threads' and children's CPU now, less what those alive at ``base`` had then."""
        threads = sum(self.tasks.get(t, 0.0) - (base.tasks.get(t, 0.0) if t in base.own else 0.0) for t in self.own)
        children = sum(self.children[p] - (base.children.get(p, 0.0) if p in base.own_children else 0.0)
                       for p in self.own_children)
        return max(threads, 0.0) + max(children, 0.0)


class CostMeter:
    """What msbridge cost this run: its threads' and children's CPU, and its step hooks' time on the training thread
    (the module says how each is counted). ``hooks_s`` and ``steps`` are what the step hook adds to.

    Example:
        >>> meter = CostMeter(); meter.start()
        >>> meter.hooks_s += 40e-6; meter.steps += 1
        >>> meter.closing(); meter.finish()["steps"]
        1
    """

    def __init__(self) -> None:
        self.hooks_s = 0.0  # the step hooks' time on the training thread
        self.steps = 0  # the steps they ended
        self._base: Optional[_Snapshot] = None
        self._pre: Optional[_Snapshot] = None
        self._me: Optional[int] = None

    def start(self) -> None:
        """The monitor starts, before its sinks are built (the MLflow sink starts its child when it is built)."""
        self.hooks_s, self.steps, self._pre = 0.0, 0, None
        self._base = _guarded(_Snapshot)

    def closing(self) -> None:
        """The close begins, on the thread that closes (the training thread)."""
        self._me = threading.get_native_id()
        self._pre = _guarded(_Snapshot)

    def finish(self) -> Optional[Dict[str, Any]]:
        """The close ended: the outcome's ``monitoring cost`` (None without ``/proc``, or when it cannot be read)."""
        if self._base is None:
            return None
        return _guarded(lambda: self._figures(_Snapshot(), self.steps))

    def _figures(self, end: _Snapshot, steps: int) -> Optional[Dict[str, Any]]:
        base, pre = self._base, self._pre or end
        if not base.tasks and not end.tasks:  # no /proc: nothing measured, nothing said
            return None
        me = self._me if self._pre is not None else None
        foreign = set(end.tasks) - end.own - pre.own - {me}
        close_s = end.process_s - pre.process_s - _since({t: end.tasks[t] for t in foreign}, pre.tasks)
        me_close = _since({me: end.tasks[me]}, pre.tasks) if me in end.tasks else 0.0
        gone = [p for p in pre.children if p not in end.children]
        reaped = end.reaped_s - pre.reaped_s - sum(pre.children[p] for p in gone)
        close_children = _since({p: end.children[p] for p in end.own_children}, pre.children) + max(reaped, 0.0)
        off = pre.own_cpu(base) + max(close_s - me_close, 0.0) + close_children
        on = self.hooks_s + me_close
        return figures(off, on, steps, close_cpu_s=max(close_s, 0.0) + close_children)


def figures(off_s: float, on_s: float, steps: int, **extra: float) -> Dict[str, Any]:
    """The outcome's ``monitoring cost`` from CPU seconds off and on the training thread over ``steps``.

    Example:
        >>> figures(0.3, 0.06, 3000)["us_per_step"]
        120.0
    """
    per = (lambda s: round(s / steps * 1e6, 1)) if steps else (lambda s: None)
    out = {"cpu_s": round(off_s + on_s, 6), "us_per_step": per(off_s + on_s),
           "off_training_thread_us_per_step": per(off_s), "training_thread_us_per_step": per(on_s), "steps": steps}
    out.update({k: round(v, 4) for k, v in extra.items()})
    return out


def describe(cost: Mapping[str, Any]) -> str:
    """The README's line of ``figures``: "0.36 CPU-s, 120 µs a step (100 off the training thread, 20 on it) over
    3,000 steps", and how much of it the close took (the MLflow client, kept idle beside training, catches up there).

    Example:
        >>> describe(figures(0.3, 0.06, 3000, close_cpu_s=0.1))  # doctest: +NORMALIZE_WHITESPACE
        '0.36 CPU-s, 120 µs a step (100 off the training thread, 20 on it) over 3,000 steps;
        0.10 CPU-s of it in the close'
    """
    head = f"{cost.get('cpu_s', 0):.2f} CPU-s"
    close = f"; {cost['close_cpu_s']:.2f} CPU-s of it in the close" if cost.get("close_cpu_s") is not None else ""
    if not cost.get("steps"):
        return f"{head} (no step trained){close}"
    return (f"{head}, {cost['us_per_step']:,.0f} µs a step ({cost['off_training_thread_us_per_step']:,.0f} off the "
            f"training thread, {cost['training_thread_us_per_step']:,.0f} on it) over {cost['steps']:,} steps{close}")


def _guarded(make: Callable[[], Any]) -> Any:
    """``make()``, or None when reading ``/proc`` fails: the cost is never worth a failed close."""
    try:
        return make()
    except Exception:  # pragma: no cover - a /proc that cannot be read the way Linux lays it out
        import logging

        logging.getLogger("msbridge").debug("msbridge: cannot count the monitoring cost", exc_info=True)
        return None

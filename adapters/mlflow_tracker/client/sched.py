"""How MLflow's client process (``mlflow_tracker.client.process``) is scheduled, on Linux: its priority beside a live training,
the check that finds it starved of CPU once training has ended, and its death with the process that started it.

The child starts at the priority of the process that starts it. Beside a live training (``connect(...,
beside_training=True)``: the sink opened by a training's run, ``RunInfo.training``) it has two phases. The parent sets
it at once to nice ``NICE`` (5) above its own, normal class (``nice_beside_training``): its start (with a sqlite
store a template's copy and the run in sqlite, ~0.1 CPU-s, ``mlflow_tracker.store.native``; with a server MLflow's import, seconds)
finishes in bounded time on a busy host (MLflow's
import and a new store's migrations beside 2 CPU-bound processes: 42-49 s at nice 5; at nice 19 or ``SCHED_IDLE``
they did not finish in 120 s, ``examples/bench/child_priority.py``). It then drops to ``SCHED_IDLE`` once its first metrics are stored
(``go_idle``): steady delivery is ~1% of a core, and MindSpore's CPU kernels keep both cores of this project's 2-vCPU
VM busy, so any normal-class CPU it takes stalls a kernel thread. Measured 2026-12-01, interleaved, setup (e) of
``msbridge bench`` against no monitoring: ``SCHED_IDLE`` 0.92-0.96, nice 19 0.88, nice 5 0.85 (docs/benchmarks.md).
``SCHED_IDLE`` is not starvation while training runs: CFS gives an idle-class task weight 3 (against 1024 at nice 0),
a share that never reaches zero, and a child that falls far behind only fills its tracker's queue, which is then named
undelivered with its replay (the dispatcher gives each tracker its own thread).

Once training has ended there is nothing left to slow, but beside other busy processes (data loaders, other jobs) a
niced or idle-class child still gets little or no CPU (a close beside 2 CPU-bound processes took 35 s, its bound, with
MLflow undelivered), and an unprivileged process can undo neither (``RLIMIT_NICE`` 0). So a close still running
``HURRY_AFTER`` seconds in calls ``ClientProcess.hurry``: a child that is ``starved`` (its call spent over half its
time waiting for a CPU) is killed and the call it was in runs again on a new child at the parent's priority; one
not starved yet is looked at again every ``RECHECK_S`` s until it is, so a call that starts or starves later is
caught while it runs (before, such a call of 20,000 rows beside 2 busy processes ran on for 6 minutes, idle-class);
on an idle host nothing changes. Every call the sink makes is safe to redo (metrics, tags, texts and status are
written the same again; the store survives a kill at any moment, ``mlflow_tracker.store.local``) except
``create_run``, which is left to finish first. Elsewhere (``msbridge replay``, ``compare``, a sink opened by hand)
the child keeps its parent's priority: no training runs there that it could slow, and the user is waiting on it.

"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import Optional, Tuple

#: The child's nice value above its parent's while it starts beside a live training (the module docstring).
NICE = 5
#: ``prctl`` option: the signal the kernel sends this process when its parent thread ends (Linux).
PR_SET_PDEATHSIG = 1
#: Seconds a call must have run before it may be judged ``starved``.
STARVED_AFTER = 0.1
#: A process's (seconds on a CPU, seconds waiting for one), from ``cpu_and_wait``; None where unknown.
CpuAndWait = Optional[Tuple[float, float]]


def nice_beside_training(child: Optional[subprocess.Popen]) -> None:
    """``child`` to ``NICE`` above this process, at once (mid-import too): a live training's start."""
    try:
        os.setpriority(os.PRIO_PROCESS, child.pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE))
    except (AttributeError, OSError):  # no child, or one that already ended: the next start sets it
        pass


def go_idle() -> bool:
    """This process to Linux's idle scheduling class; False where there is none (it stays where it is)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def die_with_parent(parent: int) -> None:
    """End at once (SIGKILL from the kernel) when the process that started this one dies, even by ``kill -9``
    (Linux ``prctl(PR_SET_PDEATHSIG)``); elsewhere the child ends at the end of its input."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def cpu_and_wait(pid: int) -> CpuAndWait:
    """Seconds process ``pid`` has run on a CPU and waited for one so far (``/proc/PID/schedstat``)."""
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            cpu, wait = fh.read().split()[:2]
        return int(cpu) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return None


def starved(then: CpuAndWait, now: CpuAndWait, elapsed: float, running: Optional[int] = None) -> bool:
    """Whether a call that took ``elapsed`` s (``STARVED_AFTER`` or more) spent over half of it waiting for a CPU;
    ``then`` and ``now`` are the child's ``cpu_and_wait`` at its start and now. Linux adds a wait when it ends, and an
    idle-class child beside busy cores runs one slice every second or so: so while the call is still running in the
    child ``running`` (its pid), a child runnable now (``/proc/PID/stat``) that ran under half the time waits too.

    >>> starved((1.0, 0.0), (1.01, 0.9), elapsed=1.0), starved((1.0, 0.0), (1.9, 0.05), elapsed=1.0)
    (True, False)
    """
    if then is None or now is None or elapsed < STARVED_AFTER:
        return False
    if now[1] - then[1] > elapsed / 2:
        return True
    if running is None or now[0] - then[0] >= elapsed / 2:
        return False
    try:
        with open(f"/proc/{running}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, IndexError):
        return False

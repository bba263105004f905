"""NPU system metrics (``system: {interval_s: 10}``): a background thread that runs ``npu-smi info``.

Every ``interval_s`` seconds the thread runs ``npu-smi info`` once, reads the
rank's own chip (``msbridge.capture.npu_smi``) and keeps the sample with its
wall time; each flush takes the samples taken since the last one and records
each on the last step that ended before it (``system/npu_utilization_pct``,
``system/npu_hbm_used_mb`` ...). Between samples the thread sleeps on an Event:
no polling, no CPU. Without ``npu-smi`` on PATH (no NPU) nothing starts and
one INFO line says so.

The rank's own chip: MindSpore's ``device_id`` (the local rank under msrun),
through ``ASCEND_RT_VISIBLE_DEVICES`` when that renumbers the devices, counted
in the order ``npu-smi`` lists the chips.

Example:
    >>> sampler = NpuSampler.start(interval_s=10, device_id=0)
    >>> sampler.drain()     # at a flush
    [(1764500000.1, {'system/npu_utilization_pct': 71.0, 'system/npu_hbm_used_mb': 30150.0, ...})]
    >>> sampler.stop()
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from .npu_smi import chip_metrics, parse_npu_smi

log = logging.getLogger("msbridge")

Sample = Tuple[float, Dict[str, float]]
COMMAND = "npu-smi"
MAX_KEPT = 10_000  # samples held between flushes at most (a flush that never comes must not grow memory)


def physical_index(device_id: int, visible: Optional[str] = None) -> int:
    """The chip ``device_id`` is, counted in npu-smi's order, under ``ASCEND_RT_VISIBLE_DEVICES``.

    Example:
        >>> physical_index(1, "4,5,6,7")
        5
    """
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES") if visible is None else visible
    ids = [int(v) for v in visible.split(",") if v.strip().isdigit()] if visible else []
    return ids[device_id] if device_id < len(ids) else device_id


class NpuSampler:
    """Samples the rank's own NPU chip every ``interval_s`` seconds in a daemon thread.

    Args:
        interval_s: seconds between two ``npu-smi info`` runs.
        device_id: MindSpore's device id of this rank.
        command: the executable (found on PATH).

    Example:
        >>> sampler = NpuSampler.start(10.0, device_id=3)   # None (and one INFO line) without npu-smi
    """

    def __init__(self, interval_s: float, device_id: int, command: str = COMMAND) -> None:
        self.interval_s = float(interval_s)
        self.index = physical_index(int(device_id))
        self.command = command
        self._samples: Deque[Sample] = deque(maxlen=MAX_KEPT)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._warned: set = set()
        self.thread = threading.Thread(target=self._run, name="msbridge-npu-smi", daemon=True)

    @classmethod
    def start(cls, interval_s: float, device_id: int, command: str = COMMAND) -> Optional["NpuSampler"]:
        """A running sampler, or None (said once at INFO) when ``command`` is not on PATH."""
        path = shutil.which(command)
        if path is None:
            log.info("msbridge: system: %s is not on PATH (no NPU here); NPU system metrics are off", command)
            return None
        sampler = cls(interval_s, device_id, path)
        sampler.thread.start()
        return sampler

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):  # sleeps, woken only by stop()
                return

    def sample(self) -> Optional[Dict[str, float]]:
        """Run ``npu-smi info`` once and keep the own chip's metrics (None when that failed; said once)."""
        taken = time.time()
        try:
            out = subprocess.run([self.command, "info"], capture_output=True, text=True,
                                 timeout=max(5.0, self.interval_s))
            chips = parse_npu_smi(out.stdout) if out.returncode == 0 else None
            problem = f"exited with {out.returncode}: {out.stderr.strip()[:200]}" if chips is None else None
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            chips, problem = None, f"{type(exc).__name__}: {exc}"
        if chips is not None and self.index >= len(chips):
            problem = f"lists {len(chips)} chip(s), this rank's device is number {self.index}"
        if problem is not None:
            self._warn_once(problem)
            return None
        metrics = chip_metrics(chips[self.index])
        with self._lock:
            self._samples.append((taken, metrics))
        return metrics

    def _warn_once(self, problem: str) -> None:
        kind = problem.split(":")[0]
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("msbridge: system: %s info %s; NPU system metrics missing from such samples",
                        self.command, problem)

    def drain(self) -> List[Sample]:
        """The samples taken since the last drain, oldest first."""
        with self._lock:
            samples = list(self._samples)
            self._samples.clear()
        return samples

    def stop(self) -> None:
        """Wake the thread and wait for it (a running ``npu-smi`` is let finish)."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=max(5.0, self.interval_s) + 1.0)

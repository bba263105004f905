"""Memory at a flush (``memory: true``): the device's allocated memory and its peak in the window, this
process's RSS and its peak in the window.

Device memory comes from MindSpore's runtime API
(``mindspore.runtime.memory_allocated`` / ``max_memory_allocated``: the memory
pool of the rank's own device, Ascend or GPU); after each read
``reset_max_memory_allocated`` starts the next window's peak. The CPU backend has no device
memory pool (the API reports 0 there), so on CPU only the host RSS is recorded,
and one line says so. Host RSS is read from ``/proc/self/statm`` (Linux), else
with psutil when it is installed. The host peak is Linux's high-water mark (``VmHWM`` in
``/proc/self/status``), reset after each read by writing ``5`` to ``/proc/self/clear_refs``; where
that write is refused the peak is the process's since it started, said once. The reset restarts what
``getrusage`` reports as ``ru_maxrss`` too (``/usr/bin/time -v``): the run's peak is the largest window peak.
All host calls, once per flush:
the peak adds about 30 us to it (20 us to read ``/proc/self/status``, 10 us for the reset, medians on this
2-vCPU VM, 2026-12-04); nothing is read from the device.

Example:
    >>> MemoryReader("Ascend").read()
    {'memory/device_allocated_mb': 5120.0, 'memory/device_peak_mb': 6144.0, 'memory/host_rss_mb': 2310.5,
     'memory/host_rss_peak_mb': 2400.1}
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Dict, Optional

from ..names import DEVICE_ALLOCATED_MB, DEVICE_PEAK_MB, HOST_RSS_MB, HOST_RSS_PEAK_MB

log = logging.getLogger("msbridge")

MB = 2.0 ** 20


def _statm_rss() -> Optional[float]:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB
    except (OSError, ValueError, IndexError):
        return None


def _psutil_rss() -> Optional[float]:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().memory_info().rss / MB


def host_rss_mb() -> Optional[float]:
    """This process's resident memory in MB (None when neither /proc nor psutil can tell)."""
    rss = _statm_rss()
    return rss if rss is not None else _psutil_rss()


def host_rss_peak_mb() -> Optional[float]:
    """This process's peak resident memory in MB since it started or since the last ``reset_host_peak``
    (``VmHWM``; None off Linux)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_host_peak() -> bool:
    """Start a new host peak at the current RSS (Linux ``clear_refs`` 5); False when it is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _device_api() -> Optional[Dict[str, Callable[[], int]]]:
    try:
        from mindspore import runtime
    except ImportError:
        return None
    allocated = getattr(runtime, "memory_allocated", None)
    peak = getattr(runtime, "max_memory_allocated", None)
    if allocated is None or peak is None:
        return None
    return {DEVICE_ALLOCATED_MB: allocated, DEVICE_PEAK_MB: peak}


def _reset_device_peak() -> Optional[Callable[[], None]]:
    from mindspore import runtime

    return getattr(runtime, "reset_max_memory_allocated", None)


class MemoryReader:
    """Reads ``memory/*`` once per flush; the two peaks are the window's (since the previous read, or since
    this reader was made); says once what cannot be read here.

    Args:
        device_target: MindSpore's ``device_target`` (``CPU``: no device memory).

    Example:
        >>> MemoryReader("CPU").read()   # logs once that device memory is not available on CPU
        {'memory/host_rss_mb': 812.3, 'memory/host_rss_peak_mb': 830.0}
    """

    def __init__(self, device_target: str) -> None:
        self.device = None if device_target == "CPU" else _device_api()
        if device_target == "CPU":
            log.info("msbridge: memory: the CPU backend has no device memory pool (mindspore.runtime."
                     "memory_allocated() reports 0 there); recording %s and %s only", HOST_RSS_MB, HOST_RSS_PEAK_MB)
        elif self.device is None:
            log.warning("msbridge: memory: this MindSpore has no mindspore.runtime.memory_allocated / "
                        "max_memory_allocated; recording %s and %s only", HOST_RSS_MB, HOST_RSS_PEAK_MB)
        self._warned_rss = self._warned_peak = False
        self._reset_device = _reset_device_peak() if self.device else None
        self._start_windows()

    def _start_windows(self) -> None:
        """Both peaks start again from now."""
        if self._reset_device is not None:
            self._reset_device()
        if not reset_host_peak() and not self._warned_peak:
            self._warned_peak = True
            log.info("msbridge: memory: /proc/self/clear_refs refused the reset of the RSS high-water mark; "
                     "%s is the peak since the process started", HOST_RSS_PEAK_MB)

    def read(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for name, read in (self.device or {}).items():
            out[name] = read() / MB
        peak = host_rss_peak_mb()
        if peak is not None:
            out[HOST_RSS_PEAK_MB] = peak
        self._start_windows()
        rss = host_rss_mb()
        if rss is not None:
            out[HOST_RSS_MB] = rss
        elif not self._warned_rss:
            self._warned_rss = True
            log.warning("msbridge: memory: cannot read this process's RSS (no /proc/self/statm, psutil not "
                        "installed); %s is not recorded", HOST_RSS_MB)
        return out

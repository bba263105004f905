"""Memory at a flush (``memory: true``): the device's allocated and peak memory, this process's RSS.

Device memory comes from MindSpore's runtime API
(``mindspore.runtime.memory_allocated`` / ``max_memory_allocated``: the memory
pool of the rank's own device, Ascend or GPU). The CPU backend has no device
memory pool (the API reports 0 there), so on CPU only the host RSS is recorded,
and one line says so. Host RSS is read from ``/proc/self/statm`` (Linux), else
with psutil when it is installed.

Example:
    >>> MemoryReader("Ascend").read()
    {'memory/device_allocated_mb': 5120.0, 'memory/device_peak_mb': 6144.0, 'memory/host_rss_mb': 2310.5}
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Dict, Optional

from ..names import DEVICE_ALLOCATED_MB, DEVICE_PEAK_MB, HOST_RSS_MB

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


class MemoryReader:
    """Reads ``memory/*`` once per flush; says once what cannot be read here.

    Args:
        device_target: MindSpore's ``device_target`` (``CPU``: no device memory).

    Example:
        >>> MemoryReader("CPU").read()   # logs once that device memory is not available on CPU
        {'memory/host_rss_mb': 812.3}
    """

    def __init__(self, device_target: str) -> None:
        self.device = None if device_target == "CPU" else _device_api()
        if device_target == "CPU":
            log.info("msbridge: memory: the CPU backend has no device memory pool (mindspore.runtime."
                     "memory_allocated() reports 0 there); recording %s only", HOST_RSS_MB)
        elif self.device is None:
            log.warning("msbridge: memory: this MindSpore has no mindspore.runtime.memory_allocated / "
                        "max_memory_allocated; recording %s only", HOST_RSS_MB)
        self._warned_rss = False

    def read(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for name, read in (self.device or {}).items():
            out[name] = read() / MB
        rss = host_rss_mb()
        if rss is not None:
            out[HOST_RSS_MB] = rss
        elif not self._warned_rss:
            self._warned_rss = True
            log.warning("msbridge: memory: cannot read this process's RSS (no /proc/self/statm, psutil not "
                        "installed); %s is not recorded", HOST_RSS_MB)
        return out

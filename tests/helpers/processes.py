"""Helpers for tests that start real servers and launchers: free ports, process groups, listening sockets.

``free_port``, ``group_alive`` and ``stop_group`` live in ``msbridge.process_group`` (``msbridge view`` and
``msbridge bench`` start servers too); tests import them from here.
"""
from __future__ import annotations

import contextlib
import os
import socket
from typing import Dict, Iterable, List, Set, Tuple

from msbridge.process_group import free_port, group_alive, stop_group

__all__ = ["free_port", "group_alive", "stop_group", "listening", "family", "alive", "command_line"]


def _stats() -> Dict[int, Tuple[str, int, int]]:
    """pid -> (state, ppid, pgid) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(entry)] = (fields[0], int(fields[1]), int(fields[2]))
    return out


def _socket_inodes(pid: int) -> Set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
    return inodes


def _listening_inodes() -> Dict[str, Tuple[str, int]]:
    """inode -> (address, port) of every TCP socket in LISTEN state (IPv4 and IPv6)."""
    out = {}
    for table, family, size in (("/proc/net/tcp", socket.AF_INET, 4), ("/proc/net/tcp6", socket.AF_INET6, 16)):
        with contextlib.suppress(OSError), open(table) as fh:
            for line in fh.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A":
                    continue
                hex_ip, hex_port = cols[1].split(":")
                raw = bytes.fromhex(hex_ip)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))  # each 32-bit word is little-endian
                out[cols[9]] = (socket.inet_ntop(family, raw), int(hex_port, 16))
    return out


def listening(pids: Iterable[int]) -> List[Tuple[str, int, int]]:
    """(address, port, pid) of every listening TCP socket the processes ``pids`` hold."""
    table = _listening_inodes()
    return sorted({(*table[inode], pid) for pid in pids for inode in _socket_inodes(pid) if inode in table})


def family(root: int, ports: Iterable[int] = ()) -> Set[int]:
    """Live processes that descend from ``root``, plus the process groups (and their descendants) of the
    processes listening on ``ports``: a server that detached from ``root`` is still found by its port."""
    stats = _stats()
    table = _listening_inodes()
    wanted_ports = set(ports)
    groups = {stats[pid][2] for pid in stats
              if any(table.get(inode, ("", -1))[1] in wanted_ports for inode in _socket_inodes(pid))}
    found = {root} | {pid for pid, (_, _, pgid) in stats.items() if pgid in groups}
    while True:
        more = {pid for pid, (_, ppid, _) in stats.items() if ppid in found} - found
        if not more:
            break
        found |= more
    return {pid for pid in found if pid in stats and stats[pid][0] != "Z"}


def alive(pids: Iterable[int]) -> Set[int]:
    """Those of ``pids`` that still run (zombies do not count)."""
    stats = _stats()
    return {pid for pid in pids if pid in stats and stats[pid][0] != "Z"}


def command_line(pid: int) -> str:
    """The command line of process ``pid``, its arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""

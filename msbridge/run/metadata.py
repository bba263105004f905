"""Run metadata and the run README, written for every run without being asked.

At start the global rank writes ``{run_dir}/run.json`` and ``{run_dir}/README.md``
(command line, versions, host, git commit, resolved config, sinks and the
commands to look at them). At the end the README gains the outcome. Everything
passes through ``mask_secrets`` first. Writing never raises for the file system:
it runs inside MindSpore's hooks, where an exception would end training.

Example:
    >>> meta = collect_metadata(config_dict, world_size=1, expected_steps=300)
    >>> write_run_files(run_dir, meta, readme_text)
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
import time
import uuid
from importlib import metadata as importlib_metadata
from typing import Any, Dict, Mapping, Optional, Set, Tuple

from ..masking import mask_command, mask_secrets, mask_text
from ..paths import free_space, view_commands
from ..sinks.base import json_safe
from .cost import KEY as COST_KEY, describe as describe_cost

log = logging.getLogger("msbridge")

RUN_JSON = "run.json"
README = "README.md"
#: A sink's key in run.json's ``sinks`` once ``msbridge replay`` wrote it elsewhere: where the run wrote it ("" none).
REPLAYED_FROM = "replayed from"
#: Kept in the run dir from the start to the outcome (global rank), so that a full disk cannot keep the
#: outcome out of run.json and README.md: released just before they are written (docs/sinks.md).
RESERVE = ".outcome-reserve"
RESERVE_BYTES = 64 * 1024


def reserve_space(run_dir: str, size: int = RESERVE_BYTES) -> bool:
    """Hold ``size`` bytes of the run dir's file system for the outcome; False when there is no room."""
    path = os.path.join(run_dir, RESERVE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        log.warning("msbridge: cannot reserve %d KiB for the outcome in %s (%s); a full disk may keep it out of "
                    "run.json", size // 1024, run_dir, exc.strerror or exc)
        return False
    return True


def release_space(run_dir: str) -> None:
    """Give the reserved space back, just before the outcome is written."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(run_dir, RESERVE))


def stored_run_name(run_dir: str) -> Optional[str]:
    """The ``run_name`` in ``run_dir``'s run.json; None when there is none (or it cannot be read)."""
    try:
        with open(os.path.join(run_dir, RUN_JSON), encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return None
    name = meta.get("run_name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def run_id_for(run_dir: str) -> str:
    """Stable run id: every rank and every resume of one run dir agree on it without talking."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "msbridge:" + os.path.abspath(run_dir)).hex


def _version(dist: str) -> Optional[str]:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def _git(cwd: str) -> Dict[str, Any]:
    def run(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(("git",) + args, cwd=cwd, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = run("rev-parse", "HEAD")
    if not commit:
        return {}
    return {"commit": commit, "dirty": bool(run("status", "--porcelain", "--untracked-files=no"))}


def collect_metadata(config: Mapping[str, Any], world_size: int, expected_steps: Optional[int] = None,
                     parallel_mode: str = "data_parallel", code_dir: Optional[str] = None) -> Dict[str, Any]:
    """Everything a later reader needs to know what this run was."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else os.getcwd()
    return mask_secrets({
        "command": mask_command(sys.argv),
        "cwd": os.getcwd(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "expected_steps": expected_steps,
        "world_size": world_size,
        "parallel_mode": parallel_mode if world_size > 1 else "standalone",
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "versions": {
            "msbridge": _version("msbridge"),
            "mindspore": _version("mindspore"),
            "mindformers": _version("mindformers"),
            "python": platform.python_version(),
        },
        "git": _git(code_dir or os.path.dirname(script)),
        "config": dict(config),
    })


def render_readme(run_name: str, run_id: str, meta: Mapping[str, Any],
                  sinks: Mapping[str, Mapping[str, str]], run_dir: str,
                  outcome: Optional[Mapping[str, Any]] = None, failed: Optional[Mapping[str, str]] = None) -> str:
    """The run README: what ran, where it writes, how to look at it, and (at the end) how it went.
    ``failed``: sink name -> its error; a sink that failed to open is not in ``sinks``."""
    versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items() if v)
    git = meta.get("git") or {}
    lines = [
        f"# {_one_line(run_name)}",
        "",
        f"- run id: `{run_id}`",
        f"- command: `{_one_line(str(meta.get('command', '')))}`",
        f"- started: {meta.get('start_time')}; expected steps: {meta.get('expected_steps') or 'unknown'}",
        f"- world size: {meta.get('world_size')} ({meta.get('parallel_mode')}); host: {meta.get('host')}",
        f"- versions: {versions}",
    ]
    if git:
        lines.append(f"- git: {git['commit']}{' (dirty)' if git.get('dirty') else ''}")
    lines += ["", "## Sinks", ""]
    lines += [f"- **{name}**: {info.get('where', '')}{_opened_at(info)}{_replayed(info)}"
              for name, info in sinks.items()]
    if failed:
        lines += ["", "## Sinks that failed", ""]
        lines += [f"- **{name}** failed in {why}" + ("" if name in sinks else "; it holds nothing of this run "
                                                         "(the jsonl log has every record: `msbridge replay`)")
                  for name, why in failed.items()]
    lines += ["", "## Look at it", "", "```"] + view_commands(run_dir, sinks) + ["```"]
    if outcome:
        lines += ["", "## Outcome", ""]
        lines += [f"- {key}: {_outcome_value(key, value)}" for key, value in outcome.items()]
    lines += ["", "## Resolved config", "", "```json", _strict_json(meta.get("config", {})), "```", ""]
    return mask_text("\n".join(lines))


def _outcome_value(key: str, value: Any) -> Any:
    """An outcome's value as the README says it: the monitoring cost as one sentence (run.json keeps its figures)."""
    if key == COST_KEY and isinstance(value, Mapping):
        return describe_cost(value)
    return value


def _opened_at(info: Mapping[str, str]) -> str:
    """After a sink's place in the README: the page that opens this run in its tracker's UI (``url``), if any."""
    return f"; open it: {info['url']}" if info.get("url") else ""


def _replayed(info: Mapping[str, str]) -> str:
    """After a sink's place in the README: that ``msbridge replay`` put it there, and where the run wrote it."""
    if REPLAYED_FROM not in info:
        return ""
    first = info[REPLAYED_FROM]
    return "; written there by `msbridge replay`" + (f" (the run wrote it to {first})" if first else "")


_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")


def _one_line(text: str) -> str:
    """``text`` with each line break or control character as one space (a README heading stays one line)."""
    return _BREAKS.sub(" ", text)


def _strict_json(value: Any) -> str:
    """``value`` as strict JSON (every parser reads it): NaN and infinities as the strings ``"nan"``, ``"inf"``."""
    return json.dumps(json_safe(value), indent=2, default=str, allow_nan=False)


def write_outcome(run_dir: str, meta: Mapping[str, Any], outcome: Mapping[str, Any]) -> Dict[str, Any]:
    """run.json and README.md of ``meta`` (a run.json's content) with ``outcome`` added; returns the new run.json."""
    meta = dict(meta, outcome=dict(outcome))
    release_space(run_dir)
    readme = render_readme(meta.get("run_name", ""), meta.get("run_id", ""), meta, meta.get("sinks") or {},
                           run_dir, outcome=outcome, failed=meta.get("failed_sinks"))
    write_run_files(run_dir, meta, readme)
    return meta


def write_run_files(run_dir: str, meta: Mapping[str, Any], readme: str) -> bool:
    """Write run.json and README.md atomically (a reader never sees half a file), secrets masked.

    Never raises for the file system (it runs inside MindSpore's hooks): a failed write leaves the
    previous complete file and no temp file, is logged once per run dir and cause (a full disk with
    the path and the space left), and returns False.
    """
    target = run_dir
    try:
        os.makedirs(run_dir, exist_ok=True)
        for name, text in ((RUN_JSON, _strict_json(mask_secrets(dict(meta)))),
                           (README, mask_text(readme))):
            target = os.path.join(run_dir, name)
            _atomic_write(target, text)
    except OSError as exc:
        _tell_once(run_dir, target, exc)
        return False
    return True


def _atomic_write(path: str, text: str) -> None:
    """``text`` to ``path`` through a temp file in the same dir; the temp file is gone whatever happens."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_told: Set[Tuple[str, Optional[int]]] = set()


def _tell_once(run_dir: str, path: str, exc: OSError) -> None:
    key = (os.path.abspath(run_dir), exc.errno)
    if key in _told:
        return
    _told.add(key)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        log.error("msbridge: the disk is full: cannot write %s (%s free on that file system); run.json and "
                  "README.md keep their last complete version", path, free_space(run_dir))
    else:
        log.error("msbridge: cannot write %s: %s; run.json and README.md keep their last complete version",
                  path, exc.strerror or exc)

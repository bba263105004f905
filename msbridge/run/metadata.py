"""Run metadata and the run README, written for every run without being asked.

At start the global rank writes ``{run_dir}/run.json`` and ``{run_dir}/README.md``
(command line, versions, host, git commit, resolved config, sinks and the
commands to look at them). At the end the README gains the outcome. Everything
passes through ``mask_secrets`` first.

Example:
    >>> meta = collect_metadata(config_dict, world_size=1, expected_steps=300)
    >>> write_run_files(run_dir, meta, readme_text)
"""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from importlib import metadata as importlib_metadata
from typing import Any, Dict, List, Mapping, Optional

from ..masking import mask_secrets, mask_text

RUN_JSON = "run.json"
README = "README.md"


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
        "command": " ".join(sys.argv),
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


def view_commands(run_dir: str, sinks: Mapping[str, Mapping[str, str]]) -> List[str]:
    """The exact commands to look at this run, every UI bound to 127.0.0.1."""
    commands = [f"msbridge plot {run_dir}", f"msbridge diagnose {run_dir}"]
    commands += [info["view"] for info in sinks.values() if info.get("view")]
    return [mask_text(c) for c in commands]


def render_readme(run_name: str, run_id: str, meta: Mapping[str, Any],
                  sinks: Mapping[str, Mapping[str, str]], run_dir: str,
                  outcome: Optional[Mapping[str, Any]] = None) -> str:
    """The run README: what ran, where it writes, how to look at it, and (at the end) how it went."""
    versions = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items() if v)
    git = meta.get("git") or {}
    lines = [
        f"# {run_name}",
        "",
        f"- run id: `{run_id}`",
        f"- command: `{meta.get('command', '')}`",
        f"- started: {meta.get('start_time')}; expected steps: {meta.get('expected_steps') or 'unknown'}",
        f"- world size: {meta.get('world_size')} ({meta.get('parallel_mode')}); host: {meta.get('host')}",
        f"- versions: {versions}",
    ]
    if git:
        lines.append(f"- git: {git['commit']}{' (dirty)' if git.get('dirty') else ''}")
    lines += ["", "## Sinks", ""]
    lines += [f"- **{name}**: {info.get('where', '')}" for name, info in sinks.items()]
    lines += ["", "## Look at it", "", "```"] + view_commands(run_dir, sinks) + ["```"]
    if outcome:
        lines += ["", "## Outcome", ""]
        lines += [f"- {key}: {value}" for key, value in outcome.items()]
    lines += ["", "## Resolved config", "", "```json", json.dumps(meta.get("config", {}), indent=2, default=str), "```", ""]
    return mask_text("\n".join(lines))


def write_outcome(run_dir: str, meta: Mapping[str, Any], outcome: Mapping[str, Any]) -> Dict[str, Any]:
    """run.json and README.md of ``meta`` (a run.json's content) with ``outcome`` added; returns the new run.json."""
    meta = dict(meta, outcome=dict(outcome))
    readme = render_readme(meta.get("run_name", ""), meta.get("run_id", ""), meta, meta.get("sinks") or {},
                           run_dir, outcome=outcome)
    write_run_files(run_dir, meta, readme)
    return meta


def write_run_files(run_dir: str, meta: Mapping[str, Any], readme: str) -> None:
    """Write run.json and README.md atomically (a reader never sees half a file)."""
    os.makedirs(run_dir, exist_ok=True)
    _atomic_write(os.path.join(run_dir, RUN_JSON), json.dumps(meta, indent=2, default=str))
    _atomic_write(os.path.join(run_dir, README), readme)


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)

"""docs/extending.md, run as written: every code block of the guide is run here, so the guide cannot drift.

The files the guide shows (``# my-pkg/...`` on their first line) are written into a temporary project, which
pip installs (no network: ``--no-build-isolation``) into a directory of its own; that installed distribution's
entry points are the registration. Then its tests and doctests run, each shell command of the guide runs as
printed (the demo trains with the plug-in sink and the plug-in check), and what they wrote is read back. The
dialect key's entry is added to ``HANDLERS`` for one test and the guide's test of it is run.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from msbridge.config import dialects
from msbridge.config.load import load_config
from msbridge.sinks import registry
from msbridge.sinks.base import RunInfo
from msbridge.sinks.runlog import rank_file, read_rank_file

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
_BLOCK = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
BIN = Path(sys.executable).parent


def guide_blocks() -> List[Tuple[str, str]]:
    """``(language, code)`` of every fenced block of the guide, in order, dedented."""
    return [(lang, textwrap.dedent(code)) for _, lang, code in _BLOCK.findall(GUIDE.read_text(encoding="utf-8"))]


def guide_files() -> Dict[str, str]:
    """The blocks that name their file on their first line: ``{"my-pkg/my_pkg/csv_sink.py": code}``."""
    out = {}
    for _, code in guide_blocks():
        first = code.splitlines()[0]
        if first.startswith("# my-pkg/"):
            out[first[2:].strip()] = code
    return out


def guide_commands() -> List[str]:
    return [code.strip() for lang, code in guide_blocks() if lang == "bash"]


def test_every_block_of_the_guide_is_run_here():
    """Each block is a file of my-pkg, a shell command, or one of the dialect key's two blocks."""
    blocks = guide_blocks()
    files, commands = guide_files(), guide_commands()
    dialect = [code for lang, code in blocks if lang == "python" and not code.startswith("# my-pkg/")]
    assert len(files) + len(commands) + len(dialect) == len(blocks)
    assert sorted(files) == ["my-pkg/my_pkg/csv_sink.py", "my-pkg/my_pkg/loss_ceiling.py", "my-pkg/pyproject.toml",
                             "my-pkg/tests/test_csv_sink.py", "my-pkg/tests/test_loss_ceiling.py"]
    assert len(commands) == 2 and len(dialect) == 2
    assert len(files["my-pkg/my_pkg/csv_sink.py"].splitlines()) <= 60, "the guide's CSV sink is at most 60 lines"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """my-pkg written from the guide and pip-installed into ``site``; returns (work dir, site dir, env)."""
    work = tmp_path_factory.mktemp("guide")
    for path, code in guide_files().items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(code, encoding="utf-8")
    (work / "my-pkg" / "my_pkg" / "__init__.py").write_text("")
    site = work / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(work / "my-pkg")],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(site), GLOG_v="3", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return work, site, env


def run_in(work: Path, env: Dict[str, str], command: List[str], shell: bool = False) -> str:
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900, shell=shell)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_the_plugin_tests_and_doctests_pass(installed):
    """The guide's two tests, and the examples in its classes' docstrings, against the installed package."""
    work, site, env = installed
    out = run_in(work, env, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules",
                             str(work / "my-pkg" / "tests"), str(site / "my_pkg")])
    assert re.search(r"\b5 passed\b", out), out


def demo_run_dir(stdout: str) -> str:
    return next(line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith("  run dir"))


def run_info(run_dir: str) -> RunInfo:
    return RunInfo(run_id="", run_name=os.path.basename(run_dir), experiment="", rank=0, world_size=1,
                   is_global=True, run_dir=run_dir)


@pytest.mark.slow
def test_the_demo_writes_the_csv_sink_and_it_reads_back_what_jsonl_holds(installed, monkeypatch):
    work, site, env = installed
    run_dir = demo_run_dir(run_in(work, env, guide_commands()[0], shell=True))
    monkeypatch.syspath_prepend(str(site))
    csv_sink = registry.resolve("csv")  # through the installed entry point
    assert csv_sink.__module__ == "my_pkg.csv_sink" and "csv" in registry.available()
    wal = read_rank_file(rank_file(run_dir, 0))
    got = csv_sink().read_back(run_info(run_dir))
    assert [s for s, _ in got["train/loss"]] == list(range(1, 61))  # coverage first
    for name in wal.metric_names():
        want = wal.series(name)
        assert [s for s, _ in got[name]] == [s for s, _ in want], name
        for (_, value), (_, expected) in zip(got[name], want):
            assert value == expected or (math.isnan(value) and math.isnan(expected)), name  # repr round-trips
    events = {name: points for name, points in got.items() if name not in wal.metric_names()}
    assert events == wal.event_series(), "every event read back as events/<kind>, at its step"


@pytest.mark.slow
def test_the_demo_runs_the_plugin_check_and_acts_on_it(installed):
    work, _, env = installed
    run_dir = demo_run_dir(run_in(work, env, guide_commands()[1], shell=True))
    events = read_rank_file(rank_file(run_dir, 0)).events
    found = [ev for ev in events if ev.kind == "anomaly" and ev.detail.get("check") == "loss_ceiling"]
    assert found and found[0].detail["limit"] == 3.0 and found[0].detail["loss"] > 3.0
    assert found[0].detail["action"] == "dump", "the debug profile's default action of the check"


def test_the_dialect_key_and_its_test(monkeypatch, tmp_path):
    """The HANDLERS entry of the guide, added to ``msbridge.config.dialects``, and the guide's test of it."""
    entry, test = [code for lang, code in guide_blocks() if lang == "python" and not code.startswith("# my-pkg/")]
    handlers = eval("{" + entry + "}", vars(dialects))  # the entry as it is written into the dict literal
    for key, handler in handlers.items():
        monkeypatch.setitem(dialects.HANDLERS, key, handler)
    scope = {"load_config": load_config}
    exec(compile(test, str(GUIDE), "exec"), scope)
    [name] = [n for n in scope if n.startswith("test_")]
    scope[name](tmp_path)

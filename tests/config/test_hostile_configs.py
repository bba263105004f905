"""The second hostile-config corpus (``hostile_config_cases.py``), run as users run it: ``msbridge config check
run.yaml``, the console script, one process per case, under a CPU limit and a wall-clock timeout.

Every case: exit code 1, no traceback, no hang, within ``CPU_S``; every problem line names the file and line,
one holds the key and what is wrong (and the nearest valid key for a misspelt one). Then the same cases through
``BridgeMonitor.from_yaml`` (``tests/helpers/from_yaml_corpus.py``): refused there too, as a clear problem,
never a raw OSError. The controls, valid configs at each class's edge, are accepted by both: ``config check``
accepts nothing that ``from_yaml`` refuses, and refuses nothing merely for being near an edge.
"""
from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hostile_config_cases import controls, hostile_cases

pytestmark = pytest.mark.slow  # about 130 console-script runs: 2 to 4 minutes here
CASES = hostile_cases()
CONTROLS = controls()
CPU_S = 10  # the console script's own CPU seconds per case, its start-up included (about 0.5 s here)
HANG_S = 120  # wall seconds: a case that waits on nothing still ends
MSBRIDGE = os.path.join(os.path.dirname(sys.executable), "msbridge")
FROM_YAML_RUNNER = Path(__file__).resolve().parents[1] / "helpers" / "from_yaml_corpus.py"
WHERE = re.compile(r"^  run\.yaml:\d+: ")


def _limit_cpu():
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, CPU_S + 1))  # beyond it: SIGXCPU, a failed case


def _make(root: Path, name: str, case) -> Path:
    case_dir = root / name
    case_dir.mkdir()
    if case.setup:
        case.setup(str(case_dir))
    (case_dir / "run.yaml").write_text(case.yaml, encoding="utf-8")
    return case_dir


def _check(case_dir: Path) -> dict:
    try:
        done = subprocess.run([MSBRIDGE, "config", "check", "run.yaml"], cwd=case_dir, capture_output=True,
                              text=True, timeout=HANG_S, preexec_fn=_limit_cpu, env=dict(os.environ, GLOG_v="3"))
    except subprocess.TimeoutExpired:
        return {"code": "hang", "out": "", "err": ""}
    return {"code": done.returncode, "out": done.stdout, "err": done.stderr}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every case and control: the console script's answer, and from_yaml's (name -> (check, from_yaml))."""
    root = tmp_path_factory.mktemp("hostile")
    dirs = {name: _make(root, name, case) for name, case in {**CASES, **CONTROLS}.items()}
    with ThreadPoolExecutor(2) as pool:  # this machine's 2 CPUs
        checks = dict(zip(dirs, pool.map(_check, dirs.values())))
    done = subprocess.run([sys.executable, str(FROM_YAML_RUNNER), str(root)], capture_output=True, text=True,
                          timeout=60 + 15 * len(dirs), env=dict(os.environ, GLOG_v="3"))
    assert done.returncode == 0, done.stderr[-3000:]
    built = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert sorted(built) == sorted(dirs)
    return {name: (checks[name], built[name]) for name in dirs}


def test_the_corpus_is_big_enough_and_covers_each_class():
    assert len(CASES) >= 100
    for family in ("output_dir-", "experiment_dir-", "dump_dir-", "tensorboard_logdir-", "chain-", "10000-",
                   "uri-port", "uri-sqlite", "alert-"):
        assert sum(name.startswith(family) for name in CASES) >= 3, family


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_check_refuses_with_where_and_what(corpus, name):
    check, _ = corpus[name]
    out = check["out"]
    assert check["code"] == 1, check  # 0: wrongly accepted; -24 (SIGXCPU): over CPU_S; "hang": over HANG_S
    assert "Traceback" not in out + check["err"], check["err"][-2000:]
    lines = out.splitlines()
    assert re.match(r"run\.yaml: \d+ problems?:$", lines[0]), out[:2000]
    assert all(WHERE.match(line) for line in lines[1:]), [line for line in lines[1:] if not WHERE.match(line)][:3]
    wanted = CASES[name].expected
    assert any(all(part in line for part in wanted) and line.find(wanted[0]) <= line.find(wanted[-1])
               for line in lines[1:]), (wanted, lines[1:4])


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_yaml_refuses_it_too_as_a_clear_problem(corpus, name):
    _, built = corpus[name]
    assert built["outcome"] == "refused", built


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_a_config_at_the_edge_is_accepted_by_both(corpus, name):
    check, built = corpus[name]
    assert check["code"] == 0 and ": ok (" in check["out"], check
    assert built["outcome"] == "accepted", built

"""A secret planted in a run name's template or in a config written on the command line is nowhere:
not in any file of the run or experiment dir (jsonl, run.json, README, TensorBoard and MindInsight
event files, MLflow's sqlite store and artifacts), not on the console. Real ``msbridge demo`` runs.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

SINKS = "sinks=[jsonl, tensorboard, mlflow, mindinsight]"


def _demo(tmp_path: Path, *sets: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "msbridge.cli.main", "demo", "--steps", "3", "--out", str(tmp_path / "out")]
    return subprocess.run(args + [a for s in sets for a in ("--set", s)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600, env=dict(os.environ, GLOG_v="3"))


def _files_holding(root: Path, secret: bytes) -> list:
    """Every file under ``root`` whose bytes hold ``secret`` (as ``grep -r`` would find it, binary files too)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_a_config_written_on_the_command_line_is_masked_everywhere(tmp_path):
    secret = "PLANTED-cmdline-7f3a"
    done = _demo(tmp_path, SINKS, f'params.extra={{"api_key": "{secret}", "note": "kept"}}')
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in written) and any("tfevents" in p.name for p in written)
    assert any(p.name.endswith("_MS") or ".summary." in p.name for p in written), written  # MindInsight's file
    run_json = next(out.rglob("run.json")).read_text()
    assert '"api_key": "***"' in run_json and "kept" in run_json  # the command's config, masked, not dropped
    assert _files_holding(out, secret.encode()) == []
    assert secret not in done.stdout + done.stderr


def test_a_run_name_template_naming_a_secret_is_refused_and_written_nowhere(tmp_path):
    secret = "PLANTED-runname-91c2"
    done = _demo(tmp_path, SINKS, f"params.api_key={secret}", "run_name=r-{params.api_key}")
    assert done.returncode != 0
    assert "run_name: 'r-{params.api_key}' references {params.api_key}, which looks like a secret" in done.stderr
    assert "Traceback" not in done.stderr
    out = tmp_path / "out"
    assert not out.exists() or _files_holding(out, secret.encode()) == []
    assert secret not in done.stdout + done.stderr
    done = _demo(tmp_path, SINKS, f"params.api_key={secret}", "run_name=r-${params.api_key}")
    assert done.returncode != 0 and "run_name: ${params.api_key} puts a secret" in done.stderr
    assert secret not in done.stdout + done.stderr

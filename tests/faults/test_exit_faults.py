"""``msbridge demo`` exits non-zero when its run ends FAILED: a health action stopping training is not a success."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from msbridge.run.outcome import EXIT_FAILED

pytestmark = pytest.mark.slow


def test_demo_stopped_by_a_health_action_exits_with_the_failed_code(tmp_path):
    stop_at_once = ["health.warmup_steps=0", "health.grad_norm_spike.action=stop",
                    "health.grad_norm_spike.threshold=0.000001", "sinks=[jsonl]"]
    args = [sys.executable, "-m", "msbridge.cli.main", "demo", "--steps", "30", "--out", str(tmp_path / "out")]
    done = subprocess.run(args + [a for s in stop_at_once for a in ("--set", s)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, env=dict(os.environ, GLOG_v="3"))
    assert done.returncode == EXIT_FAILED, done.stderr[-2000:]
    [run_json] = glob.glob(str(tmp_path / "out" / "*" / "*" / "run.json"))
    with open(run_json, encoding="utf-8") as fh:
        outcome = json.load(fh)["outcome"]
    assert outcome["status"] == "FAILED" and outcome["stopped by"].startswith("grad_norm_spike")
    assert f"[msbridge] the run ended FAILED (exit code {EXIT_FAILED}; the outcome is in " in done.stderr
    assert "Traceback" not in done.stderr

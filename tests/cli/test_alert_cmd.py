"""``msbridge alert test``: one test message to each target, which answered, exit code 1 if one did not."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from helpers.webhook_server import WebhookServer, refused_url


@pytest.mark.slow
def test_alert_test_says_which_target_answered_and_fails_when_one_did_not(tmp_path):
    with WebhookServer(secrets={"lark": "SECx"}) as server:
        targets = [{"type": "lark", "url": server.url("lark/open-apis/bot/v2/hook/TOKENabc"), "secret": "SECx"},
                   {"type": "slack", "url": refused_url("slack/services/T/B/TOKENdef")}]
        (tmp_path / "monitor.yaml").write_text(yaml.safe_dump({"alerts": {"targets": targets, "retries": 0}}))
        done = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "alert", "test", "--config", "monitor.yaml"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        ok = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "alert", "test", "--config", "monitor.yaml",
                             "--set", "alerts.targets=" + yaml.safe_dump(targets[:1], default_flow_style=True).strip()],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "target 1 (lark): answered" in done.stdout
    assert "target 2 (slack): FAILED: not reachable" in done.stdout
    assert "TOKEN" not in done.stdout + done.stderr
    assert [r.verdict for r in server.received] == ["ok", "ok"]  # signed as Feishu documents it
    assert "test alert" in str(server.received[0].body)
    assert ok.returncode == 0 and ok.stdout.count("answered") == 1, ok.stdout + ok.stderr


def test_alert_test_without_targets_is_an_error_not_a_traceback(tmp_path):
    (tmp_path / "monitor.yaml").write_text("experiment: x\n")
    done = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "alert", "test", "--config", "monitor.yaml"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "alerts.targets is empty or absent" in done.stderr
    assert "Traceback" not in done.stderr

"""examples/alerts/preview.py (docs/alerts.md's picture) draws every target's real request."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_preview_page_shows_each_targets_message(tmp_path):
    out = tmp_path / "alerts.html"
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "alerts", "preview.py"), str(out)], check=True,
                   timeout=120)
    page = out.read_text(encoding="utf-8")
    for tool in ("Slack", "Feishu / Lark", "DingTalk", "WeCom", "generic webhook"):
        assert f"<div class='tool'>{tool}" in page
    assert page.count("non-finite values at step 20 on rank 0: train/loss") == 5
    assert "no step has ended for 912 s on rank 1 (last step 3120; last seen in the collective)" in page

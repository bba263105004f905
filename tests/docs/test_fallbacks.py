"""Each documented fallback is read from the code: the objective a run follows when ``objective.metric`` is
null (``names.DEFAULT_OBJECTIVES``) is the one configuration.md, metrics.md, cli.md and ``compare --help`` name."""
from __future__ import annotations

import re
from pathlib import Path

from msbridge.cli.main import build_parser
from msbridge.names import DEFAULT_OBJECTIVES, objective_metric

ROOT = Path(__file__).resolve().parents[2]


def flat(text: str) -> str:
    """Text with backticks dropped and whitespace runs as one space (a sentence wrapped or in a table)."""
    return re.sub(r"\s+", " ", text.replace("`", ""))


def test_the_run_follows_the_documented_order():
    assert DEFAULT_OBJECTIVES == ("eval/global_loss", "eval/loss", "train/global_loss", "train/loss")
    assert objective_metric(None, {"train/loss", "train/global_loss"}) == "train/global_loss"
    assert objective_metric(None, {"train/global_loss", "eval/loss"}) == "eval/loss"


def test_every_page_names_the_code_s_fallback():
    order = "the first of " + ", ".join(DEFAULT_OBJECTIVES)
    for page in ("docs/configuration.md", "docs/metrics.md", "docs/cli.md"):
        assert order in flat((ROOT / page).read_text(encoding="utf-8")), page
    compare = build_parser()._subparsers._group_actions[0].choices["compare"]
    assert flat(compare.format_help()).count(", ".join(DEFAULT_OBJECTIVES)) == 1


def test_no_page_names_the_old_fallback():
    """What configuration.md and ``compare --help`` said before: train/loss, where a run follows train/global_loss."""
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        text = flat(page.read_text(encoding="utf-8"))
        assert "else train/loss" not in text and "eval/loss by default" not in text, page.name

"""Every relative link of README.md and docs/*.md names a file that exists and, with ``#anchor``, a heading in it
(GitHub's anchors: lower case, punctuation dropped, spaces as hyphens, ``-1``, ``-2`` for repeated headings)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set, Tuple

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text.

    Example:
        >>> anchor("`msbridge view`: one line each")
        'msbridge-view-one-line-each'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> Set[str]:
    seen: Set[str] = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if line.startswith("#"):
            base = anchor(line.lstrip("#"))
            name, n = base, 0
            while name in seen:
                n += 1
                name = f"{base}-{n}"
            seen.add(name)
    return seen


def links(page: Path) -> List[Tuple[str, str]]:
    """``(path, anchor)`` of each relative link outside code blocks (path "" for the page itself)."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    out = []
    for target in _LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, fragment = target.partition("#")
        out.append((path, fragment))
    return out


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for path, fragment in links(page):
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {path} does not exist")
            elif fragment and target.suffix == ".md" and fragment not in anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {path}#{fragment} names no heading")
    assert broken == []


def test_the_anchor_rule_on_headings_these_pages_use():
    assert anchor(" Scale simulation: what rank 0 pays at 8 to 16,384 ranks") == \
        "scale-simulation-what-rank-0-pays-at-8-to-16384-ranks"
    assert anchor(" Training loops without callbacks (`msbridge.track`)") == \
        "training-loops-without-callbacks-msbridgetrack"
    assert len(links(ROOT / "README.md")) >= 20

"""Every docstring example in msbridge runs as a doctest, so an example cannot go stale unnoticed.

The modules are discovered (every ``.py`` file of ``msbridge/`` and ``adapters/`` that holds a ``>>>``), never
listed by hand: a new module's examples run the day it is added. An example that cannot run here is named in
``SKIP`` with the reason; a ``SKIP`` entry that names no example fails, so the list cannot outlive its reasons.
"""
from __future__ import annotations

import doctest
import importlib
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Where each importable package's files are (``adapters/`` is installed as ``msbridge.adapters``).
PACKAGES = {"msbridge": ROOT / "msbridge", "msbridge.adapters": ROOT / "adapters"}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: Doctest name -> why its examples do not run here. A name is a module (its own docstring), a
#: ``module.Qualified.name``, or ``module.*`` (every example in the module).
SKIP: Dict[str, str] = {
}


def _modules() -> List[str]:
    found = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts or ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if package == "msbridge" and parts[:1] == ("adapters",):
                continue
            found.append(".".join((package, *parts)))
    return found


MODULES = _modules()


def _covers(key: str, name: str) -> bool:
    return name == key or (key.endswith(".*") and (name == key[:-2] or name.startswith(key[:-1])))


def _skip_reason(name: str) -> str:
    return next((why for key, why in SKIP.items() if _covers(key, name)), "")


def _doctests(module_name: str) -> List[doctest.DocTest]:
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(module, module_name) if t.examples and t.name.startswith(module_name)]


def test_the_modules_are_discovered():
    assert len(MODULES) > 50 and "msbridge.names" in MODULES and "msbridge.adapters.jsonl_sink" in MODULES


def test_every_skip_names_an_example():
    names = {t.name for m in MODULES for t in _doctests(m)}
    stale = [key for key in SKIP if not any(_covers(key, n) for n in names)]
    assert not stale, f"SKIP entries that name no docstring example (remove them): {stale}"


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    tests = [t for t in _doctests(module_name) if not _skip_reason(t.name)]
    if not tests:
        pytest.skip(f"every example of {module_name} is in SKIP: {_skip_reason(module_name + '.*') or 'see SKIP'}")
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    failed = []
    for test in tests:
        result = runner.run(test, out=lambda text: failed.append(text))
        assert result.attempted > 0, test.name
    assert not failed, "".join(failed)

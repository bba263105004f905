"""pyproject.toml lists every package folder: a folder left out installs from a checkout (``pip install -e``
finds it on disk) and is missing from the wheel (``msbridge.alerts`` was, until this test)."""
from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_in_the_package_list():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "msbridge").rglob("__init__.py")}
    for package, folder in setuptools["package-dir"].items():  # msbridge.adapters is the top-level adapters/ folder
        on_disk |= {".".join([package, *init.parent.relative_to(ROOT / folder).parts])
                    for init in (ROOT / folder).rglob("__init__.py")}
    assert {"msbridge.bench", "msbridge.adapters", "msbridge.adapters.mlflow_tracker.store"} <= on_disk
    assert sorted(on_disk) == sorted(setuptools["packages"])

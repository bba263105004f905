"""Sink registry: built-ins, third-party entry points, missing extras, lazy imports."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from msbridge.errors import ConfigError, MissingDependencyError
from msbridge.sinks import registry


def test_builtins_resolve():
    assert registry.resolve("jsonl").name == "jsonl"
    assert registry.available()[:4] == ("jsonl", "tensorboard", "mlflow", "mindinsight")


def test_unknown_name_lists_registered():
    with pytest.raises(ConfigError, match="registered sinks: jsonl, tensorboard, mlflow, mindinsight"):
        registry.resolve("wandb")


def test_third_party_sink_through_entry_point(tmp_path, monkeypatch):
    """A real installed distribution (a dist-info on sys.path) declaring an msbridge.sinks entry point."""
    (tmp_path / "my_sink.py").write_text(textwrap.dedent("""
        from msbridge.sinks.base import Sink
        class MySink(Sink):
            name = "mysink"
            def write(self, records, events):
                pass
    """))
    info = tmp_path / "my_sink-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-sink\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[msbridge.sinks]\nmysink = my_sink:MySink\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "mysink" in registry.available()
    assert registry.resolve("mysink").__name__ == "MySink"


def test_missing_extra_names_the_pip_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"pip install 'msbridge\[mlflow\]'"):
        registry.check_available("mlflow")


def test_importing_msbridge_imports_no_tracker():
    code = ("import sys, msbridge, msbridge.config.load, msbridge.sinks.registry, msbridge.sinks.runlog;"
            "print(sorted(m for m in ('mlflow','tensorboardX','mindformers','mindspore') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

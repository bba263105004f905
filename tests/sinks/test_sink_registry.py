"""Sink registry: built-ins, third-party entry points, missing extras, lazy imports; what each sink declares."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from msbridge.config.dialects import FORMAT_VALUES, HANDLERS
from msbridge.config.load import load_config
from msbridge.errors import ConfigError, MissingDependencyError
from msbridge.options import Option
from msbridge.sinks import registry
from msbridge.sinks.base import Sink


def test_builtins_resolve():
    assert registry.resolve("jsonl").name == "jsonl"
    assert registry.available()[:4] == registry.builtin_names() == ("jsonl", "tensorboard", "mlflow", "mindinsight")


@pytest.mark.parametrize("name", registry.builtin_names())
def test_every_builtin_declares_itself(name):
    """Typed options, extra and reader live in the adapter class; the registry holds its name and path."""
    cls = registry.sink_class(name)
    assert cls.name == name and cls.ranks in ("all", "global")
    assert cls.options and all(isinstance(o, Option) and o.doc for o in cls.options.values())
    assert all(o.check(o.default) is None for o in cls.options.values()), "every default is valid"
    assert cls.read_back is not Sink.read_back and cls.emit is not Sink.emit
    assert cls.write is Sink.write, "resume skipping stays in Sink.write"
    assert not cls.extra or cls.requires, "an extra installs the packages the sink requires"


def test_the_config_takes_sink_names_from_the_registry():
    """mindformers' ``*_format`` values and the ``<sink>: true`` flags follow the registry."""
    assert FORMAT_VALUES == ("log",) + registry.builtin_names()
    assert set(registry.builtin_names()) <= set(HANDLERS)


def test_unknown_name_lists_registered():
    with pytest.raises(ConfigError, match="registered sinks: jsonl, tensorboard, mlflow, mindinsight"):
        registry.resolve("wandb")


def test_third_party_sink_through_entry_point(tmp_path, monkeypatch):
    """A real installed distribution (a dist-info on sys.path) declaring an msbridge.sinks entry point;
    the config checks its options against its own declaration."""
    (tmp_path / "my_sink.py").write_text(textwrap.dedent("""
        from msbridge.sinks.base import Sink
        from msbridge.options import Option
        class MySink(Sink):
            name = "mysink"
            options = {"endpoint": Option(str, None, "where to send the metrics")}
            def emit(self, records, events):
                pass
    """))
    info = tmp_path / "my_sink-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-sink\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[msbridge.sinks]\nmysink = my_sink:MySink\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "mysink" in registry.available()
    assert registry.resolve("mysink").__name__ == "MySink"
    config = load_config({"sinks": {"mysink": {"endpoint": "http://x"}}})
    assert dict(config.sinks["mysink"]) == {"endpoint": "http://x"}
    with pytest.raises(ConfigError, match=r"sinks.mysink.endpont: unknown option; did you mean 'endpoint'\?"):
        load_config({"sinks": {"mysink": {"endpont": "http://x"}}})


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


def test_naming_sinks_imports_no_adapter_and_a_lookup_only_its_own():
    """``import msbridge`` and naming sinks import no adapter; looking a sink's class up imports its own module."""
    code = ("import json, sys, msbridge, msbridge.config.load; from msbridge.sinks import registry;"
            "adapters = lambda: sorted(m for m in sys.modules if m.startswith('msbridge.adapters.'));"
            "seen = [adapters()]; registry.available(); registry.builtin_names(); seen.append(adapters());"
            "registry.sink_class('mlflow'); seen.append(adapters()); seen.append('mlflow' in sys.modules);"
            "print(json.dumps(seen))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported, named, looked_up, tracker = json.loads(out.stdout)
    assert imported == named == [] and not tracker
    assert "msbridge.adapters.mlflow_sink" in looked_up and all("mlflow" in m for m in looked_up), looked_up

"""Sink registry: built-ins, third-party entry points, missing extras, lazy imports; what each sink declares."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib.util import find_spec
from pathlib import Path

import pytest

from msbridge.config.dialects import FORMAT_VALUES, HANDLERS
from msbridge.config.load import load_config
from msbridge.errors import ConfigError, MissingDependencyError
from msbridge.options import Option
from msbridge.sinks import registry
from msbridge.sinks.base import Sink


def test_builtins_are_the_adapter_files_each_registered_by_its_class():
    """``adapters/<name>_sink.py`` is the built-in ``<name>``: its class registered itself under that name."""
    adapters = Path(registry.__file__).resolve().parents[2] / "adapters"
    files = sorted(p.name[:-len("_sink.py")] for p in adapters.glob("*_sink.py") if not p.name.startswith("_"))
    names = registry.builtin_names()
    assert sorted(names) == files and names[0] == "jsonl", "the write-ahead log is listed first"
    assert registry.available()[:len(names)] == names
    assert all(registry.resolve(name).name == name for name in names if name != "mlflow" or find_spec("mlflow"))


def test_a_built_in_is_one_file_whose_decorator_registers_it(tmp_path, monkeypatch):
    """A ``csv_sink.py`` in the built-ins' package is the sink ``csv``, found by its file name, imported when asked."""
    package = tmp_path / "fake_adapters"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_helper.py").write_text("raise RuntimeError('not a sink: never imported')\n")
    (package / "jsonl_sink.py").write_text("from msbridge.adapters.jsonl_sink import JsonlSink\n"
                                           "from msbridge.sinks.registry import register_sink\n"
                                           "register_sink('jsonl')(JsonlSink)\n")  # the write-ahead log, always on
    (package / "csv_sink.py").write_text(textwrap.dedent("""
        from msbridge.sinks.base import Sink
        from msbridge.sinks.registry import register_sink

        @register_sink("csv")
        class CsvSink(Sink):
            def write(self, records, events):
                pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "BUILTIN_PACKAGE", "fake_adapters")
    monkeypatch.setattr(registry, "_REGISTERED", {})
    assert registry.builtin_names() == ("jsonl", "csv") and "fake_adapters.csv_sink" not in sys.modules
    assert registry.sink_class("csv").__module__ == "fake_adapters.csv_sink"
    assert dict(load_config({"sinks": {"csv": {}}}).sinks) == {"csv": {}, "jsonl": {}}


def test_a_class_decorated_in_this_process_is_a_sink():
    @registry.register_sink("print_steps")
    class PrintSteps(Sink):
        def write(self, records, events):
            print([r.step for r in records])

    assert PrintSteps.name == "print_steps" and registry.resolve("print_steps") is PrintSteps
    assert "print_steps" in registry.available()


def test_each_store_default_is_declared_once_by_its_sink():
    """``msbridge view``, ``replay`` and the run plan place a tracker's store from the class's ``default_store``."""
    stores = registry.store_defaults("/e")
    assert set(stores) == {n for n in registry.builtin_names() if registry.sink_class(n).default_store}
    assert stores["mlflow"] == {"tracking_uri": "sqlite:////e/mlflow.db"}
    assert stores["tensorboard"] == {"logdir": "/e/tensorboard"}
    assert stores["mindinsight"] == {"summary_base_dir": "/e/summary"}
    assert registry.with_store_defaults("mlflow", {"close_timeout": 1}, "/e") == {
        "close_timeout": 1, "tracking_uri": "sqlite:////e/mlflow.db"}
    assert registry.with_store_defaults("mlflow", {"tracking_uri": "http://h:5000"}, "/e") == {
        "tracking_uri": "http://h:5000"}
    assert registry.with_store_defaults("tensorboard", {"logdir": None}, "/e") == {"logdir": "/e/tensorboard"}
    assert registry.with_store_defaults("jsonl", {}, "/e") == {}
    for name in stores:
        option, _ = registry.sink_class(name).default_store
        assert option in registry.sink_class(name).options, name


@pytest.mark.parametrize("name", registry.builtin_names())
def test_every_builtin_declares_itself(name):
    """Typed options, extra and reader live in the adapter class; the registry holds its name and path."""
    cls = registry.sink_class(name)
    assert cls.name == name and cls.ranks in ("all", "global")
    assert cls.options and all(isinstance(o, Option) and o.doc for o in cls.options.values())
    assert all(o.check(o.default) is None for o in cls.options.values()), "every default is valid"
    assert cls.read_back is not Sink.read_back and cls.write is not Sink.write
    assert cls.skips_held, "a store: its host hands it no step it holds or was handed"
    assert not cls.extra or cls.requires, "an extra installs the packages the sink requires"


def test_the_config_takes_sink_names_from_the_registry():
    """mindformers' ``*_format`` values and the ``<sink>: true`` flags follow the registry."""
    assert FORMAT_VALUES == ("log",) + registry.builtin_names()
    assert set(registry.builtin_names()) <= set(HANDLERS)


def test_unknown_name_lists_registered():
    with pytest.raises(ConfigError, match=f"registered sinks: {', '.join(registry.available())}$"):
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
    others = [m for m in looked_up if "mlflow" not in m and m != "msbridge.adapters._tracker_facts"]  # no other sink
    assert "msbridge.adapters.mlflow_sink" in looked_up and not others, looked_up

"""One registry rule for sinks and health checks (``msbridge.plugins``), with real installed distributions (a
dist-info on ``sys.path``): the registered name is the YAML name, a clash names both packages, and a plug-in
that does not load is reported in the same words for both kinds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from msbridge.config.load import load_config
from msbridge.errors import MsbridgeError
from msbridge.sinks import registry

SINK = """
    from msbridge.sinks.base import Sink

    class {cls}(Sink):
        def write(self, records, events):
            pass
"""


def install(root: Path, dist: str, group: str, entries: str, module: str, code: str) -> Path:
    """A distribution ``dist`` with ``module.py`` and the entry points ``entries`` of ``group``, under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entries}\n")
    return root


def test_a_plug_in_sink_named_like_a_built_in_is_an_error_naming_both_packages(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(install(tmp_path, "tb-clone", "msbridge.sinks", "tensorboard = tb_clone:Tb",
                                            "tb_clone", SINK.format(cls="Tb"))))
    assert registry.available().count("tensorboard") == 1
    with pytest.raises(MsbridgeError, match=r"two sinks are named 'tensorboard': the built-in "
                                          r"msbridge\.adapters\.tensorboard_sink \(package msbridge\) and the entry "
                                          r"point tb_clone:Tb \(package tb-clone\)"):
        load_config({"sinks": {"tensorboard": {}}})


def test_two_packages_with_one_sink_name_is_an_error_naming_both(tmp_path, monkeypatch):
    for dist, module in (("csv-one", "csv_one"), ("csv-two", "csv_two")):
        monkeypatch.syspath_prepend(str(install(tmp_path / dist, dist, "msbridge.sinks", f"csv = {module}:Csv",
                                                module, SINK.format(cls="Csv"))))
    assert "csv" not in registry.available()
    with pytest.raises(MsbridgeError, match=r"two sinks are named 'csv': the entry points of the packages csv-one "
                                          r"and csv-two"):
        load_config({"sinks": {"csv": {}}})


def test_the_registered_name_is_the_entry_points_name(tmp_path, monkeypatch):
    code = """
        from msbridge.sinks.base import Sink
        from msbridge.sinks.registry import register_sink

        @register_sink("comma")
        class Csv(Sink):
            def write(self, records, events):
                pass

        class Plain(Sink):  # not decorated: the entry point names it
            def write(self, records, events):
                pass
    """
    monkeypatch.syspath_prepend(str(install(tmp_path, "my-csv", "msbridge.sinks",
                                            "csv = my_csv:Csv\nplain = my_csv:Plain", "my_csv", code)))
    assert "plain" in registry.available() and registry.resolve("plain").name == "plain"
    assert "csv" not in registry.available() and "comma" not in registry.available()
    with pytest.raises(MsbridgeError, match=r"sink 'csv' \(entry point my_csv:Csv\) did not load: its class registers "
                                          r"itself as 'comma': the entry point's name and the register name must be "
                                          r"the same .*\(package my-csv\)"):
        load_config({"sinks": {"csv": {}}})


def test_a_broken_sink_and_a_broken_check_are_reported_alike(tmp_path):
    """The same words for both kinds: said once as an error, left out, and naming it in YAML says why."""
    install(tmp_path, "my-broken", "msbridge.sinks", "badsink = my_broken:Missing", "my_broken", "X = 1\n")
    (tmp_path / "my_broken_check-1.0.dist-info").mkdir()
    (tmp_path / "my_broken_check-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: my-broken-check\nVersion: 1.0\n")
    (tmp_path / "my_broken_check-1.0.dist-info" / "entry_points.txt").write_text(
        "[msbridge.health]\nbadcheck = my_broken:Missing\n")
    code = textwrap.dedent("""
        import json
        from msbridge.config.load import load_config
        from msbridge.errors import MsbridgeError
        from msbridge.sinks.registry import available
        said = {}
        for key, section in (("sinks", {"badsink": {}}), ("health", {"badcheck": {}})):
            try:
                load_config({key: section})
            except MsbridgeError as exc:
                said[key] = str(exc)
        print(json.dumps([said, "badsink" in available()]))
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), GLOG_v="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said, listed = json.loads(out.stdout)
    assert not listed
    for kind, key, name, dist in (("sink", "sinks", "badsink", "my-broken"),
                                  ("health check", "health", "badcheck", "my-broken-check")):
        words = (f"{kind} '{name}' (entry point my_broken:Missing) did not load: AttributeError: module 'my_broken' "
                 f"has no attribute 'Missing' (package {dist}); it is not available")
        assert words in said[key], said[key]
        assert out.stderr.count(f"msbridge: {words}") == 1, out.stderr[-3000:]

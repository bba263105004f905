"""Each setting declared once (``msbridge.config.settings``): the checks, ``msbridge config`` and the docs table
all come from the declaration, so adding a setting is one field."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, fields

import pytest

from msbridge.config.load import load_config
from msbridge.config.reference import BEGIN, END, differences, settings_table, table_in
from msbridge.config.settings import OPTIONS, Config, SettingsError, setting_problems
from msbridge.errors import ConfigError
from msbridge.options import declare

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "configuration.md")


@dataclass(frozen=True)
class WithKnob(Config):
    """Config with one more setting, declared as any setting is."""

    knob: int = declare(int, 3, "turns the knob", low=1, high=9, high_open=False)


def documented_table() -> str:
    with open(DOC, encoding="utf-8") as fh:
        return table_in(fh.read())


def test_the_docs_settings_table_is_the_declarations():
    changes = differences(documented_table(), settings_table())
    assert changes == [], ("docs/configuration.md's settings table is not what msbridge/config/settings.py declares; "
                           "write it with `python -m msbridge.config.reference` (repository root):\n"
                           + "\n".join(changes))


def test_the_type_column_is_what_the_error_for_a_bad_value_says():
    row = next(r for r in documented_table().splitlines() if r.startswith("| `flush_steps` |"))
    kind = row.split(" | ")[1]
    assert kind == "an integer >= 1 and <= 10_000_000"  # the range FIELDS and the docs disagreed on
    with pytest.raises(ConfigError) as err:
        load_config({"flush_steps": 0})
    assert err.value.problems == [f"<dict>: flush_steps: expected {kind}, got 0"]


def test_every_declaration_is_complete_and_its_default_is_valid():
    assert list(OPTIONS) == [f.name for f in fields(Config)]  # no field without its declaration
    assert all(option.doc for option in OPTIONS.values())
    assert setting_problems({name: option.default for name, option in OPTIONS.items()}) == []
    assert Config().to_dict() == load_config({}).to_dict()


def test_a_new_field_is_checked_and_documented_from_its_declaration_alone():
    row = "| `knob` | an integer >= 1 and <= 9 | `3` | turns the knob |"
    assert settings_table(WithKnob).splitlines()[-1] == row
    assert differences(settings_table(), settings_table(WithKnob)) == [f"add: {row}"]
    assert WithKnob(knob=9).knob == 9 and WithKnob().to_dict()["knob"] == 3
    with pytest.raises(SettingsError) as err:
        WithKnob(knob=0, flush_steps=0)
    assert err.value.located == [(("flush_steps",), "expected an integer >= 1 and <= 10_000_000, got 0"),
                                 (("knob",), "expected an integer >= 1 and <= 9, got 0")]


def test_config_built_directly_checks_what_the_loader_checks():
    """One pass: the nested sections and the relations are checked however the Config is built."""
    with pytest.raises(SettingsError) as err:
        Config(straggler={"windos": 3}, system={"interval_s": 0}, health={"plateau": {"patience": 0}},
               histogram_interval=5)
    assert err.value.problems == [
        "system.interval_s: expected a number > 0 and <= 10_000_000, got 0",
        "health.plateau.patience: expected an integer >= 1, got 0",
        "straggler.windos: unknown key; did you mean 'windows'?",
        "histogram_interval: has no effect without histograms"]


def test_a_missing_marker_is_named():
    assert table_in("no table here") is None
    assert differences(None, settings_table()) == [f"the markers are missing: put the table between {BEGIN!r} and "
                                                   f"{END!r}"]


def _copy_with_one_more_setting(tmp_path):
    """The package and docs copied, with one line added to ``Config``: nothing else changes."""
    shutil.copytree(os.path.join(ROOT, "msbridge"), tmp_path / "pkg" / "msbridge",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "adapters"), tmp_path / "pkg" / "msbridge" / "adapters",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    shutil.copy(DOC, tmp_path / "docs" / "configuration.md")
    settings = tmp_path / "pkg" / "msbridge" / "config" / "settings.py"
    text = settings.read_text(encoding="utf-8")
    anchor = "    params: Mapping[str, Any] = declare("
    line = ('    warmup_flushes: int = declare(int, 2, "flushes before the first write", low=0, high=100, '
            'high_open=False)\n')
    assert text.count(anchor) == 1
    settings.write_text(text.replace(anchor, line + anchor), encoding="utf-8")
    return dict(os.environ, PYTHONPATH=str(tmp_path / "pkg"), GLOG_v="3")


@pytest.mark.slow
def test_adding_a_setting_is_one_line_of_settings_py(tmp_path):
    env = _copy_with_one_more_setting(tmp_path)

    def run(*args):
        return subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=env, capture_output=True, text=True)

    row = "| `warmup_flushes` | an integer >= 0 and <= 100 | `2` | flushes before the first write |"
    check = run("msbridge.config.reference", "--check")
    assert (check.returncode, check.stdout) == (1, f"docs/configuration.md: add: {row}\n"), check.stderr
    (tmp_path / "run.yaml").write_text("warmup_flushes: 101\nwarmup_flushs: 1\n")
    bad = run("msbridge.cli.main", "config", "check", "run.yaml")
    assert bad.returncode == 1 and bad.stdout.splitlines() == [
        "run.yaml: 2 problems:",
        "  run.yaml:2: warmup_flushs: unknown key; did you mean 'warmup_flushes'?",
        "  run.yaml:1: warmup_flushes: expected an integer >= 0 and <= 100, got 101"], bad.stdout + bad.stderr
    (tmp_path / "run.yaml").write_text("monitor_config:\n  warmup_flushes: 5\n")
    shown = run("msbridge.cli.main", "config", "show", "run.yaml")
    line = next(row for row in shown.stdout.splitlines() if row.startswith("warmup_flushes:"))
    assert shown.returncode == 0 and line.split() == ["warmup_flushes:", "5", "#", "run.yaml:2",
                                                      "(monitor_config.warmup_flushes)"], shown.stdout
    written = run("msbridge.config.reference")
    assert written.returncode == 0 and row in (tmp_path / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert run("msbridge.config.reference", "--check").returncode == 0

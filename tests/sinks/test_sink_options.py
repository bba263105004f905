"""A sink's declared options: checked by ``msbridge config check`` (with file:line) and by the sink itself."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from msbridge.errors import ConfigError
from msbridge.options import Option, check_options
from msbridge.sinks.registry import resolve


@pytest.mark.parametrize("option, value, message", [
    (Option(bool, True, "b"), 1, "expected true or false, got 1"),
    (Option(int, 5, "i", 1), 0, "expected an integer >= 1, got 0"),
    (Option(int, 5, "i", 1), 2.0, "expected an integer >= 1, got 2.0"),
    (Option(float, 1.0, "f", 0), True, "expected a number >= 0, got True"),
    (Option(float, 1.0, "f", 0), None, "expected a number >= 0, got None"),
    (Option(float, None, "f", 0), "fast", "expected null or a number >= 0, got 'fast'"),
    (Option(str, None, "s"), "", "expected null or a non-empty string, got ''"),
    (Option(str, "x", "s"), 3, "expected a non-empty string, got 3 (quote it: '3')"),
])
def test_a_wrong_value_says_what_is_expected(option, value, message):
    assert option.check(value) == message


@pytest.mark.parametrize("option, value", [
    (Option(bool, True, "b"), False), (Option(int, 5, "i", 1), 1), (Option(float, 1.0, "f", 0), 0),
    (Option(float, 1.0, "f", 0), 2.5), (Option(float, None, "f"), None), (Option(str, None, "s"), "/data"),
])
def test_a_right_value_passes(option, value):
    assert option.check(value) is None


def test_a_type_other_than_the_plain_ones_says_what_is_valid():
    with pytest.raises(TypeError, match="needs what=.*bool, int, float, str"):
        Option(list, [], "a list")
    with pytest.raises(TypeError, match="only an int or float Option has bounds"):
        Option(str, "x", "s", low=1)


def test_an_at_most_pair_is_checked_with_defaults_and_names_both_options():
    declared = {"initial": Option(float, 1.0, "i", 0, at_most="most"), "most": Option(float, 60.0, "m", 0)}
    assert check_options(declared, {"initial": 100, "most": 10}) == [
        ("initial", "must be <= most, which is 10; got 100")]
    assert check_options(declared, {"initial": 100}) == [("initial", "must be <= most, which is 60.0 (its default); "
                                                                     "got 100")]
    assert check_options(declared, {"most": 0.5}) == [("initial", "must be <= most, which is 0.5; got 1.0")]
    assert check_options(declared, {"initial": 5, "most": 5}) == []
    assert check_options(declared, {"initial": "x", "most": 1}) == [("initial", "expected a number >= 0, got 'x'")]


def test_unknown_options_suggest_or_list_the_declared_ones():
    declared = {"logdir": Option(str, None, "d"), "fsync": Option(bool, True, "f")}
    assert check_options(declared, {"logdri": "x", "colour": "red", "fsync": True}) == [
        ("logdri", "unknown option; did you mean 'logdir'?"), ("colour", "unknown option (valid: logdir, fsync)")]
    assert check_options({}, {"x": 1}) == [("x", "unknown option (this sink takes no options)")]


def test_a_sink_built_by_hand_checks_every_option_at_once_and_fills_defaults():
    jsonl = resolve("jsonl")
    with pytest.raises(ConfigError) as err:
        jsonl(fsync="yes", fsnyc=True)
    assert err.value.problems == ["sinks.jsonl.fsync: expected true or false, got 'yes'",
                                  "sinks.jsonl.fsnyc: unknown option; did you mean 'fsync'?"]
    assert jsonl().settings == {"fsync": True} and jsonl(fsync=False).settings == {"fsync": False}


def test_config_check_points_at_the_line_of_a_bad_sink_option(tmp_path, persistent):
    (tmp_path / "run.yaml").write_text(textwrap.dedent(f"""\
        output_dir: {tmp_path / "runs"}
        sinks:
          jsonl: {{fsync: false}}
          tensorboard: {{logdir: 7}}
          mlflow:
            max_pending: 0
            trackign_uri: sqlite:///x.db
        """))
    out = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "config", "check", "run.yaml"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == [
        "run.yaml: 3 problems:",
        "  run.yaml:4: sinks.tensorboard.logdir: expected null or a non-empty string, got 7 (quote it: '7')",
        "  run.yaml:6: sinks.mlflow.max_pending: expected an integer >= 1, got 0",
        "  run.yaml:7: sinks.mlflow.trackign_uri: unknown option; did you mean 'tracking_uri'?"]


"""The msbridge command line: help text for every option, plain text, --out composing with --config."""
from __future__ import annotations

import argparse
import textwrap

import pytest

from msbridge.cli.main import build_parser, main, out_overrides
from msbridge.config.load import load_config


def parsers(parser: argparse.ArgumentParser, name: str = "msbridge"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


def bench_parser() -> argparse.ArgumentParser:
    from msbridge.bench.suite import add_arguments

    parser = argparse.ArgumentParser(prog="msbridge bench")
    add_arguments(parser)
    return parser


def test_every_option_and_command_has_help_and_no_rst():
    missing, rst = [], []
    for name, parser in [*parsers(build_parser()), ("msbridge bench", bench_parser())]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{name} {c.dest}" for c in action._choices_actions if not c.help]
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
        if "``" in parser.format_help() or ":func:" in parser.format_help():
            rst.append(name)
    assert missing == [] and rst == []


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "view" in capsys.readouterr().out


def test_bench_runs_as_its_own_program_with_the_same_command_line(capfd):
    """``msbridge bench`` starts ``python -m msbridge.bench.suite``: its help, and its errors as one line, exit 2."""
    assert main(["bench", "--help"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("usage: msbridge bench") and "--setups" in out and "--server-nice" in out
    assert main(["bench", "--setups", "a,nosuch", "--out", "/nonexistent/never-made"]) == 2
    err = capfd.readouterr().err
    assert "msbridge: error: bench: unknown setup(s) nosuch; choose from a, " in err and "Traceback" not in err


@pytest.mark.parametrize("text", [
    "experiment: e\noutput_dir: ./elsewhere/{run_name}\n",
    "model: {}\nmonitor_config:\n  experiment: e\n  output_dir: ./elsewhere/{run_name}\n",  # a training YAML
])
def test_out_overrides_the_configs_directories(tmp_path, text, persistent):
    (tmp_path / "c.yaml").write_text(textwrap.dedent(text))
    cfg = load_config(str(tmp_path / "c.yaml"), out_overrides(str(tmp_path / "out")) + ["flush_steps=7"])
    assert (cfg.experiment_dir, cfg.output_dir) == (f"{tmp_path}/out/{{experiment}}", "{experiment_dir}/{run_name}")
    assert cfg.flush_steps == 7
    assert cfg.provenance.origin(("output_dir",))[0] == "--set"


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A real 30-step run with jsonl and TensorBoard sinks, for the commands that read one."""
    from helpers.training import train_regression

    from msbridge import BridgeMonitor

    root = tmp_path_factory.mktemp("closed")
    monitor = BridgeMonitor({"experiment": "c", "run_name": "r", "output_dir": str(root / "r"), "flush_steps": 10,
                             "sinks": ["jsonl", "tensorboard"]}, progress=False)
    train_regression([monitor], steps=30)
    return monitor.run_dir


@pytest.mark.parametrize("command", ["--help", "diagnose {run}", "diagnose --format json {run}",
                                     "plot -o {tmp}/loss.png {run}", "config show {tmp}/m.yaml",
                                     "config check {tmp}/m.yaml", "view --help", "demo --help"])
def test_every_command_exits_quietly_when_its_reader_closes_stdout(small_run, command, tmp_path):
    """``msbridge ... | head`` when head has already gone: the pipe's read end is closed before the command
    writes, so its first write (or its flush) meets EPIPE. No traceback, no "Exception ignored"; exit code 1
    (``--help``: 0, argparse drops the failed write itself)."""
    import os
    import subprocess
    import sys

    (tmp_path / "m.yaml").write_text("experiment: c\nflush_steps: 10\nsinks: [jsonl]\n")
    read_end, write_end = os.pipe()
    os.close(read_end)
    exe = os.path.join(os.path.dirname(sys.executable), "msbridge")
    try:
        done = subprocess.run([exe, *command.format(run=small_run, tmp=tmp_path).split()], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path,
                              env=dict(os.environ, GLOG_v="3"))
    finally:
        os.close(write_end)
    want = 0 if command.endswith("--help") else 1
    assert done.stderr == "" and done.returncode == want, (done.returncode, done.stderr[-2000:])

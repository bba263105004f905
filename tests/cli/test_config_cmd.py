"""``msbridge config show|check``: exit codes, every problem listed, provenance of every value."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import yaml

from msbridge.cli.main import main
from msbridge.config.load import load_config

SEED002 = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "seed002", "configs", "llama2")


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return name


TRAIN = """\
    optimizer:
      learning_rate: 0.001
    monitor_config:
      monitor_on: True
      interval: 20
      local_loss_format: [log, tensorboard]
    callbacks:
      - type: LossMonitor
        per_print_times: ${monitor_config.interval}
"""


def test_check_valid_exits_0(tmp_path, capsys, persistent):
    name = write(tmp_path, TRAIN)
    assert main(["config", "check", name]) == 0
    out = capsys.readouterr().out
    assert out.strip() == f"{name}: ok (2 dialect/precedence notes, 0 warnings; `msbridge config show` prints them)"


def test_check_prints_warnings_and_still_exits_0(tmp_path, capsys):
    name = write(tmp_path, "monitor_config:\n  dump_path: /tmp/monitor-cli-test\n  interval: 5\n")
    assert main(["config", "check", name]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "warning: run.yaml:2: monitor_config.dump_path: '/tmp/monitor-cli-test' is under /tmp: it may be " \
           "wiped (reboot, tmp cleaner) and the run's curves with it; use a persistent directory" in out
    assert out[-1].startswith("run.yaml: ok (")


def test_check_invalid_exits_1_listing_every_problem(tmp_path, capsys):
    name = write(tmp_path, "monitor_config:\n  intreval: 10\n  flush_steps: 0\n  sinks: [mlfow]\n")
    assert main(["config", "check", name, "--set", "monitor_config.print_interval=x"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run.yaml: 4 problems:"
    assert lines[1] == "  run.yaml:2: monitor_config.intreval: unknown key; did you mean 'interval'?"
    assert lines[2] == "  run.yaml:3: monitor_config.flush_steps: expected an integer >= 1 and <= 10_000_000, got 0"
    assert lines[3] == "  --set: monitor_config.print_interval: expected an integer >= 1 and <= 10_000_000, got 'x'"
    assert lines[4].startswith("  run.yaml:4: monitor_config.sinks[0]: unknown sink 'mlfow'; did you mean 'mlflow'?")


def test_show_marks_file_line_default_and_set(tmp_path, capsys, persistent):
    name = write(tmp_path, TRAIN)
    assert main(["config", "show", name, "--set", "experiment=sweep-1"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if not line.startswith("#")}
    assert lines["flush_steps"].split("# ")[1] == "run.yaml:5  (monitor_config.interval)"
    assert lines["experiment"].split("# ")[1] == "--set  (monitor_config.experiment)"
    assert lines["print_interval"].split("# ")[1] == "default"
    assert "- type: LossMonitor" in out and "run.yaml:9  (callbacks[0].per_print_times = ${monitor_config." \
           "interval})" in out
    assert "#   run.yaml:6: monitor_config.local_loss_format -> local_loss: true, sinks.tensorboard" in out
    assert "#   --set: experiment -> monitor_config.experiment" in out


def test_show_prints_yaml_that_loads_back_to_the_same_config(tmp_path, capsys, persistent):
    name = write(tmp_path, TRAIN)
    assert main(["config", "show", name]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert load_config(shown) == load_config(name)


def test_show_seed002_points_into_the_base_file(tmp_path, capsys, persistent):
    assert main(["config", "show", os.path.join(SEED002, "run_llama2_7b_monitor.yaml")]) == 0
    out = capsys.readouterr().out
    assert any("seq_length: 4096" in line and "llama2_7b.yaml:17  (model.model_config.seq_length)" in line
               for line in out.splitlines())
    assert any(line.strip().startswith("jsonl: {}") and line.endswith("# always on") for line in out.splitlines())


def test_show_invalid_exits_1(tmp_path, capsys):
    name = write(tmp_path, "flush_steps: 0\n")
    assert main(["config", "show", name]) == 1
    assert "run.yaml:1: flush_steps: expected an integer >= 1 and <= 10_000_000, got 0" in capsys.readouterr().out


def test_console_script_runs_check(tmp_path, persistent):
    name = write(tmp_path, "flush_steps: 0\n")
    env = dict(os.environ, GLOG_v="3")
    out = subprocess.run([sys.executable, "-m", "msbridge.cli.main", "config", "check", name], cwd=tmp_path,
                         capture_output=True, text=True, env=env)
    assert out.returncode == 1
    assert "run.yaml:1: flush_steps: expected an integer >= 1 and <= 10_000_000, got 0" in out.stdout


def test_check_reads_a_mindformers_run_yaml_through_its_msbridge_entry(tmp_path, capsys, persistent):
    (tmp_path / "msbridge.yaml").write_text("flush_steps: 7\n")
    (tmp_path / "run.yaml").write_text(textwrap.dedent("""\
        model: {model_config: {seq_length: 32}}
        monitor_config: {monitor_on: true, dump_path: '', step_interval: 2}
        callbacks:
          - type: MFLossMonitor
          - type: MSBridgeMonitor
            config: msbridge.yaml
            experiment: llama
        """))
    assert main(["config", "show", "run.yaml"]) == 0
    shown = capsys.readouterr().out
    # monitor_config's step_interval thins mindformers' TrainingStateMonitor only, as in mindformers
    for line in ("flush_steps: 7", "step_interval: 1", "experiment: llama", "seq_length: 32",
                 "monitor_config.step_interval -> left to mindformers"):
        assert line in shown, shown
    assert main(["config", "check", "run.yaml", "--set", "callbacks.1.flush_step=3"]) == 1
    assert "callbacks[1].flush_step: unknown key; did you mean 'flush_steps'?" in capsys.readouterr().out


def test_check_points_bad_internals_settings_at_their_lines(tmp_path, capsys):
    name = write(tmp_path, """\
        msbridge:
          layer_norms: 'layers.(0'
          layer_norms_group: 'layers\\.\\d+'
          system: {interval_s: 0}
    """)
    assert main(["config", "check", name]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run.yaml: 3 problems:"
    assert lines[1].startswith("  run.yaml:2: msbridge.layer_norms: 'layers.(0' is not a valid regular expression: "
                               "missing ), unterminated subpattern")
    assert lines[2] == "  run.yaml:3: msbridge.layer_norms_group: 'layers\\\\.\\\\d+' must have exactly one " \
                       "capturing group, the layer's name (it has 0)"
    assert lines[3] == "  run.yaml:4: msbridge.system.interval_s: expected a number > 0 and <= 10_000_000, got 0"

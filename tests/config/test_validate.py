"""Strict validation: every problem at once, each with file:line and the exact wording users see."""
from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

import msbridge.config.directories as pathcheck
from msbridge.config.dialects import HANDLERS
from msbridge.config.load import FIELD_NAMES, Config, ConfigError, load_config
from msbridge.sinks.registry import available

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def problems_of(path, overrides=()):
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    return err.value.problems


def test_unknown_key_wording_is_pinned(tmp_path):
    path = write(tmp_path, """\
        model: {}
        monitor_config:
          monitor_on: True
          intreval: 10
          per_print_time: 5
          sinkz: [jsonl]
    """)
    assert problems_of(path) == [
        "run.yaml:4: monitor_config.intreval: unknown key; did you mean 'interval'?",
        "run.yaml:5: monitor_config.per_print_time: unknown key; did you mean 'per_print_times'?",
        "run.yaml:6: monitor_config.sinkz: unknown key; did you mean 'sinks'?",
    ]


def test_unknown_top_level_keys_of_a_pure_file(tmp_path):
    assert problems_of(write(tmp_path, "flush_step: 5\nmonitor_confg: {}\nzzz: 1\n")) == [
        "run.yaml:1: flush_step: unknown key; did you mean 'flush_steps'?",
        "run.yaml:2: monitor_confg: unknown key; did you mean 'monitor_on'?",
        "run.yaml:3: zzz: unknown key",
    ]


def test_every_problem_in_the_file_is_reported_at_once(tmp_path):
    path = write(tmp_path, """\
        monitor_on: 'True'
        experiment: [42]
        flush_steps: 0
        flush_seconds: -1
        overhead_budget: 2
        seq_length: 0
        layer_norms: "layers.[0"
        health: [nan]
        tags: {a: [1]}
        sinks: [jsonl, tensorbord]
        step_interval: 1
        step_interval: 2
    """)
    assert problems_of(path) == [
        "run.yaml:12: step_interval: key written twice (first at line 11); YAML would silently keep only the last",
        "run.yaml:1: monitor_on: expected true or false, got 'True'",
        "run.yaml:2: experiment: expected a non-empty string, got [42]",
        "run.yaml:3: flush_steps: expected an integer >= 1 and <= 10_000_000, got 0",
        "run.yaml:4: flush_seconds: expected a number > 0 and <= 10_000_000, got -1",
        "run.yaml:7: layer_norms: 'layers.[0' is not a valid regular expression: unterminated character set "
        "at position 7",
        "run.yaml:6: seq_length: expected null or an integer >= 1 and <= 100_000_000, got 0",
        f"run.yaml:10: sinks[1]: unknown sink 'tensorbord'; did you mean 'tensorboard'? "
        f"(registered sinks: {', '.join(available())})",
        "run.yaml:8: health: expected a mapping, got ['nan']",
        "run.yaml:5: overhead_budget: expected a number > 0 and < 1, got 2",
        "run.yaml:9: tags: tag values must be strings or numbers; a are not",
    ]


def test_renamed_key_errors_say_which_setting_they_set(tmp_path):
    assert problems_of(write(tmp_path, "monitor_config:\n  per_print_times: 0\n")) == [
        "run.yaml:2: monitor_config.per_print_times: expected an integer >= 1 and <= 10_000_000, got 0 "
        "(it sets print_interval)"]


def test_run_name_references_are_checked_against_params_and_settings(tmp_path, persistent):
    ok = load_config({"run_name": "lm-lr{optimizer.learning_rate}-{flush_steps}-{timestamp}-r{rank}",
                      "params": {"optimizer": {"learning_rate": 0.1}}})
    assert ok.run_name.startswith("lm-lr{optimizer.learning_rate}")
    path = write(tmp_path, "run_name: lm-{optimizer.lr}\nparams: {optimizer: {learning_rate: 0.1}}\n")
    assert problems_of(path) == ["run.yaml:1: run_name: 'lm-{optimizer.lr}' references {optimizer.lr}, "
                                 "which is not a config value"]


def test_output_dir_placeholders_are_checked(tmp_path):
    assert problems_of(write(tmp_path, "output_dir: ./runs/{user}/{run_name}\n")) == [
        "run.yaml:1: output_dir: unknown placeholder {user} in './runs/{user}/{run_name}'; "
        "use {experiment_dir}, {experiment}, {run_name}, {rank}, {timestamp}"]
    assert problems_of(write(tmp_path, "output_dir: ./runs/{run_name\n"))[0].startswith(
        "run.yaml:1: output_dir: './runs/{run_name' is not a valid template")


def test_unwritable_output_and_dump_dirs_fail_at_load(tmp_path):
    (tmp_path / "afile").write_text("x")
    path = write(tmp_path, f"""\
        output_dir: {tmp_path}/afile/runs/{{run_name}}
        health: {{dump_dir: /proc/msbridge-dump}}
    """)
    problems = problems_of(path)
    assert problems[0] == (f"run.yaml:1: output_dir: cannot create '{tmp_path}/afile/runs': "
                           f"'{tmp_path}/afile' is a file, not a directory")
    assert problems[1].startswith("run.yaml:2: health.dump_dir: cannot create '/proc/msbridge-dump': ")


def test_experiment_dir_is_checked_and_fills_output_dir(tmp_path, persistent):
    (tmp_path / "afile").write_text("x")
    problems = problems_of(write(tmp_path, f"""\
        experiment_dir: {tmp_path}/afile/{{experiment}}
        output_dir: ./runs/{{experiment_dir}}/{{run_name}}
    """))
    assert problems[0] == (f"run.yaml:1: experiment_dir: cannot create '{tmp_path}/afile': "
                           f"'{tmp_path}/afile' is a file, not a directory")
    assert problems[1] == ("run.yaml:2: output_dir: {experiment_dir} may only start output_dir: "
                           "'./runs/{experiment_dir}/{run_name}'")
    assert problems_of(write(tmp_path, "experiment_dir: ./x/{run_name}\n")) == [
        "run.yaml:1: experiment_dir: unknown placeholder {run_name} in './x/{run_name}'; use {experiment}"]
    cfg = load_config({"experiment_dir": f"{tmp_path}/exps/{{experiment}}"})  # the default output_dir: inside it
    assert (cfg.output_dir, cfg.experiment_dir) == ("{experiment_dir}/{run_name}", f"{tmp_path}/exps/{{experiment}}")
    with pytest.raises(ConfigError, match=r"experiment_dir: cannot create '/proc/x'"):
        load_config({"experiment_dir": "/proc/x/{experiment}"})  # the write check fills in {experiment_dir}


def test_dump_path_problems_point_at_the_key_the_user_wrote(tmp_path):
    problems = problems_of(write(tmp_path, "monitor_config:\n  dump_path: /proc/msbridge-x\n"))
    assert problems[0].startswith("run.yaml:2: monitor_config.dump_path: cannot create '/proc/msbridge-x'")
    assert problems[0].endswith("(it sets output_dir)") or problems[0].endswith("(it sets health.dump_dir)")


def test_the_write_check_leaves_no_directories_behind(tmp_path, persistent):
    target = tmp_path / "deep" / "er" / "runs"
    cfg = load_config({"output_dir": f"{target}/{{experiment}}/{{run_name}}"})
    assert cfg.output_dir.startswith(str(target))
    assert not (tmp_path / "deep").exists()
    existing = tmp_path / "exists"
    existing.mkdir()
    load_config({"output_dir": str(existing)})
    assert os.listdir(existing) == []


def test_monitor_off_skips_directory_checks_and_says_nothing_is_recorded(tmp_path):
    cfg = load_config({"monitor_on": False, "output_dir": "/proc/nope/{run_name}"})
    assert cfg.monitor_on is False
    assert cfg.provenance.warnings == ("<dict>: monitor_on: false -> msbridge builds no sink and records nothing",)


def test_every_rank_can_probe_the_same_missing_dir_at_once(tmp_path):
    target = str(tmp_path / "shared" / "runs")
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda _: pathcheck.writable_problem(target), range(64)))
    assert results == [None] * 64 and os.listdir(tmp_path) == []


def test_tmp_dump_path_is_a_warning_logged_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        cfg = load_config(write(tmp_path, "monitor_config:\n  dump_path: /tmp/monitor-msbridge-test\n"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "msbridge config: run.yaml:2: monitor_config.dump_path: '/tmp/monitor-msbridge-test' is under /tmp: it "
        "may be wiped (reboot, tmp cleaner) and the run's curves with it; use a persistent directory"]
    assert len(cfg.provenance.warnings) == 1 and not os.path.exists("/tmp/monitor-msbridge-test")


def test_tmpfs_mounts_are_found_in_the_mount_table(tmp_path, persistent):
    ram = tmp_path / "ram"
    ram.mkdir()
    persistent.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {ram} tmpfs rw 0 0\n")
    cfg = load_config({"output_dir": f"{ram}/runs/{{run_name}}"})
    assert cfg.provenance.warnings == (f"<dict>: output_dir: '{ram}/runs' is on tmpfs (mounted at {ram}): it may "
                                       "be wiped (reboot, tmp cleaner) and the run's curves with it; use a "
                                       "persistent directory",)
    assert load_config({"output_dir": f"{tmp_path}/disk/{{run_name}}"}).provenance.warnings == ()


def test_config_built_directly_is_validated_and_immutable():
    with pytest.raises(ConfigError) as err:
        Config(flush_steps=0, sinks=["nope"])
    assert err.value.problems[0] == "flush_steps: expected an integer >= 1 and <= 10_000_000, got 0"
    assert err.value.problems[1].startswith("sinks.nope: unknown sink 'nope'")
    cfg = Config(sinks=["tensorboard"], tags={"epoch": 3})
    assert dict(cfg.tags) == {"epoch": "3"} and sorted(cfg.sinks) == ["jsonl", "tensorboard"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.flush_steps = 5
    with pytest.raises(TypeError):
        cfg.sinks["mlflow"] = {}


def test_load_config_accepts_a_config_and_round_trips_its_dict(persistent):
    cfg = load_config({"experiment": "e", "params": {"opt": {"lr": 0.1, "betas": [0.9, 0.95]}}})
    assert load_config(cfg) is cfg
    assert load_config(cfg.to_dict()) == cfg
    assert load_config(cfg, ["flush_steps=3"]).flush_steps == 3


def test_reference_doc_lists_every_field_and_dialect_key():
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as fh:
        doc = fh.read()
    missing = [k for k in list(FIELD_NAMES) + list(HANDLERS) if f"`{k}`" not in doc and k not in available()]
    assert missing == []


def test_msbridge_config_check_imports_no_framework_and_no_numpy(tmp_path):
    """The console script's ``config check`` imports none of them (numpy alone was 0.18 of its 0.40 CPU-s)."""
    path = write(tmp_path, "experiment: x\n")
    code = ("import sys; from msbridge.cli.main import main; code = main(['config', 'check', sys.argv[1]]); "
            "print(code, sorted(m for m in ('mindspore', 'mlflow', 'tensorboardX', 'mindformers', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout + out.stderr


def test_histogram_interval_is_an_int_and_needs_histograms(tmp_path):
    assert load_config({"histograms": "dense", "histogram_interval": 100}).histogram_interval == 100
    assert load_config({"histograms": "dense"}).histogram_interval is None  # every flush
    bad = problems_of(write(tmp_path, "histograms: dense\nhistogram_interval: 0\n"))
    assert len(bad) == 1 and "histogram_interval: expected null or an integer >= 1 and <= 10_000_000, got 0" in bad[0]
    alone = problems_of(write(tmp_path, "histogram_interval: 100\n", name="alone.yaml"))
    assert len(alone) == 1 and "has no effect without histograms" in alone[0]


def test_on_fault_is_checked_and_jsonl_takes_none(tmp_path):
    path = write(tmp_path, """\
        experiment: exp
        sinks:
          jsonl: {on_fault: warn}
          tensorboard: {on_fault: later}
        """)
    found = problems_of(path)
    assert any("run.yaml:3: sinks.jsonl.on_fault: jsonl is the write-ahead log, always on" in p for p in found), found
    assert any(p.startswith("run.yaml:4: sinks.tensorboard.on_fault: expected one of fail, warn") for p in found), found


def test_on_fault_warn_starts_training_without_a_sink_that_cannot_work(tmp_path, caplog):
    (tmp_path / "in_the_way").write_text("a file where the logdir's parent should be")
    path = write(tmp_path, """\
        experiment: exp
        sinks:
          jsonl: {}
          tensorboard: {logdir: in_the_way/tb, on_fault: warn}
        """)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        config = load_config(path)
    assert "tensorboard" in config.sinks
    said = [r.getMessage() for r in caplog.records if "off for this run" in r.getMessage()]
    assert len(said) == 1 and "run.yaml:4: sinks.tensorboard: off for this run (on_fault: warn)" in said[0], said
    import msbridge

    caplog.clear()
    with msbridge.track(path, progress=False) as run:
        run.step(loss=1.0)
    assert run.outcome.exit_code == 0, run.outcome  # trained without it: nothing undelivered, no second line
    assert len([r for r in caplog.records if "off for this run" in r.getMessage()]) == 1


def test_a_volatile_directory_is_said_once_per_process_and_shown_by_every_check(tmp_path, caplog):
    from msbridge.config.load import log_notes

    config = {"experiment": "e", "experiment_dir": str(tmp_path / "exp")}  # under /tmp: it may be wiped
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        loaded = [log_notes(load_config(config)) for _ in range(3)]  # a sweep's three runs in one process
    assert len([r for r in caplog.records if "it may be wiped" in r.getMessage()]) == 1
    assert all(any("it may be wiped" in str(note) for note in c.provenance.notes) for c in loaded)


def test_ids_and_names_keep_the_text_as_written(tmp_path):
    """``sweep_id: 82e33229`` (the ids examples/sweep/run_sweep.py makes) was read as inf, ``0012`` as 10: the run
    failed before training, and the hint quoted the parsed value. PyYAML (mindformers' reader) keeps 82e33229."""
    path = write(tmp_path, """\
        experiment: 0012
        run_name: 12e3
        sweep_id: 82e33229
        params: {seed: 0012}
        """)
    config = load_config(path)
    assert (config.experiment, config.run_name, config.sweep_id) == ("0012", "12e3", "82e33229")
    assert config.params == {"seed": 10}  # any other key: a number, as YAML reads it
    for override in ("sweep_id=0012", "sweep_id=1e5"):
        assert load_config(path, [override]).sweep_id == override.split("=")[1]
    assert load_config(path, ['sweep_id="7"']).sweep_id == "7"  # quoted: as before

"""msbridge.mindformers without training: registration, the callback entry's config, bad input.

The entry is found the way ``run_mindformer.py`` runs it (``--config FILE`` in
argv); the ``Trainer(args=FILE)`` path is exercised by test_mindformers_train.py.
"""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
import warnings

import pytest

pytest.importorskip("mindformers")

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister  # noqa: E402

import msbridge.mindformers as mf  # noqa: E402
from msbridge import ConfigError, MsbridgeError  # noqa: E402
from msbridge.mindformers.entry import entry_config  # noqa: E402

pytestmark = pytest.mark.compat  # also run against the oldest and newest supported MindSpore (.ci/run)

RUN_YAML = """\
seed: 0
runner_config:
  epochs: 1
  batch_size: 4
model:
  model_config:
    seq_length: 32
monitor_config:
  monitor_on: True
  dump_path: ''
  step_interval: 2
  check_for_global_norm: False
  global_norm_spike_threshold: 3.0
callbacks:
  - type: MFLossMonitor
  - type: MSBridgeMonitor
    experiment: tiny-llama
{extra}"""


def _run_yaml(tmp_path, monkeypatch, extra: str = "") -> str:
    path = tmp_path / "run.yaml"
    path.write_text(RUN_YAML.format(extra=textwrap.indent(extra, "    ")))
    monkeypatch.setattr(sys, "argv", ["run_mindformer.py", "--config", str(path)])
    return str(path)


def _callbacks():
    return MindFormerRegister.registry[MindFormerModuleType.CALLBACK]


def test_registered_once_and_again_harmlessly():
    assert _callbacks()["MSBridgeMonitor"] is mf.MSBridgeMonitor
    before = {kind: dict(table) for kind, table in MindFormerRegister.registry.items()}
    mf.register(mf.MSBridgeMonitor)  # a second import path
    importlib.import_module("msbridge.mindformers")  # a second import
    assert {kind: dict(table) for kind, table in MindFormerRegister.registry.items()} == before
    # Only a CALLBACK is registered: no model or config name is taken, so mindformers' and
    # transformers' "X is already used by a ... config" cannot come from msbridge.
    ours = {(kind, name) for kind, table in before.items() for name, cls in table.items()
            if cls.__module__.startswith("msbridge")}
    assert ours == {(MindFormerModuleType.CALLBACK, "MSBridgeMonitor"), (MindFormerModuleType.WRAPPER, "MSBridgeRing")}


def test_reloading_the_module_replaces_only_its_own_class():
    old = mf.MSBridgeMonitor
    monitor_module = importlib.reload(importlib.import_module("msbridge.mindformers.monitor"))
    mf.register(monitor_module.MSBridgeMonitor)  # a notebook cell run again
    try:
        assert _callbacks()["MSBridgeMonitor"] is monitor_module.MSBridgeMonitor
    finally:
        MindFormerRegister.register_cls(old, module_type=MindFormerModuleType.CALLBACK)


def test_never_shadows_another_class():
    builtin = _callbacks()["MFLossMonitor"]
    with pytest.raises(MsbridgeError, match="already has a callback named 'MFLossMonitor'.*name="):
        mf.register(mf.MSBridgeMonitor, name="MFLossMonitor")
    assert _callbacks()["MFLossMonitor"] is builtin


def test_auto_register_path(monkeypatch, tmp_path):
    monkeypatch.setenv("REGISTER_PATH", mf.REGISTER_PATH)
    monkeypatch.setenv("OM_MODULES_CACHE", str(tmp_path / "modules"))
    MindFormerRegister.auto_register("msbridge_monitor.MSBridgeMonitor", MindFormerModuleType.CALLBACK)
    assert _callbacks()["MSBridgeMonitor"] is mf.MSBridgeMonitor


def test_missing_mindformers_names_the_install_line(tmp_path):
    # mindformers is installed here; a None entry in sys.modules makes Python's own import fail as if it were not.
    code = "import sys; sys.modules['mindformers'] = None\nimport msbridge.mindformers"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0
    assert "MissingDependencyError: msbridge.mindformers needs the Python package 'mindformers'" in out.stderr
    assert "pip install 'msbridge[mindformers]'" in out.stderr


def test_the_installed_version_is_tested_and_an_untested_one_warns(monkeypatch):
    import mindformers

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # this job's mindformers (CI runs 1.9.0 and 1.6.0) is a tested one
        mf.require_mindformers()
    monkeypatch.setattr(mindformers, "__version__", "2.0.0")
    tested = re.escape(", ".join(mf.TESTED_VERSIONS))
    with pytest.warns(UserWarning, match=rf"tested with mindformers {tested}; mindformers 2\.0\.0 is installed"):
        mf.require_mindformers()


def test_reads_monitor_config_and_entry(tmp_path, monkeypatch, persistent):
    _run_yaml(tmp_path, monkeypatch, "sinks: [jsonl]\nflush_steps: 5\n")
    cfg = entry_config({"experiment": "tiny-llama", "sinks": ["jsonl"], "flush_steps": 5})
    assert (cfg.experiment, cfg.flush_steps, sorted(cfg.sinks)) == ("tiny-llama", 5, ["jsonl"])
    assert cfg.step_interval == 1  # monitor_config's step_interval thins TrainingStateMonitor only, as in mindformers
    assert "grad_norm_spike" not in cfg.health  # check_for_global_norm: False leaves mindformers' limit to mindformers
    assert cfg.seq_length == 32  # from model.model_config
    assert cfg.params["runner_config"]["batch_size"] == 4
    notes = [str(n) for n in cfg.provenance.notes]
    assert any("run.yaml:9: monitor_config.monitor_on -> left to mindformers" in n for n in notes), notes


def test_entry_wins_over_config_file_over_monitor_config(tmp_path, monkeypatch, persistent):
    (tmp_path / "msbridge.yaml").write_text("flush_steps: 7\nprint_interval: 3\nstep_interval: 4\n")
    _run_yaml(tmp_path, monkeypatch, "config: msbridge.yaml\nprint_interval: 9\n")
    cfg = entry_config({"experiment": "tiny-llama", "config": "msbridge.yaml", "print_interval": 9})
    assert (cfg.flush_steps, cfg.print_interval, cfg.step_interval) == (7, 9, 4)


def test_unknown_inline_key_names_file_line_entry_and_nearest_key(tmp_path, monkeypatch):
    _run_yaml(tmp_path, monkeypatch, "flush_step: 5\nsinks: [jsonl, tensorbord]\n")
    with pytest.raises(ConfigError) as err:
        entry_config({"experiment": "tiny-llama", "flush_step": 5, "sinks": ["jsonl", "tensorbord"]})
    problems = err.value.problems
    assert "run.yaml:18: callbacks[1].flush_step: unknown key; did you mean 'flush_steps'?" in problems, problems
    assert any(p.startswith("run.yaml:19: callbacks[1].sinks[1]") and "'tensorboard'" in p for p in problems), problems


def test_bad_key_in_the_config_file_names_that_file(tmp_path, monkeypatch):
    (tmp_path / "msbridge.yaml").write_text("flush_steps: 7\nintreval: 3\n")
    _run_yaml(tmp_path, monkeypatch, "config: msbridge.yaml\n")
    with pytest.raises(ConfigError, match=r"msbridge\.yaml:2: callbacks\[1\]\.intreval: unknown key; "
                                          r"did you mean 'interval'\?"):
        entry_config({"experiment": "tiny-llama", "config": "msbridge.yaml"})


def test_without_the_run_yaml_the_entry_alone_is_checked(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(ConfigError, match=r"<callbacks entry MSBridgeMonitor>: callbacks\[0\]\.flush_step: "
                                          r"unknown key; did you mean 'flush_steps'\?"):
        entry_config({"flush_step": 5})


def test_the_callback_fails_before_training(tmp_path, monkeypatch):
    _run_yaml(tmp_path, monkeypatch, "overhead_budgett: 0.05\n")
    with pytest.raises(ConfigError, match="did you mean 'overhead_budget'"):
        MindFormerRegister.get_instance_from_cfg({"type": "MSBridgeMonitor", "experiment": "tiny-llama",
                                                  "overhead_budgett": 0.05}, MindFormerModuleType.CALLBACK)


def test_max_attention_logit_format_is_forwarded_under_monitor_config_only(tmp_path, persistent):
    """The key is mindformers' (it turns on the model's tracking); under ``monitor_config`` msbridge adds its sinks
    and forwards the values, elsewhere it can have no effect and says so."""
    import logging

    from msbridge.config.load import load_config

    path = tmp_path / "run.yaml"
    path.write_text("monitor_config:\n  max_attention_logit_format: [log, tensorboard]\n")
    cfg = load_config(str(path))
    assert sorted(cfg.sinks) == ["jsonl", "tensorboard"]
    assert [n.text for n in cfg.provenance.notes if "max_attention_logit_format" in n.text] == [
        "monitor_config.max_attention_logit_format -> forwarded from mindformers by MSBridgeMonitor: "
        "attention/max_logit/* at each flush (parallel_core models with FlashAttention), sinks.tensorboard, "
        "log = the jsonl file and the console line"]
    path.write_text("msbridge:\n  max_attention_logit_format: tensorboard\n")
    cfg = load_config(str(path))
    assert sorted(cfg.sinks) == ["jsonl"]
    assert [n.text for n in cfg.provenance.notes if n.level == logging.WARNING] == [
        "msbridge.max_attention_logit_format -> no effect: only mindformers reads it (max attention logit), "
        "under monitor_config:"]

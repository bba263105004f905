"""Dialects: the names users already write, each mapped once to one msbridge setting.

The two seed articles' sample configs are loaded as printed (tests/data/).
"""
from __future__ import annotations

import ast
import importlib.util
import logging
import os
import re
import textwrap

import pytest

import msbridge.config.load as config_module
from msbridge.config.dialects import FORMAT_VALUES, HANDLERS, SUMMARY_KEYS
from msbridge.config.load import FIELD_NAMES, ConfigError, load_config

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")
SEED002 = os.path.join(DATA, "seed002", "configs", "llama2")


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def texts(cfg, level=None):
    return [n.text for n in cfg.provenance.notes if level is None or n.level == level]


# -- seed 000: the monitoring article -----------------------------------------------------------
def test_seed000_template_as_printed_does_what_the_article_says(monkeypatch, caplog):
    asked = []
    monkeypatch.setattr(config_module, "writable_problem", lambda path: asked.append(path))
    with caplog.at_level(logging.INFO, logger="msbridge"):
        cfg = load_config(os.path.join(DATA, "seed000_monitor.yaml"))
    assert cfg.monitor_on is True
    assert (cfg.flush_steps, cfg.step_interval, cfg.print_interval) == (20, 1, 20)  # write every 20, record every step
    assert cfg.local_loss and cfg.global_loss and cfg.grad_norm
    assert thaw(cfg.health) == {"dump_dir": "/data/train_runs/exp_001/monitor", "dump_on_anomaly": True,
                                "nonfinite": {"check": True, "action": "stop"}}
    assert cfg.output_dir == "/data/train_runs/exp_001/monitor/{experiment}/{run_name}"  # files land in dump_path
    assert "/data/train_runs/exp_001/monitor" in asked
    said = [r.getMessage() for r in caplog.records if r.name == "msbridge"]
    for key in ("dump_path", "interval", "nan_check", "exception_dump", "skip_nan_step"):
        assert sum(f"monitor_config.{key} ->" in line for line in said) == 1, key
    assert any(line.endswith("seed000_monitor.yaml:4: monitor_config.interval -> flush_steps (steps between "
                             "writes to disk; every step is still recorded)") for line in said)


def thaw(value):
    return config_module.thaw(value)


def test_seed000_skeleton_with_document_end_marker_loads():
    cfg = load_config(os.path.join(DATA, "seed000_skeleton.yaml"))
    assert (cfg.flush_steps, cfg.health["dump_dir"]) == (10, "./monitor_output")
    assert thaw(cfg.params) == {"runner_config": {"epochs": 3, "batch_size": 8, "sink_mode": True}}


def test_seed000_rank_placeholder_in_dump_path(tmp_path):
    cfg = load_config(write(tmp_path, "monitor_config:\n  dump_path: ./monitor/rank_{rank}\n"
                                      "  skip_nan_step: True\n  warmup_steps: 100\n"))
    assert cfg.health["dump_dir"] == "./monitor/rank_{rank}"
    assert cfg.output_dir == "./monitor/rank_{rank}/{experiment}/{run_name}"
    assert cfg.health["nonfinite"]["action"] == "skip" and cfg.health["warmup_steps"] == 100


def test_seed000_keys_work_at_the_top_level_of_a_pure_file(tmp_path):
    cfg = load_config(write(tmp_path, "interval: 50\nnan_check: false\nexperiment: e\n"))
    assert cfg.flush_steps == 50 and cfg.health["nonfinite"]["check"] is False


def test_seed000_health_keys_are_type_checked(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "nan_check: 'yes'\nwarmup_steps: -1\n"))
    assert err.value.problems == ["run.yaml:1: nan_check: expected true or false, got 'yes'",
                                  "run.yaml:2: warmup_steps: expected an integer >= 0, got -1"]


# -- seed 002: the SummaryCollector article ------------------------------------------------------
def test_seed002_monitor_config_as_printed_does_what_the_article_says():
    cfg = load_config(os.path.join(SEED002, "run_llama2_7b_monitor.yaml"))
    assert (cfg.flush_steps, cfg.flush_seconds, cfg.print_interval) == (10, 30, 10)
    # `mindinsight start --summary-base-dir ./summary` lists the run as llama2_7b_run1
    assert thaw(cfg.sinks) == {"mindinsight": {"summary_base_dir": "./summary"}, "jsonl": {}}
    assert cfg.run_name == "llama2_7b_run1"
    assert cfg.local_loss and cfg.global_loss
    assert cfg.layer_norms == ".*" and cfg.histograms is None
    assert cfg.params["callbacks"][1] == {"type": "LossMonitor", "per_print_times": 10}  # ${...} resolved
    assert cfg.params["optimizer"]["type"] == "AdamW" and cfg.seq_length == 4096  # from the base file
    warned = texts(cfg, logging.WARNING)
    assert any(t.startswith("monitor_config.keep_default_callbacks -> no effect") for t in warned)
    assert any(t.startswith("monitor_config.collect_specified_data.collect_graph -> not recorded") for t in warned)


def test_seed002_base_plus_override_document_composes():
    cfg = load_config(os.path.join(SEED002, "run_llama2_7b.yaml"))
    assert thaw(cfg.params["runner_config"]) == {"epochs": 3, "batch_size": 4, "sink_mode": True, "sink_size": 10}
    assert cfg.params["train_dataset"]["batch_size"] == 4 and cfg.params["model"]["arch"]["type"] == "LlamaForCausalLM"
    assert cfg.flush_steps == 100  # no monitor section: msbridge's defaults, said once
    assert any(t.startswith("no monitor_config: or msbridge: section") for t in texts(cfg))


def test_seed002_collect_specified_data_keys(tmp_path):
    cfg = load_config(write(tmp_path, """\
        monitor_config:
          collect_specified_data:
            collect_metric: false
            collect_train_lineage: false
            histogram_regular: "^layers\\\\.0\\\\."
            collect_dataset_graph: false
    """))
    assert cfg.local_loss is False and cfg.global_loss is False and cfg.histograms == r"^layers\.0\."
    assert any("collect_train_lineage -> cannot be turned off" in t for t in texts(cfg, logging.WARNING))
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "monitor_config:\n  collect_specified_data:\n    collect_metrc: true\n"))
    assert err.value.problems == ["run.yaml:3: monitor_config.collect_specified_data.collect_metrc: unknown key; "
                                  "did you mean 'collect_metric'?"]
    assert "collect_metric" in SUMMARY_KEYS


def test_every_real_summary_collector_argument_is_understood_or_refused_with_its_reason(tmp_path):
    """Each argument of the installed MindSpore's ``SummaryCollector.__init__``, as the AlexNet sample passes it."""
    import inspect

    from mindspore.train import SummaryCollector

    real = [name for name in inspect.signature(SummaryCollector.__init__).parameters if name != "self"]
    assert {"keep_default_action", "collect_tensor_freq", "num_process", "custom_lineage_data", "max_file_size",
            "export_options"} <= set(real)
    assert set(real) <= set(HANDLERS), "a SummaryCollector argument msbridge would call unknown"
    cfg = load_config(write(tmp_path, """\
        monitor_config:
          summary_dir: ./summary_dir/summary_01
          collect_freq: 1
          num_process: 4
          keep_default_action: false
          collect_tensor_freq: 200
          max_file_size: 4096
          export_options: {tensor_format: npy}
          custom_lineage_data: {team: nlp, version: 3}
          collect_specified_data:
            collect_metric: true
            histogram_regular: "^conv1.*|^conv2.*"
    """))
    said = {t.split(" -> ")[0].split(".")[1]: t.split(" -> ", 1)[1] for t in texts(cfg)
            if t.startswith("monitor_config.") and " -> " in t}
    assert set(real) <= set(said), set(real) - set(said)
    assert not any("did you mean" in text for text in said.values())
    for name in ("num_process", "collect_tensor_freq", "max_file_size", "export_options"):
        assert said[name].startswith("no effect: msbridge ")
    assert thaw(cfg.params) == {"team": "nlp", "version": 3}
    assert cfg.local_loss and cfg.flush_steps == 1 and cfg.histograms == "^conv1.*|^conv2.*"


def test_keep_default_action_false_without_collect_metric_records_no_loss_and_says_so(tmp_path):
    cfg = load_config(write(tmp_path, """\
        monitor_config:
          keep_default_action: false
          collect_specified_data: {histogram_regular: "^fc"}
    """))
    assert cfg.local_loss is False and cfg.global_loss is False
    [warned] = [t for t in texts(cfg, logging.WARNING) if t.startswith("monitor_config.keep_default_action")]
    assert "add collect_metric: true to record it" in warned
    on = load_config(write(tmp_path, "monitor_config:\n  keep_default_action: true\n"))
    assert on.local_loss is True


@pytest.mark.parametrize("text, problem", [
    ("num_process: 0", "num_process: expected an integer > 0 or null, got 0"),
    ("export_options: npy", "export_options: expected a mapping or null, got 'npy'"),
    ("custom_lineage_data: {team: [a]}", "custom_lineage_data: expected a mapping of names to strings or numbers"),
    ("keep_default_actoin: false", "keep_default_actoin: unknown key; did you mean 'keep_default_action'?"),
])
def test_bad_summary_collector_arguments_name_line_and_key(tmp_path, text, problem):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, f"monitor_config:\n  {text}\n"))
    assert err.value.problems[0].startswith(f"run.yaml:2: monitor_config.{problem}"), err.value.problems


@pytest.mark.parametrize("value, expected", [("[]", None), ("['layers.0', 'attention']", "(?:layers.0)|(?:attention)"),
                                             ("'^embed'", "^embed"), ("true", ".*")])
def test_seed002_histogram_settings(tmp_path, value, expected):
    cfg = load_config(write(tmp_path, f"monitor_config:\n  histogram_settings: {value}\n"))
    assert cfg.histograms == expected


# -- mindformers 1.9 monitor_config ---------------------------------------------------------------
MINDFORMERS = """\
    model: {model_config: {seq_length: 32}}
    monitor_config:
      monitor_on: True
      dump_path: ''
      target: ['layers.0', 'attention']
      invert: True
      step_interval: 2
      local_loss_format: ['log', 'tensorboard']
      device_local_norm_format: tensorboard
      local_norm_format: log
      optimizer_state_format: null
      max_attention_logit_format: log
      throughput_baseline: 12.5
      print_struct: False
      check_for_global_norm: True
      global_norm_spike_threshold: 3.0
      global_norm_spike_count_threshold: 10
"""


def test_mindformers_monitor_config_maps_formats_and_leaves_the_rest_to_mindformers(tmp_path):
    cfg = load_config(write(tmp_path, MINDFORMERS))
    assert cfg.step_interval == 2 and cfg.local_loss and cfg.grad_norm and cfg.throughput
    assert sorted(cfg.sinks) == ["jsonl", "tensorboard"]
    assert cfg.health == {"grad_norm_spike": {"check": True, "threshold": 3.0, "count": 10}}
    assert cfg.output_dir == config_module.DEFAULT_OUTPUT_DIR  # dump_path '' moves nothing
    regex = re.compile(cfg.layer_norms)  # target + invert, matched with re.search as mindformers does
    assert regex.search("model.layers.1.mlp.w") and not regex.search("model.layers.0.mlp.w")
    assert not regex.search("model.layers.3.attention.wq")
    said = texts(cfg)
    assert "monitor_config.local_loss_format -> local_loss: true, sinks.tensorboard, log = the jsonl file and " \
           "the console line" in said
    assert "monitor_config.print_struct -> left to mindformers (prints parameter names, then stops training); " \
           "msbridge does not use it" in said
    assert "monitor_config.optimizer_state_format -> null: nothing turned on; layer_norms keeps its own setting" \
        in said
    assert "monitor_config.dump_path -> no dump dir (empty); mindformers then inserts no TensorDump" in said
    assert cfg.seq_length == 32


@pytest.mark.parametrize("key", ["local_norm_format", "weight_state_format", "optimizer_state_format"])
def test_mindformers_norm_formats_turn_on_layer_norms_with_target(tmp_path, key):
    cfg = load_config(write(tmp_path, f"monitor_config:\n  target: ['attention']\n  {key}: [tensorboard]\n"))
    assert cfg.layer_norms == "attention" and "tensorboard" in cfg.sinks
    assert f"monitor_config.{key} -> layer_norms: 'attention', sinks.tensorboard" in texts(cfg)
    assert "monitor_config.target -> the layer_norms regex (with invert)" in texts(cfg)


def test_every_key_of_mindformers_monitor_config_is_understood():
    spec = importlib.util.find_spec("mindformers")
    template = os.path.join(spec.submodule_search_locations[0], "tools", "register", "template.py")
    with open(template, encoding="utf-8") as fh:
        module = ast.parse(fh.read())
    cls = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "MonitorConfig")
    keys = [t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name) and not t.id.startswith("_")]
    assert len(keys) > 15
    assert [k for k in keys if k not in HANDLERS and k not in FIELD_NAMES] == []


def test_format_values_are_checked_with_a_suggestion(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "monitor_config:\n  local_loss_format: [log, tensorbord]\n"
                                    "  weight_state_format: 3\n"))
    assert err.value.problems == [
        "run.yaml:2: monitor_config.local_loss_format: unknown format 'tensorbord'; did you mean 'tensorboard'? "
        f"(allowed: {', '.join(FORMAT_VALUES)})",
        f"run.yaml:3: monitor_config.weight_state_format: expected one of {', '.join(map(repr, FORMAT_VALUES))} "
        "or a list of them, got 3",
    ]


def test_mlflow_jsonl_mindinsight_as_format_values_and_flags(tmp_path):
    cfg = load_config(write(tmp_path, """\
        monitor_config:
          local_loss_format: [mlflow, mindinsight]
          tensorboard: {logdir: ./tb}
    """))
    assert thaw(cfg.sinks) == {"mlflow": {}, "mindinsight": {}, "tensorboard": {"logdir": "./tb"}, "jsonl": {}}
    with pytest.raises(ConfigError, match="run.yaml:1: jsonl: jsonl cannot be turned off"):
        load_config(write(tmp_path, "jsonl: false\n"))


def test_msbridge_section_wins_and_monitor_config_is_left_to_mindformers(tmp_path):
    cfg = load_config(write(tmp_path, """\
        monitor_config: {monitor_on: False, dump_path: ''}
        msbridge:
          flush_steps: 25
          sinks: [tensorboard]
        optimizer: {learning_rate: 0.1}
    """))
    assert cfg.monitor_on is True and cfg.flush_steps == 25
    assert thaw(cfg.params) == {"monitor_config": {"monitor_on": False, "dump_path": ""},
                                "optimizer": {"learning_rate": 0.1}}
    assert any(t.startswith("monitor_config -> params.monitor_config (left to mindformers") for t in texts(cfg))


def test_mindformers_only_keys_in_the_msbridge_section_warn(tmp_path):
    cfg = load_config(write(tmp_path, "msbridge:\n  print_struct: true\n"))
    assert texts(cfg, logging.WARNING)[0].startswith("msbridge.print_struct -> no effect: only mindformers reads it")


def test_top_level_msbridge_key_in_a_training_yaml_is_said(tmp_path):
    cfg = load_config(write(tmp_path, "flush_steps: 5\nmonitor_config: {interval: 9}\n"))
    assert cfg.flush_steps == 9 and cfg.params["flush_steps"] == 5
    assert texts(cfg, logging.WARNING)[0].startswith("flush_steps -> params.flush_steps: a top-level key")


# -- precedence between spellings ----------------------------------------------------------------
def test_two_spellings_in_one_layer_conflict(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "monitor_config:\n  interval: 20\n  collect_freq: 10\n"))
    assert err.value.problems == ["run.yaml:3: monitor_config.collect_freq: conflicts with monitor_config.interval "
                                  "(run.yaml:2): both set flush_steps (10 vs 20); keep one"]


def test_equal_spellings_agree_and_a_later_layer_wins_with_a_note(tmp_path):
    cfg = load_config(write(tmp_path, "interval: 20\nflush_steps: 20\n---\ncollect_freq: 40\n"))
    assert cfg.flush_steps == 40
    assert "collect_freq overrides flush_steps (run.yaml:2) for flush_steps: 40" in texts(cfg)


def test_bad_target_and_zero_format_are_problems_not_crashes(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "monitor_config:\n  target: 5\n  local_norm_format: log\n"
                                    "  local_loss_format: 0\n  mlflow: 0\n"))
    assert err.value.problems == [
        "run.yaml:2: monitor_config.target: expected a list of parameter-name patterns, got 5",
        f"run.yaml:4: monitor_config.local_loss_format: expected one of {', '.join(map(repr, FORMAT_VALUES))} "
        "or a list of them, got 0",
        "run.yaml:5: monitor_config.mlflow: expected true, false or a mapping of mlflow sink options, got 0",
    ]

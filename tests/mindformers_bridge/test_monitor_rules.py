"""``config check`` on a mindformers run YAML: mindformers' own ``monitor_config`` rules, and its keys' meanings.

The oracle is mindformers itself: its ``MonitorConfig.apply`` (the KeyError for an unknown key) and its
``TrainingStateMonitor`` (the ValueError for a ``*_format`` value), run on every sample.
"""
from __future__ import annotations

import os
import textwrap
from importlib import metadata

import pytest
import yaml

pytest.importorskip("mindformers")

from mindformers.core.callback.callback import TrainingStateMonitor  # noqa: E402
from mindformers.tools.register.template import MonitorConfig  # noqa: E402

from msbridge import ConfigError  # noqa: E402
from msbridge.config import load as config_module  # noqa: E402
from msbridge.config.load import load_config  # noqa: E402
from msbridge.health.spec import HealthSpec  # noqa: E402

pytestmark = pytest.mark.compat  # also run against the oldest supported pair (.ci/compat.sh)
VERSION = metadata.version("mindformers")  # the message names the installed one (1.9.0, or 1.6.0 in compat)
HERE = os.path.dirname(__file__)
DATA = os.path.join(HERE, "..", "data")
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
#: Every monitor_config sample: mindformers' docs, the monitoring articles users follow, msbridge's example.
SAMPLES = [os.path.join(DATA, "mindformers_docs", "monitor_master.yaml"),
           os.path.join(DATA, "mindformers_docs", "monitor_r1.5.0.yaml"),
           os.path.join(DATA, "seed000_monitor.yaml"),
           os.path.join(DATA, "seed002", "configs", "llama2", "run_llama2_7b_monitor.yaml"),
           os.path.join(EXAMPLES, "mindformers", "tiny_llama.yaml")]
VARIANTS = [{"local_norm_format": "mlflow"}, {"weight_state_format": ["log", "jsonl"]}, {"interval": 20},
            {"sinks": ["mlflow"]}, {"local_loss_format": "tensorboard"}, {"step_intervl": 2}]


def _monitor_config(path):
    with open(path, encoding="utf-8") as fh:
        docs = [d for d in yaml.safe_load_all(fh) if isinstance(d, dict)]
    return next(d["monitor_config"] for d in reversed(docs) if isinstance(d.get("monitor_config"), dict))


def _run_yaml(tmp_path, monitor, entry="experiment: rules\nsinks: [jsonl]\n", name="run.yaml"):
    path = tmp_path / name
    body = yaml.safe_dump({"run_mode": "train", "model": {"model_config": {"seq_length": 32}},
                           "monitor_config": monitor}, sort_keys=False)
    path.write_text(body + "callbacks:\n  - type: MFLossMonitor\n  - type: MSBridgeMonitor\n"
                    + textwrap.indent(entry, "    "))
    return str(path)


def _msbridge_accepts(path):
    try:
        load_config(path)
    except ConfigError as exc:
        return False, str(exc)
    return True, ""


def _mindformers_accepts(monitor):
    try:
        config = MonitorConfig.apply(dict(monitor))
        TrainingStateMonitor(origin_epochs=1, config=config, step_interval=config["step_interval"], dataset_size=10)
    except (KeyError, ValueError, TypeError) as exc:
        return False, str(exc)
    return True, ""


def _cases():
    for path in SAMPLES:
        yield os.path.basename(path), _monitor_config(path)
    base = _monitor_config(SAMPLES[0])
    for change in VARIANTS:
        yield f"docs+{sorted(change)[0]}", {**base, **change}


def test_every_monitor_config_the_check_accepts_mindformers_accepts(tmp_path, persistent):
    accepted = refused = 0
    for i, (name, monitor) in enumerate(_cases()):
        ours, why = _msbridge_accepts(_run_yaml(tmp_path, monitor, name=f"run{i}.yaml"))
        theirs, their_why = _mindformers_accepts(monitor)
        assert theirs or not ours, f"{name}: msbridge accepts what mindformers refuses: {their_why}"
        assert ours or not theirs, f"{name}: msbridge refuses what mindformers accepts: {why}"
        accepted, refused = accepted + ours, refused + (not ours)
    assert accepted == 4 and refused == 7  # the 3 docs/example samples and one variant; both articles and 5 variants


def test_msbridge_setting_in_monitor_config_says_move_it_with_file_and_line(tmp_path, persistent):
    path = _run_yaml(tmp_path, {"monitor_on": True, "interval": 20, "nan_check": True})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert f"run.yaml:7: monitor_config.interval: mindformers {VERSION} refuses this key (KeyError: The config " \
           "'monitor_config' gets an unexpected key: interval); it is an msbridge setting: move it into the " \
           "MSBridgeMonitor entry (" in text and "run.yaml:11, callbacks[1])" in text
    assert f"run.yaml:8: monitor_config.nan_check: mindformers {VERSION} refuses this key" in text


def test_mlflow_format_refused_with_the_reason(tmp_path, persistent):
    with pytest.raises(ConfigError) as err:
        load_config(_run_yaml(tmp_path, {"monitor_on": True, "local_norm_format": "mlflow"}))
    assert "monitor_config.local_norm_format: 'mlflow' is refused by mindformers' TrainingStateMonitor (ValueError: " \
           "The value of local_norm_format should be a `str` in 'log' or 'tensorboard'); to send this to mlflow, " \
           "list it in the MSBridgeMonitor entry's sinks" in str(err.value)


def test_runner_wrapper_options_are_checked(tmp_path, persistent):
    path = tmp_path / "run.yaml"
    path.write_text(open(_run_yaml(tmp_path, {"monitor_on": False}, name="base.yaml")).read()
                    + "runner_wrapper:\n  type: MSBridgeRing\n  wrapper: MFTrainOneStepCell\n  ring_sise: 256\n"
                      "  use_clip_grad: True\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert "run.yaml:15: runner_wrapper.ring_sise: unknown key for MSBridgeRing or MFTrainOneStepCell (its **kwargs " \
           "would swallow it); did you mean 'ring_size'?" in str(err.value)
    path.write_text(path.read_text().replace("ring_sise", "ring_size"))
    load_config(str(path))
    path.write_text(path.read_text().replace("MFTrainOneStepCell", "TrainOneStepWithLossScaleCell"))
    with pytest.raises(ConfigError, match=r"runner_wrapper.use_clip_grad: unknown key for MSBridgeRing or "
                                          r"TrainOneStepWithLossScaleCell"):
        load_config(str(path))  # MindSpore's cell has no use_clip_grad


def test_runner_wrapper_around_a_users_own_cell_checks_msbridge_keys_only(tmp_path, persistent):
    base = open(_run_yaml(tmp_path, {"monitor_on": False}, name="base.yaml")).read()
    path = tmp_path / "run.yaml"
    path.write_text(base + "runner_wrapper:\n  type: MSBridgeRing\n  wrapper: CPUTrainOneStepCell\n"
                           "  ring_sise: 256\n  my_own_option: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    text = str(err.value)
    assert "runner_wrapper.ring_sise: not a key of MSBridgeRing; did you mean 'ring_size'?" in text
    assert "my_own_option" not in text  # the cell's own arguments are its business


def test_mindformers_defaults_switch_no_msbridge_check_off(tmp_path, persistent):
    defaults = load_config(_run_yaml(tmp_path, {"monitor_on": True}, name="plain.yaml"))
    # as in mindformers' docs: its check off, with the limits it would use
    cfg = load_config(_run_yaml(tmp_path, {"monitor_on": True, "check_for_global_norm": False,
                                           "global_norm_spike_threshold": 1.0,
                                           "global_norm_spike_count_threshold": 10}))
    on = HealthSpec.parse(dict(defaults.health)).action("grad_norm_spike")
    assert on is not None  # msbridge checks grad-norm spikes by default
    # mindformers' default turns mindformers' check off only
    assert HealthSpec.parse(dict(cfg.health)).action("grad_norm_spike") == on
    assert HealthSpec.parse({"grad_norm_spike": {"check": False}}).action("grad_norm_spike") is None  # can fail
    notes = [str(n) for n in cfg.provenance.notes]
    assert any("monitor_config.check_for_global_norm -> false: mindformers' own spike check" in n for n in notes)
    assert any("monitor_config.global_norm_spike_threshold -> left to mindformers" in n for n in notes)
    checked = load_config(_run_yaml(tmp_path, {"monitor_on": True, "check_for_global_norm": True,
                                               "global_norm_spike_threshold": 1.0}, name="checked.yaml"))
    assert checked.health["grad_norm_spike"]["threshold"] == 1.0  # mindformers checks it: msbridge checks it too


def test_step_interval_thins_training_state_monitor_only(tmp_path, persistent):
    cfg = load_config(_run_yaml(tmp_path, {"monitor_on": True, "step_interval": 10}))
    assert cfg.step_interval == 1  # MFLossMonitor logs every step; msbridge records every step
    assert any("TrainingStateMonitor writes every 10 steps" in str(n) for n in cfg.provenance.notes)
    thinned = load_config(_run_yaml(tmp_path, {"monitor_on": True, "step_interval": 10}, name="entry.yaml",
                                    entry="experiment: rules\nstep_interval: 5\n"))
    assert thinned.step_interval == 5  # msbridge's own key, in its entry


def test_dump_path_places_only_what_mindformers_places(tmp_path, persistent):
    defaults = load_config(_run_yaml(tmp_path, {"monitor_on": True}, name="plain.yaml"))
    cfg = load_config(_run_yaml(tmp_path, {"monitor_on": True, "dump_path": "./dump"}))
    assert cfg.output_dir == defaults.output_dir == config_module.DEFAULT_OUTPUT_DIR
    assert "dump_dir" not in cfg.health and "dump_dir" not in defaults.health  # msbridge's default: {run_dir}/dumps
    assert any("its TensorDump files" in str(n) and "'./dump'/rank_N" in str(n) for n in cfg.provenance.notes)


MEGATRON_DATASET = {"data_loader": {"type": "BlendedMegatronDatasetDataLoader", "config": {"seq_length": 4096}}}


def _seq_yaml(tmp_path, sections, name):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"run_mode": "train", **sections}, sort_keys=False)
                    + "callbacks:\n  - type: MSBridgeMonitor\n    experiment: seq\n")
    return str(path)


def test_seq_length_where_mindformers_yamls_keep_it(tmp_path, persistent):
    # configs/qwen3/pretrain_qwen3_32b_4k.yaml keeps it in the Megatron dataset's config too
    cfg = load_config(_seq_yaml(tmp_path, {"model": {"model_config": {"hidden_size": 8}},
                                           "train_dataset": MEGATRON_DATASET}, "megatron.yaml"))
    assert cfg.seq_length == 4096
    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"seq_length": 8192, "hidden_size": 8}')
    cfg = load_config(_seq_yaml(tmp_path, {"pretrained_model_dir": str(model_dir),
                                           "model": {"model_config": {"hidden_size": 8}}}, "pretrained.yaml"))
    assert cfg.seq_length == 8192
    assert any("config.json) -> seq_length: 8192" in str(n) for n in cfg.provenance.notes)


def test_no_seq_length_says_tokens_per_second_is_off_and_how_to_turn_it_on(tmp_path, persistent):
    cfg = load_config(_seq_yaml(tmp_path, {"model": {"model_config": {"hidden_size": 8}}}, "none.yaml"))
    assert cfg.seq_length is None
    said = [str(n) for n in cfg.provenance.notes if "tokens/s is off" in str(n)]
    assert len(said) == 1 and "set seq_length (msbridge's key) to turn it on" in said[0]


@pytest.mark.parametrize("key, value", [("max_attention_logit_format", "log"), ("health_checkpoint", None)])
def test_a_key_of_a_later_mindformers_follows_the_installed_one(tmp_path, persistent, key, value):
    # mindformers 1.9 has both keys, 1.6 and 1.7 neither (1.8: max_attention_logit_format only)
    monitor = {"monitor_on": True, key: value}
    ours, why = _msbridge_accepts(_run_yaml(tmp_path, monitor))
    theirs, their_why = _mindformers_accepts(monitor)
    assert ours == theirs == (key in vars(MonitorConfig)), (why, their_why)
    assert ours or f"monitor_config.{key}: mindformers {VERSION} refuses this key" in why

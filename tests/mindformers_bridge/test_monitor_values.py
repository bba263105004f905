"""``config check`` against mindformers' own constructors on ``monitor_config`` values, not only its key lists.

The oracle is mindformers itself: ``MonitorConfig.apply`` (its keys), then, when ``monitor_on`` is true (else
the Trainer builds no monitor), ``TrainingStateMonitor(config=..., step_interval=...)`` as the Trainer builds it
before the first step. Each variant's verdict there and ``msbridge config check``'s must agree; where msbridge
is deliberately stricter (``STRICTER``), its message must say why. Marked ``compat``: ``.ci/compat.sh`` runs it
against mindformers 1.6.0 too (``.venv-compat-oldest``), where ``step_interval: 0`` is accepted by mindformers.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata

import pytest
import yaml

pytest.importorskip("mindformers")

from mindformers.core.callback.callback import TrainingStateMonitor  # noqa: E402
from mindformers.tools.register.template import MonitorConfig  # noqa: E402

pytestmark = pytest.mark.compat
VERSION = metadata.version("mindformers")
ON = {"monitor_on": True}
#: name -> monitor_config; every value class TrainingStateMonitor's constructor checks, at and beside its edge.
VARIANTS = {
    "defaults": ON,
    "step-interval-1": {**ON, "step_interval": 1},
    "step-interval-0": {**ON, "step_interval": 0},
    "step-interval-negative": {**ON, "step_interval": -3},
    "step-interval-float": {**ON, "step_interval": 2.0},
    "step-interval-text": {**ON, "step_interval": "10"},
    "step-interval-true": {**ON, "step_interval": True},
    "target-list": {**ON, "target": ["layers.0", "attention"]},
    "target-str": {**ON, "target": "layers.0"},
    "target-list-of-int": {**ON, "target": [1]},
    "target-empty-list": {**ON, "target": []},
    "target-null": {**ON, "target": None},
    "invert-true": {**ON, "invert": True},
    "invert-int": {**ON, "invert": 1},
    "invert-text": {**ON, "invert": "yes"},
    "print-struct-1": {**ON, "print_struct": 1},
    "print-struct-false": {**ON, "print_struct": False},
    "throughput-positive": {**ON, "throughput_baseline": 120.5},
    "throughput-zero": {**ON, "throughput_baseline": 0},
    "throughput-text": {**ON, "throughput_baseline": "fast"},
    "spike-count-0": {**ON, "global_norm_spike_count_threshold": 0},
    "spike-count-5": {**ON, "global_norm_spike_count_threshold": 5},
    "spike-count-float": {**ON, "global_norm_spike_count_threshold": 2.5},
    "stable-rank-interval-0": {**ON, "stable_rank_config": {"format": "log", "step_interval": 0}},
    "stable-rank-interval-50": {**ON, "stable_rank_config": {"format": "log", "step_interval": 50}},
    "stable-rank-power-0": {**ON, "stable_rank_config": {"format": "log", "power_iteration_num": 0}},
    "weight-format-1": {**ON, "weight_state_format": 1},
    "weight-format-log": {**ON, "weight_state_format": "log"},
    "norm-format-list": {**ON, "local_norm_format": ["log", "tensorboard"]},
    "norm-format-empty": {**ON, "local_norm_format": ""},
    "norm-format-mlflow": {**ON, "local_norm_format": "mlflow"},
    "loss-format-mapping": {**ON, "local_loss_format": {"log": 1}},
    "off-with-mlflow-format": {"monitor_on": False, "local_norm_format": "mlflow"},
    "off-with-step-interval-0": {"monitor_on": False, "step_interval": 0},
    "off-with-unknown-key": {"monitor_on": False, "intervall": 3},
}
#: Accepted by the mindformers named, refused by msbridge on purpose: the text its message gives as the reason.
#: 1.6.0 checks neither step_interval nor global_norm_spike_count_threshold; msbridge applies 1.9's rule and says so.
STRICTER = {
    "step-interval-true": ("1.6", "1.9", "true is not a step count"),
    **{name: ("1.6", "mindformers 1.9+ refuses it") for name in (
        "step-interval-0", "step-interval-negative", "step-interval-float", "step-interval-text", "spike-count-0",
        "spike-count-float")},
}


def mindformers_verdict(monitor):
    """None when mindformers builds (or, with monitor_on false, skips) its monitor, else its error."""
    try:
        config = MonitorConfig.apply(dict(monitor))
        if config.get("monitor_on"):
            TrainingStateMonitor(origin_epochs=1, config=config, step_interval=config.get("step_interval"),
                                 dataset_size=10)
    except (KeyError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _run_yaml(tmp_path, name, monitor):
    path = tmp_path / f"{name}.yaml"
    body = yaml.safe_dump({"run_mode": "train", "monitor_config": monitor}, sort_keys=False)
    path.write_text(body + "callbacks:\n  - type: MSBridgeMonitor\n" + textwrap.indent("experiment: values\n", "    "))
    return path


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """``msbridge config check`` on each variant, run as users run it (one process for all: mindformers' rules
    are read once): name -> (exit code, output)."""
    root = tmp_path_factory.mktemp("values")
    paths = {name: _run_yaml(root, name, monitor) for name, monitor in VARIANTS.items()}
    code = ("import sys, io, contextlib\nfrom msbridge.cli.main import main\nfor p in sys.argv[1:]:\n"
            "    out = io.StringIO()\n    with contextlib.redirect_stdout(out):\n"
            "        code = main(['config', 'check', p])\n"
            "    print(repr((code, out.getvalue())))\n")
    done = subprocess.run([sys.executable, "-c", code, *map(str, paths.values())], capture_output=True, text=True,
                          cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [eval(line) for line in done.stdout.splitlines() if line.startswith("(")]  # noqa: S307 (our repr)
    assert len(results) == len(paths), done.stdout[-2000:]
    return dict(zip(paths, results))


def test_enough_variants_and_both_verdicts_occur():
    verdicts = [mindformers_verdict(m) is None for m in VARIANTS.values()]
    assert len(VARIANTS) >= 30 and 10 <= sum(verdicts) <= len(verdicts) - 10


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_config_check_agrees_with_mindformers(checked, name):
    code, out = checked[name]
    theirs = mindformers_verdict(VARIANTS[name])
    stricter = STRICTER.get(name)
    if theirs is not None:
        assert code == 1, f"msbridge accepts what mindformers {VERSION} refuses ({theirs}):\n{out}"
        assert "monitor_config" in out and "Traceback" not in out
    elif stricter and VERSION.rsplit(".", 1)[0] in stricter[:-1]:
        assert code == 1 and stricter[-1] in out, out
    else:
        assert code == 0, f"msbridge refuses what mindformers {VERSION} accepts:\n{out}"

"""The ``health`` section: profiles, validation from the detectors' own declarations, parsed once at load.

Every message names the key's full path (and, through the config loader, its
``file:line``) and the nearest valid key.
"""
from __future__ import annotations

import pytest

from msbridge import ConfigError
from msbridge.health.detectors import DETECTORS
from msbridge.health.detectors.base import ACTIONS, PROFILES, Option
from msbridge.health.spec import SETTINGS, HealthSpec, health_problems
from msbridge.options import Option as SinkOption


def test_profiles_set_the_default_actions_and_an_explicit_action_wins():
    production, debug = HealthSpec.parse({}), HealthSpec.parse({"profile": "debug"})
    assert production.action("nonfinite") == "dump" and not production.every_step
    assert debug.action("nonfinite") == "stop" and debug.every_step
    spec = HealthSpec.parse({"profile": "debug", "nonfinite": {"action": "log"}, "plateau": {"check": False}})
    assert spec.action("nonfinite") == "log" and spec.action("plateau") is None and not spec.every_step


def test_every_problem_is_reported_at_once_with_the_nearest_key():
    with pytest.raises(ConfigError) as err:
        HealthSpec.parse({"profil": "debug", "dump_quota_mb": -1,
                          "plateau": {"patiense": 3, "action": "skip"},
                          "grad_norm_spike": {"factor": 0.5, "action": "dumb"},
                          "throughput_drop": {"factor": 1.5}, "loss_spike": 3})
    problems = err.value.problems
    assert "health.profil: unknown key; did you mean 'profile'?" in problems
    assert "health.plateau.patiense: unknown option; did you mean 'patience'?" in problems
    assert any(p.startswith("health.plateau.action: skip is only for nonfinite") for p in problems)
    assert any(p.startswith("health.grad_norm_spike.action:") and "did you mean 'dump'" in p for p in problems)
    assert "health.grad_norm_spike.factor: expected a number > 1, got 0.5" in problems
    assert "health.throughput_drop.factor: expected a number > 0 and < 1, got 1.5" in problems
    assert "health.dump_quota_mb: expected a number >= 0, got -1" in problems
    assert any(p.startswith("health.loss_spike: expected a mapping") for p in problems)
    assert len(problems) == 8


def test_problems_come_with_their_config_path_for_file_and_line():
    assert health_problems({"plateau": {"patience": 0}, "warmup_steps": "10"}) == [
        (("health", "warmup_steps"), "expected an integer >= 0, got '10'"),
        (("health", "plateau", "patience"), "expected an integer >= 1, got 0"),
    ]
    assert health_problems({"profile": "debug"}) == [] and health_problems(None) == []
    assert health_problems([1]) == [(("health",), "expected a mapping, got [1]")]


def test_types_choices_and_null_come_from_the_declarations():
    assert health_problems({"profile": "debugg", "dump_dir": None, "dump_batch": 1,
                            "grad_norm_spike": {"threshold": None, "window": 2.5, "count": True}}) == [
        (("health", "profile"), "expected one of debug, production, got 'debugg'; did you mean 'debug'?"),
        (("health", "dump_batch"), "expected true or false, got 1"),
        (("health", "grad_norm_spike", "window"), "expected an integer >= 1, got 2.5"),
        (("health", "grad_norm_spike", "count"), "expected an integer >= 0, got True"),
    ]
    assert health_problems({"dump_dir": 3, "plateau": {"check": "no"}}) == [
        (("health", "dump_dir"), "expected null or a non-empty string, got 3 (quote it: '3')"),
        (("health", "plateau", "check"), "expected true or false, got 'no'"),
    ]


def test_checks_declare_options_with_the_sinks_option_type_and_rule():
    """One ``Option`` for sinks and checks: a path may not be empty under ``health`` either."""
    declared = list(SETTINGS.values()) + [o for d in DETECTORS.values() for o in d.options.values()]
    assert Option is SinkOption and all(type(o) is SinkOption for o in declared)
    assert health_problems({"dump_dir": "", "checkpoint_dir": "/ckpt"}) == [
        (("health", "dump_dir"), "expected null or a non-empty string, got ''")]


def test_every_declaration_is_complete_and_its_default_is_valid():
    for option in SETTINGS.values():
        assert option.doc and option.check(option.default) is None
    for name, detector in DETECTORS.items():
        assert detector.name == name and set(detector.default_action) == set(PROFILES)
        assert set(detector.default_action.values()) <= set(ACTIONS)
        for key, option in detector.options.items():
            assert isinstance(option, Option) and option.doc, f"{name}.{key}"
            assert option.check(option.default) is None, f"{name}.{key}"
    spec = HealthSpec.parse({})
    assert list(spec.checks) == [name for name, detector in DETECTORS.items() if not detector.opt_in]
    assert "eval_plateau" not in spec.checks and "eval_plateau" in HealthSpec.parse({"eval_plateau": {}}).checks
    assert spec.options("plateau") == {"patience": 500, "min_delta": 1e-3, "ema_decay": 0.98}
    assert spec.dump_quota_mb == 512.0 and spec.warmup_steps == 100


def test_the_seed_yaml_reaches_health_through_the_config_loader(tmp_path):
    from msbridge.config.load import load_config

    path = tmp_path / "seed000.yaml"
    path.write_text(f"""monitor_config:
  dump_path: {tmp_path}/monitor
  interval: 20
  nan_check: True
  exception_dump: True
  skip_nan_step: True
  warmup_steps: 50
  check_for_global_norm: True
  global_norm_spike_threshold: 3.0
  global_norm_spike_count_threshold: 2
""")
    spec = load_config(str(path)).health_spec
    assert spec.action("nonfinite") == "skip" and spec.dump_on_anomaly and spec.warmup_steps == 50
    assert spec.dump_dir == f"{tmp_path}/monitor"
    assert spec.checks["grad_norm_spike"]["threshold"] == 3.0 and spec.checks["grad_norm_spike"]["count"] == 2
    assert spec == HealthSpec.parse(load_config(str(path)).health)


def test_the_loaded_config_carries_the_spec_parsed_once(tmp_path, monkeypatch):
    from msbridge.config.load import Config, load_config
    from msbridge.health import spec as spec_module

    calls = []
    top = spec_module._top_problems  # called once per parse of a health section
    monkeypatch.setattr(spec_module, "_top_problems", lambda section: calls.append(section) or top(section))
    cfg = load_config({"health": {"profile": "debug"}})
    assert len(calls) == 1
    assert cfg.health_spec is cfg.health_spec and cfg.health_spec.action("nonfinite") == "stop"
    assert len(calls) == 1, "the callback's health_spec is the one parsed at load"

    with pytest.raises(ConfigError, match=r"health\.plateau\.patience: expected an integer >= 1, got 0"):
        Config(health={"plateau": {"patience": 0}})  # built directly: parsed, and refused, as it is built


def test_a_bad_health_key_names_file_line_and_the_nearest_key(tmp_path):
    from msbridge.config.load import load_config

    path = tmp_path / "run.yaml"
    path.write_text("experiment: x\nhealth:\n  plateau:\n    patiense: 3\n  warmup_step: 5\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert err.value.problems == [
        "run.yaml:5: health.warmup_step: unknown key; did you mean 'warmup_steps'?",
        "run.yaml:4: health.plateau.patiense: unknown option; did you mean 'patience'?",
    ]

"""The ``health`` section of the config: checks, actions, profiles, dumps, validated before training.

Shape: top-level options (``profile``, ``warmup_steps``, the dump and checkpoint
options) plus one section per check, ``health.<check>: {check: bool, action:
str, ...options}``. The config loader maps the seeds' keys here: ``nan_check``
-> ``nonfinite.check``, ``skip_nan_step: true`` -> ``nonfinite.action: skip``,
``exception_dump`` -> ``dump_on_anomaly``, ``dump_path`` -> ``dump_dir``,
mindformers' ``check_for_global_norm`` / ``global_norm_spike_threshold`` /
``global_norm_spike_count_threshold`` -> ``grad_norm_spike.check`` /
``.threshold`` / ``.count``. Every problem is reported at once, with the key's
full name and the nearest valid key.

Profiles give each check its default action (an explicit ``action`` wins):

==================  =======  ==========
check               debug    production
==================  =======  ==========
nonfinite           stop     dump
grad_norm_spike     dump     dump
loss_spike          dump     log
plateau             log      log
throughput_drop     log      log
==================  =======  ==========

Example:
    >>> spec = HealthSpec.parse({"profile": "debug", "warmup_steps": 20,
    ...                          "plateau": {"action": "stop", "patience": 50}})
    >>> spec.action("nonfinite"), spec.action("plateau"), spec.every_step
    ('stop', 'stop', True)
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import ConfigError, did_you_mean

LOG, DUMP, SKIP, STOP, CHECKPOINT_AND_STOP = "log", "dump", "skip", "stop", "checkpoint_and_stop"
ACTIONS = (LOG, DUMP, SKIP, STOP, CHECKPOINT_AND_STOP)
#: Actions that end training at the firing step; configuring one makes health check every step.
STOP_ACTIONS = (STOP, CHECKPOINT_AND_STOP)
PROFILES = ("debug", "production")

#: Each check's options and defaults (``check: true`` and the profile's ``action`` are added).
CHECK_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "nonfinite": {},
    "grad_norm_spike": {"factor": 4.0, "window": 100, "threshold": None, "count": 1},
    "loss_spike": {"window": 50, "sigmas": 6.0, "recover_sigmas": 2.0, "min_rise": 0.1},
    "plateau": {"patience": 500, "min_delta": 1e-3, "ema_decay": 0.98},
    "throughput_drop": {"baseline_steps": 20, "window": 10, "factor": 0.5},
}
PROFILE_ACTIONS: Dict[str, Dict[str, str]] = {
    "debug": {"nonfinite": STOP, "grad_norm_spike": DUMP, "loss_spike": DUMP, "plateau": LOG,
              "throughput_drop": LOG},
    "production": {"nonfinite": DUMP, "grad_norm_spike": DUMP, "loss_spike": LOG, "plateau": LOG,
                   "throughput_drop": LOG},
}
_TOP_TYPES: Dict[str, Tuple[type, ...]] = {
    "profile": (str,), "warmup_steps": (int,), "dump_on_anomaly": (bool,), "dump_dir": (str, type(None)),
    "dump_quota_mb": (int, float), "dump_min_free_mb": (int, float), "dump_every_steps": (int,),
    "dump_window": (int,), "dump_batch": (bool,), "checkpoint_dir": (str, type(None)), "snapshot_every": (int,),
}
# option: (lowest, whether the lowest itself is allowed, highest (excluded) or None)
_RANGES: Dict[str, Tuple[float, bool, Optional[float]]] = {
    "warmup_steps": (0, True, None), "dump_quota_mb": (0, True, None), "dump_min_free_mb": (0, True, None),
    "dump_every_steps": (1, True, None), "dump_window": (1, True, None), "snapshot_every": (1, True, None),
    "window": (1, True, None), "sigmas": (0, False, None), "recover_sigmas": (0, False, None),
    "min_rise": (0, True, None), "patience": (1, True, None), "min_delta": (0, True, None),
    "ema_decay": (0, False, 1), "baseline_steps": (1, True, None), "threshold": (0, False, None),
    "count": (0, True, None),
    # factor means opposite things: a spike is above factor x median, a drop below factor x baseline
    "grad_norm_spike.factor": (1, False, None), "throughput_drop.factor": (0, False, 1),
}
_INT_OPTIONS = {"window", "patience", "baseline_steps", "count"}


@dataclass(frozen=True)
class HealthSpec:
    """The validated ``health`` section. Build it with ``HealthSpec.parse``.

    ``checks`` maps each enabled check to its options, ``action`` included.

    Example:
        >>> HealthSpec.parse({}).action("nonfinite")
        'dump'
        >>> HealthSpec.parse({"nonfinite": {"check": False}}).action("nonfinite") is None
        True
    """

    profile: str = "production"
    warmup_steps: int = 100
    dump_on_anomaly: bool = True
    dump_dir: Optional[str] = None
    dump_quota_mb: float = 512.0
    dump_min_free_mb: float = 1024.0
    dump_every_steps: int = 100
    dump_window: int = 100
    dump_batch: bool = False
    checkpoint_dir: Optional[str] = None
    snapshot_every: int = 1
    checks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def parse(cls, section: Optional[Mapping[str, Any]]) -> "HealthSpec":
        """Validate ``section`` (the config's ``health`` mapping) and fill in every default.

        Raises:
            ConfigError: one line per problem, each starting with the key's full name.
        """
        data = dict(section or {})
        checks, problems = _resolve(data)
        if problems:
            raise ConfigError([f"{'.'.join(path)}: {message}" for path, message in problems])
        merged = {**TOP_DEFAULTS, **{k: v for k, v in data.items() if k not in CHECK_DEFAULTS}}
        merged["dump_quota_mb"] = float(merged["dump_quota_mb"])
        merged["dump_min_free_mb"] = float(merged["dump_min_free_mb"])
        return cls(checks=checks, **merged)

    def action(self, check: str) -> Optional[str]:
        """The action of ``check``, or None when the check is off."""
        options = self.checks.get(check)
        return options["action"] if options is not None else None

    def checks_with(self, *actions: str) -> List[str]:
        """The enabled checks whose action is one of ``actions``."""
        return [name for name, options in self.checks.items() if options["action"] in actions]

    @property
    def every_step(self) -> bool:
        """True when a check may stop training: it must then see each step as it ends."""
        return bool(self.checks_with(*STOP_ACTIONS))


#: The top-level options and their defaults (the check sections are ``CHECK_DEFAULTS``).
TOP_DEFAULTS: Dict[str, Any] = {f.name: f.default for f in fields(HealthSpec) if f.name != "checks"}


def _type_ok(value: Any, types: Tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


Problem = Tuple[Tuple[str, ...], str]  # (config path such as ("health", "plateau", "patience"), message)


def health_problems(section: Any) -> List[Problem]:
    """Every problem of a ``health`` section as ``(path, message)``, for a loader that reports
    ``file:line`` per path. Empty when ``HealthSpec.parse(section)`` will succeed."""
    if section is None:
        return []
    if not isinstance(section, Mapping):
        return [(("health",), f"expected a mapping, got {section!r}")]
    return _resolve(dict(section))[1]


def _resolve(data: Mapping[str, Any]) -> "tuple[Dict[str, Dict[str, Any]], List[Problem]]":
    top = {k: v for k, v in data.items() if k not in CHECK_DEFAULTS}
    problems = _check_top(top)
    profile = top.get("profile", TOP_DEFAULTS["profile"])
    checks: Dict[str, Dict[str, Any]] = {}
    for name in CHECK_DEFAULTS:
        options, found = _resolve_check(name, data.get(name, {}), profile)
        problems += found
        if options is not None:
            checks[name] = options
    return checks, problems


def _range_problem(name: str, value: Any) -> Optional[str]:
    low, inclusive, high = _RANGES[name]
    if value < low or (value == low and not inclusive):
        return f"must be {'>=' if inclusive else '>'} {low}, got {value!r}"
    if high is not None and value >= high:
        return f"must be < {high}, got {value!r}"
    return None


def _check_top(data: Mapping[str, Any]) -> List[Problem]:
    problems: List[Problem] = []
    for key, value in data.items():
        path = ("health", key)
        if key not in TOP_DEFAULTS:
            problems.append((path, f"unknown key{did_you_mean(key, list(TOP_DEFAULTS) + list(CHECK_DEFAULTS))}"))
        elif not _type_ok(value, _TOP_TYPES[key]):
            problems.append((path, f"expected {' or '.join(t.__name__ for t in _TOP_TYPES[key])}, got {value!r}"))
        elif key == "profile" and value not in PROFILES:
            problems.append((path, f"must be one of {', '.join(PROFILES)}, got {value!r}"))
        elif key in _RANGES:
            problem = _range_problem(key, value)
            if problem:
                problems.append((path, problem))
    return problems


def _resolve_check(name: str, given: Any, profile: str) -> "tuple[Optional[Dict[str, Any]], List[Problem]]":
    """The check's options with defaults filled in (None when it is off), and the problems found."""
    if isinstance(given, bool):  # ``plateau: false`` is short for ``plateau: {check: false}``
        given = {"check": given}
    if not isinstance(given, Mapping):
        return None, [(("health", name), f"expected a mapping of options or true/false, got {given!r}")]
    defaults = CHECK_DEFAULTS[name]
    action = PROFILE_ACTIONS.get(profile, PROFILE_ACTIONS["production"])[name]
    options = {**defaults, "check": True, "action": action, **given}
    problems: List[Problem] = []
    for key, value in given.items():
        path = ("health", name, key)
        if key == "check":
            if not isinstance(value, bool):
                problems.append((path, f"expected true or false, got {value!r}"))
        elif key == "action":
            problems += [(path, p) for p in _action_problem(name, value)]
        elif key not in defaults:
            problems.append((path, f"unknown option{did_you_mean(key, list(defaults) + ['check', 'action'])}"))
        elif not (value is None and defaults[key] is None):
            want = (int,) if key in _INT_OPTIONS else (int, float)
            if not _type_ok(value, want):
                problems.append((path, f"expected {'an int' if key in _INT_OPTIONS else 'a number'}, got {value!r}"))
                continue
            problem = _range_problem(f"{name}.{key}" if f"{name}.{key}" in _RANGES else key, value)
            if problem:
                problems.append((path, problem))
    if options["check"] is False:
        return None, problems
    return options, problems


def _action_problem(check: str, value: Any) -> List[str]:
    if value not in ACTIONS:
        return [f"must be one of {', '.join(ACTIONS)}, got {value!r}{did_you_mean(str(value), ACTIONS)}"]
    if value == SKIP and check != "nonfinite":
        return ["skip is only for nonfinite (msbridge.TrainStep(skip_nonfinite=True) drops a non-finite "
                "update inside the graph); use log, dump, stop or checkpoint_and_stop"]
    return []

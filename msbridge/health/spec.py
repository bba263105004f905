"""The ``health`` section of the config, parsed once into a ``HealthSpec``.

Shape: top-level options (``profile``, ``warmup_steps``, the dump and checkpoint
options, declared on ``HealthSpec``'s fields) plus one section per check in
``DETECTORS``, ``health.<check>: {check: bool, action: str, ...options}``, whose
options, allowed values and default action per profile the detector class
declares. There are no tables here: a new check is validated the moment it is
registered. Every problem is reported at once, with the key's full name and
the nearest valid key. (The config loader maps the mindformers / MindSpore
``monitor_config`` keys here, e.g. ``nan_check`` -> ``nonfinite.check``.)

Example:
    >>> spec = HealthSpec.parse({"profile": "debug", "warmup_steps": 20,
    ...                          "plateau": {"action": "stop", "patience": 50}})
    >>> spec.action("nonfinite"), spec.action("plateau"), spec.every_step
    ('stop', 'stop', True)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import ConfigError
from ..options import Option, declare, declared_options, did_you_mean, expected
from .detectors import BROKEN, DETECTORS
from .detectors.base import ACTIONS, PROFILES, SKIP, STOP_ACTIONS

#: Keys every check section has besides the detector's own options.
CHECK, ACTION = "check", "action"


@dataclass(frozen=True)
class HealthSpec:
    """The validated ``health`` section. Build it with ``HealthSpec.parse``.

    ``checks`` maps each enabled check to its options, ``check`` and ``action`` included.

    Example:
        >>> HealthSpec.parse({}).action("nonfinite")
        'dump'
        >>> HealthSpec.parse({"nonfinite": {"check": False}}).action("nonfinite") is None
        True
    """

    profile: str = declare(str, "production", "sets each check's default action", choices=PROFILES)
    warmup_steps: int = declare(int, 100, "no check fires at or before this step; baselines still fill", low=0)
    dump_on_anomaly: bool = declare(bool, True, "write a dump directory for every action other than log")
    dump_dir: Optional[str] = declare(str, None, "where dumps go (default {run_dir}/dumps)")
    dump_quota_mb: float = declare(float, 512.0, "most the whole dump dir may hold", low=0)
    dump_min_free_mb: float = declare(float, 1024.0, "free disk that must remain after a dump or checkpoint",
                                      low=0)
    dump_every_steps: int = declare(int, 100, "at most one dump per check per this many steps", low=1)
    dump_window: int = declare(int, 100, "recent records saved in each dump's window.jsonl", low=1)
    dump_batch: bool = declare(bool, False, "also save the step's input batch as batch.npz")
    checkpoint_dir: Optional[str] = declare(str, None, "where checkpoint_and_stop saves (default "
                                                       "{run_dir}/checkpoints)")
    snapshot_every: int = declare(int, 1, "steps between host snapshots of healthy weights", low=1)
    checks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def parse(cls, section: Optional[Mapping[str, Any]]) -> "HealthSpec":
        """Validate ``section`` (the config's ``health`` mapping) and fill in every default.

        Raises:
            ConfigError: one line per problem, each starting with the key's full name.
        """
        spec, problems = resolve_health(section)
        if spec is None:
            raise ConfigError([f"{'.'.join(path)}: {message}" for path, message in problems])
        return spec

    def action(self, check: str) -> Optional[str]:
        """The action of ``check``, or None when the check is off."""
        options = self.checks.get(check)
        return options[ACTION] if options is not None else None

    def options(self, check: str) -> Dict[str, Any]:
        """The detector options of an enabled ``check`` (without ``check`` and ``action``)."""
        return {k: v for k, v in self.checks[check].items() if k not in (CHECK, ACTION)}

    def checks_with(self, *actions: str) -> List[str]:
        """The enabled checks whose action is one of ``actions``."""
        return [name for name, options in self.checks.items() if options[ACTION] in actions]

    @property
    def every_step(self) -> bool:
        """True when a check may stop training: it must then see each step as it ends."""
        return any(not DETECTORS[name].on_eval for name in self.checks_with(*STOP_ACTIONS))


#: The top-level options, as declared on ``HealthSpec``'s fields.
SETTINGS: Dict[str, Option] = declared_options(HealthSpec)

Problem = Tuple[Tuple[str, ...], str]  # (config path such as ("health", "plateau", "patience"), message)


def health_problems(section: Any) -> List[Problem]:
    """Every problem of a ``health`` section as ``(path, message)``, for a loader that reports
    ``file:line`` per path. Empty when ``HealthSpec.parse(section)`` will succeed."""
    return resolve_health(section)[1]


def resolve_health(section: Any) -> Tuple[Optional[HealthSpec], List[Problem]]:
    """The parsed section and no problems, or None and every problem as ``(path, message)``."""
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        return None, [(("health",), expected("a mapping", section))]
    # a plug-in check that did not load, or that claims a built-in check's name: an error, as for a sink
    problems: List[Problem] = [(("health", key), BROKEN[key]) for key in section if key in BROKEN]
    top = {k: v for k, v in section.items() if k not in DETECTORS and k not in BROKEN}
    problems += _top_problems(top)
    profile = top.get("profile", SETTINGS["profile"].default)
    checks: Dict[str, Dict[str, Any]] = {}
    for name in DETECTORS:
        if name in BROKEN and name in section:
            continue  # said above
        options, found = _resolve_check(name, section.get(name), profile)
        problems += found
        if options is not None:
            checks[name] = options
    if problems:
        return None, problems
    merged = {**{k: o.default for k, o in SETTINGS.items()}, **top}
    merged["dump_quota_mb"] = float(merged["dump_quota_mb"])
    merged["dump_min_free_mb"] = float(merged["dump_min_free_mb"])
    return HealthSpec(checks=checks, **merged), []


def _top_problems(top: Mapping[str, Any]) -> List[Problem]:
    problems: List[Problem] = []
    for key, value in top.items():
        option = SETTINGS.get(key)
        problem = (f"unknown key{did_you_mean(key, list(SETTINGS) + list(DETECTORS))}" if option is None
                   else option.check(value))
        if problem:
            problems.append((("health", key), problem))
    return problems


def _resolve_check(name: str, given: Any, profile: str) -> Tuple[Optional[Dict[str, Any]], List[Problem]]:
    """The check's options with defaults filled in (None when it is off), and the problems found. ``given`` is
    None when the section does not name the check: an ``opt_in`` check is then off."""
    detector = DETECTORS[name]
    on = given is not None or not detector.opt_in
    given = {} if given is None else given
    if isinstance(given, bool):  # ``plateau: false`` is short for ``plateau: {check: false}``
        given = {CHECK: given}
    if not isinstance(given, Mapping):
        return None, [(("health", name), expected("a mapping of options or true/false", given))]
    declared = detector.options
    action = detector.default_action[profile if profile in PROFILES else SETTINGS["profile"].default]
    problems: List[Problem] = []
    for key, value in given.items():
        if key == CHECK:
            problem = None if isinstance(value, bool) else expected("true or false", value)
        elif key == ACTION:
            problem = _action_problem(name, value)
        elif key not in declared:
            problem = f"unknown option{did_you_mean(key, list(declared) + [CHECK, ACTION])}"
        else:
            problem = declared[key].check(value)
        if problem:
            problems.append((("health", name, key), problem))
    options = {**{k: o.default for k, o in declared.items()}, CHECK: on, ACTION: action, **given}
    return (options if options[CHECK] is not False else None), problems


def _action_problem(check: str, value: Any) -> Optional[str]:
    if value not in ACTIONS:
        return expected(f"one of {', '.join(ACTIONS)}", value) + did_you_mean(str(value), ACTIONS)
    if value == SKIP and not DETECTORS[check].in_graph_skip:
        skippable = ", ".join(n for n, d in DETECTORS.items() if d.in_graph_skip)
        return (f"skip is only for {skippable} (msbridge.TrainStep(skip_nonfinite=True) drops a non-finite "
                "update inside the graph); use log, dump, stop or checkpoint_and_stop")
    return None

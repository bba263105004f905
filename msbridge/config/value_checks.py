"""The checks of settings whose type alone does not say what is valid: regexes, rank lists, and the
settings that hold keys of their own (``sinks``, ``straggler``, ``system``, ``alerts``, ``health``).

Each is named by one declaration in ``settings.Config``: a ``valid`` check of its ``Option`` (returning
the problem, or ``""`` to have the value worded as the Option's ``what``), or a ``problems`` check that
reports each bad key at its own path. Nothing here lists the settings.

Example:
    >>> straggler_problems({"margin": 0, "windos": 3})[0]
    (('straggler', 'margin'), 'expected a number > 0 and <= 100, got 0')
    >>> straggler_problems({"windos": 3})
    [(('straggler', 'windos'), "unknown key; did you mean 'windows'?")]
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import ConfigError
from ..limits import compile_user_regex
from ..names import DEFAULT_OBJECTIVES
from ..options import Option, check_options, did_you_mean
from .yaml_lines import Path

Problems = List[Tuple[Path, str]]

# Upper bounds: far above any real run, low enough that a typo (1e36, an extra zero or ten) is caught.
MAX_STEPS = 10_000_000  # step_interval, flush_steps, print_interval, histogram_interval, straggler.windows
MAX_ROWS = 100_000_000  # buffer_size, seq_length
MAX_SECONDS = 10_000_000.0  # flush_seconds, collective_timeout_s, system.interval_s (~116 days)
MAX_RANKS = 10_000_000

#: What a valid rank list is (``reduce_ranks``, ``per_rank_curves``).
RANKS = f"a non-empty list of ranks (integers from 0 to {MAX_RANKS - 1:_})"
#: ``system: true`` samples npu-smi this often (seconds).
SYSTEM_INTERVAL_S = 10.0

SYSTEM_OPTIONS: Dict[str, Option] = {
    "interval_s": Option(float, SYSTEM_INTERVAL_S, "seconds between two npu-smi samples", low=0, low_open=True,
                         high=MAX_SECONDS, high_open=False),
}
STRAGGLER_OPTIONS: Dict[str, Option] = {
    "margin": Option(float, 0.15, "how far (a fraction) above the other ranks' median step time", low=0,
                     low_open=True, high=100, high_open=False),
    "windows": Option(int, 3, "in this many consecutive flush windows", low=1, high=MAX_STEPS, high_open=False),
}
#: ``straggler:`` keys and their defaults.
STRAGGLER_DEFAULTS: Dict[str, Any] = {key: option.default for key, option in STRAGGLER_OPTIONS.items()}


#: What ``objective.metric: null`` means, from ``names.DEFAULT_OBJECTIVES`` (the rule the run follows).
DEFAULT_OBJECTIVE_TEXT = ("the first of " + ", ".join(f"`{m}`" for m in DEFAULT_OBJECTIVES)
                          + " the run records (validation before training, the job's value before one rank's)")
#: What the run is compared on when its evaluations record no loss (``metrics.objective`` says it once at run time).
NO_EVAL_LOSS_TEXT = ("an evaluation that records no loss (no metric named `loss`, as `Model.eval` with only "
                     "`Accuracy`; `Model.fit` always has its `eval_loss`) leaves the run compared on its training "
                     "loss, that is on its best single step: the first such evaluation says so once, with the "
                     "setting that compares it on the evaluation (`objective: {metric: eval/accuracy, mode: max}`)")
OBJECTIVE_OPTIONS: Dict[str, Option] = {
    "metric": Option(str, None, "the recorded metric a sweep is compared on (`eval/accuracy`); null: "
                                + DEFAULT_OBJECTIVE_TEXT),
    "mode": Option(str, "min", "which value is best", choices=("min", "max")),
}
#: ``objective:`` keys and their defaults.
OBJECTIVE_DEFAULTS: Dict[str, Any] = {key: option.default for key, option in OBJECTIVE_OPTIONS.items()}


def objective_problems(value: Mapping[str, Any]) -> Problems:
    """``objective: {metric, mode}``: its keys."""
    return keyed_problems("objective", OBJECTIVE_OPTIONS, value)


def regex_problem(value: str) -> Optional[str]:
    """Why ``value`` is not a regex msbridge compiles (``msbridge.limits.compile_user_regex``), or None."""
    try:
        compile_user_regex(value)
    except ValueError as exc:
        return str(exc)
    return None


def group_regex_problem(value: str) -> Optional[str]:
    """``regex_problem``, and the regex must have exactly one capturing group (the layer's name)."""
    problem = regex_problem(value)
    if problem:
        return problem
    groups = compile_user_regex(value).groups
    if groups != 1:
        return f"{value!r} must have exactly one capturing group, the layer's name (it has {groups})"
    return None


def ranks_problem(value: Any) -> Optional[str]:
    """``""`` unless ``value`` is a non-empty list of ranks."""
    ok = value and all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_RANKS for r in value)
    return None if ok else ""


def curves_problem(value: Any) -> Optional[str]:
    """``""`` unless ``value`` is ``auto``, ``none`` or a list of ranks."""
    if isinstance(value, str):
        return None if value in ("auto", "none") else ""
    return ranks_problem(value)


def tags_problem(value: Mapping[str, Any]) -> Optional[str]:
    """Tag values must be strings or numbers (they become strings)."""
    bad = [k for k, v in value.items() if isinstance(v, (Mapping, list, tuple)) or v is None]
    return f"tag values must be strings or numbers; {', '.join(map(str, bad))} are not" if bad else None


def keyed_problems(name: str, declared: Mapping[str, Option], value: Mapping[str, Any]) -> Problems:
    """A mapping's keys against their ``Option``s, each problem at ``(name, key)``."""
    problems: Problems = []
    for key, given in value.items():
        option = declared.get(key)
        message = option.check(given) if option else f"unknown key{did_you_mean(str(key), list(declared))}"
        if message:
            problems.append(((name, key), message))
    return problems


def system_problems(value: Any) -> Problems:
    """``system: {interval_s: ...}``: its keys (true, false and null hold none)."""
    return keyed_problems("system", SYSTEM_OPTIONS, value) if isinstance(value, Mapping) else []


def straggler_problems(value: Mapping[str, Any]) -> Problems:
    """``straggler: {margin, windows}``: its keys."""
    return keyed_problems("straggler", STRAGGLER_OPTIONS, value)


def straggler_settings(value: Mapping[str, Any]) -> Dict[str, Any]:
    """The ``straggler`` mapping with every default filled in.

    Example:
        >>> straggler_settings({"windows": 5})
        {'margin': 0.15, 'windows': 5}
    """
    return {**STRAGGLER_DEFAULTS, **value}


def normalise_sinks(sinks: Any) -> Dict[str, Any]:
    """A list / single name / mapping of sinks as ``{name: options}``, jsonl always included.

    Example:
        >>> normalise_sinks(["tensorboard"])
        {'tensorboard': {}, 'jsonl': {}}
    """
    if sinks is None:
        sinks = {}
    if isinstance(sinks, str):
        sinks = [sinks]
    if isinstance(sinks, Mapping):
        out = {str(k): (dict(v) if isinstance(v, Mapping) else ({} if v is None else v)) for k, v in sinks.items()}
    else:
        out = {str(name): {} for name in sinks}
    # jsonl is the write-ahead log every other sink can be rebuilt from: always on.
    out.setdefault("jsonl", {})
    return out


def sink_problems(value: Any) -> Problems:
    """Names against the registry, each sink's options against the sink's own declaration; a sink whose
    ``on_fault`` is "warn" has only that checked here (its faults are warnings: ``load._check_stores``)."""
    from ..sinks.registry import ON_FAULT, available, check_available, sink_class, unloadable

    problems: Problems = []
    registered, broken = available(), unloadable()  # read once: each read scans every distribution's entry points
    for name, options in normalise_sinks(value).items():
        if name in broken:  # a plug-in that did not load, or claims another's name: why, as for checks
            problems.append((("sinks", name), broken[name]))
            continue
        if name not in registered:
            problems.append((("sinks", name), f"unknown sink {name!r}{did_you_mean(name, registered)} "
                                              f"(registered sinks: {', '.join(registered)})"))
            continue
        if not isinstance(options, Mapping):
            problems.append((("sinks", name), f"sink options must be a mapping, got {options!r}"))
            continue
        policy = _fault_policy_problem(name, options)
        if policy:
            problems.append((("sinks", name, ON_FAULT), policy))
            continue
        if options.get(ON_FAULT) == "warn":
            continue
        try:
            check_available(name)
        except (ConfigError, ImportError) as exc:
            problems.append((("sinks", name), str(exc)))
            if isinstance(exc, ConfigError):
                continue
        own = {key: value for key, value in options.items() if key != ON_FAULT}
        problems.extend((("sinks", name, key), message) for key, message in check_options(sink_class(name).options, own))
    return problems


def _fault_policy_problem(name: str, options: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with a sink's ``on_fault``, or None; jsonl, the write-ahead log, is always on."""
    from ..sinks.registry import ON_FAULT, ON_FAULT_OPTION

    if ON_FAULT not in options:
        return None
    if name == "jsonl":
        return "jsonl is the write-ahead log, always on: it takes no on_fault"
    return ON_FAULT_OPTION.check(options[ON_FAULT])

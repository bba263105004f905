"""What each msbridge setting may hold: type, range, and one line of meaning.

``FIELDS`` is the single list of canonical settings (docs/configuration.md's reference table
is written from it); ``check_values`` returns every problem with the values at
once, as ``(path, message)`` pairs without file locations, so the loader can
point each one at the line the user wrote.

Example:
    >>> check_values({"flush_steps": 0, "sinks": ["tensorbord"]})
    [(('flush_steps',), 'expected an integer >= 1, got 0'), (('sinks', 'tensorbord'), "unknown sink 'tensorbord'; did you mean 'tensorboard'? (registered sinks: jsonl, tensorboard, mlflow, mindinsight)")]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..errors import ConfigError, did_you_mean
from ..limits import compile_user_regex, huge_int_problem, int_digits, is_huge_int
from .yaml_lines import Path

Check = Callable[[Any], Optional[str]]

# Upper bounds: far above any real run, low enough that a typo (1e36, an extra zero or ten) is caught.
MAX_STEPS = 10_000_000  # step_interval, flush_steps, print_interval
MAX_ROWS = 100_000_000  # buffer_size, seq_length
MAX_SECONDS = 10_000_000.0  # flush_seconds, collective_timeout_s (~116 days)
MAX_RANKS = 10_000_000


def _bool(value: Any) -> Optional[str]:
    return None if isinstance(value, bool) else f"expected true or false, got {value!r}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(minimum: int, maximum: int, optional: bool = False) -> Check:
    def check(value: Any) -> Optional[str]:
        if (optional and value is None) or (_is_int(value) and minimum <= value <= maximum):
            return None
        if _is_int(value) and value > maximum:
            return f"expected an integer from {minimum} to {maximum:_}, got {value!r}"
        return f"expected {'null or ' if optional else ''}an integer >= {minimum}, got {value!r}"
    return check


def _number(low: float, high: float, below_high: bool = False) -> Check:
    """A finite number > ``low`` and <= ``high`` (< ``high`` with ``below_high``)."""
    def check(value: Any) -> Optional[str]:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and math.isfinite(value) and low < value and (value < high if below_high else value <= high):
            return None
        if below_high:
            return f"expected a number between {low} and {high} (exclusive), got {value!r}"
        if number and value > low:  # too large, or inf
            return f"expected a finite number > {low} and <= {int(high):_}, got {value!r}"
        return f"expected a number > {low}, got {value!r}"
    return check


def _text(optional: bool = False) -> Check:
    def check(value: Any) -> Optional[str]:
        if (optional and value is None) or (isinstance(value, str) and value):
            return None
        hint = f" (quote it: '{value}')" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        return f"expected {'null or ' if optional else ''}a non-empty string, got {value!r}{hint}"
    return check


def _regex(value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        return f"expected null or a regular expression over parameter names, got {value!r}"
    try:
        compile_user_regex(value)
    except ValueError as exc:
        return str(exc)
    return None


def _group_regex(value: Any) -> Optional[str]:
    problem = _regex(value)
    if problem or value is None:
        return problem
    groups = compile_user_regex(value).groups
    return None if groups == 1 else f"{value!r} must have exactly one capturing group, the layer's name (it has {groups})"


#: ``system: true`` samples npu-smi this often (seconds).
SYSTEM_INTERVAL_S = 10.0


def _system(value: Any) -> Optional[str]:
    if value is None or isinstance(value, bool):
        return None
    if not isinstance(value, Mapping):
        return f"expected true, false, null or a mapping like {{interval_s: {SYSTEM_INTERVAL_S:g}}}, got {value!r}"
    unknown = [k for k in value if k != "interval_s"]
    if unknown:
        return f"unknown key {unknown[0]!r}{did_you_mean(str(unknown[0]), ['interval_s'])} (allowed: interval_s)"
    problem = _number(0, MAX_SECONDS)(value.get("interval_s", SYSTEM_INTERVAL_S))
    return f"interval_s: {problem}" if problem else None


def _mapping(value: Any) -> Optional[str]:
    return None if isinstance(value, Mapping) else f"expected a mapping, got {value!r}"


def _ranks(value: Any) -> Optional[str]:
    if value is None or (isinstance(value, (list, tuple)) and value
                         and all(_is_int(r) and 0 <= r < MAX_RANKS for r in value)):
        return None
    return f"expected null or a non-empty list of ranks (integers from 0 to {MAX_RANKS - 1:_}), got {value!r}"


def _curves(value: Any) -> Optional[str]:
    if value in ("auto", "none") or (isinstance(value, (list, tuple)) and _ranks(value) is None):
        return None
    return f"expected 'auto', 'none' or a non-empty list of ranks (integers from 0 to {MAX_RANKS - 1:_}), got {value!r}"


def _tags(value: Any) -> Optional[str]:
    if not isinstance(value, Mapping):
        return f"expected a mapping of tag -> value, got {value!r}"
    bad = [k for k, v in value.items() if isinstance(v, (Mapping, list, tuple)) or v is None]
    return f"tag values must be strings or numbers; {', '.join(map(str, bad))} are not" if bad else None


@dataclass(frozen=True)
class Field:
    """One setting: its type as README shows it, its check, and what it means."""

    type: str
    check: Check
    meaning: str


FIELDS: Dict[str, Field] = {
    "monitor_on": Field("bool", _bool, "master switch; false builds nothing and records nothing"),
    "experiment": Field("str", _text(), "experiment name (MLflow experiment, {experiment} in experiment_dir and output_dir)"),
    "run_name": Field("str", _text(), "run name template: {dotted.key} from params or settings, {timestamp}, {rank}"),
    "output_dir": Field("str", _text(), "run directory template: {experiment_dir} (first), {experiment}, {run_name}, "
                        "{rank}, {timestamp}"),
    "experiment_dir": Field("str or null", _text(optional=True),
                            "where the stores an experiment's runs share live (mlflow.db, mlartifacts/, tensorboard/, "
                            "summary/); may use {experiment}; null: ./msbridge_runs/{experiment} when output_dir "
                            "starts with {experiment_dir}, else output_dir's part before its first per-run component"),
    "resume": Field("bool", _bool, "continue a run dir that holds steps even when training starts at or before its "
                    "last recorded step (steps up to it are not written again)"),
    "step_interval": Field("int in [1, 1e7]", _int(1, MAX_STEPS), "record every N-th step (sampling granularity)"),
    "flush_steps": Field("int in [1, 1e7]", _int(1, MAX_STEPS), "steps buffered between device->host copies and writes"),
    "flush_seconds": Field("float in (0, 1e7]", _number(0, MAX_SECONDS), "also flush when this many seconds passed"),
    "print_interval": Field("int in [1, 1e7]", _int(1, MAX_STEPS), "console progress line every N steps (global rank)"),
    "local_loss": Field("bool", _bool, "record each rank's own loss (train/loss)"),
    "global_loss": Field("bool", _bool, "record the loss averaged over ranks and its spread (rank 0)"),
    "grad_norm": Field("bool", _bool, "record the global gradient norm"),
    "learning_rate": Field("bool", _bool, "record the optimizer's learning rate"),
    "throughput": Field("bool", _bool, "record step time, samples/s and tokens/s"),
    "memory": Field("bool", _bool, "record device/host memory"),
    "layer_norms": Field("regex or null", _regex, "per-parameter norms for names matching (re.search); off if null"),
    "layer_norms_group": Field("regex with one group, or null", _group_regex,
                               "report layer_norms per layer: the group names the layer (norm of its parameters)"),
    "histograms": Field("regex or null", _regex,
                        "weight (and, with TrainStep, gradient) histograms for parameter names matching "
                        "(re.search); off if null"),
    "histogram_interval": Field("int in [1, 1e7] or null", _int(1, MAX_STEPS, optional=True),
                                "steps at least between two histograms (taken at a flush); null: every flush"),
    "system": Field("bool, null or {interval_s: float > 0}", _system,
                    f"NPU utilisation, HBM, temperature, power from npu-smi (every {SYSTEM_INTERVAL_S:g} s for true)"),
    "seq_length": Field("int in [1, 1e8] or null", _int(1, MAX_ROWS, optional=True), "tokens per sample, for tokens/s"),
    "sinks": Field("list or mapping", lambda v: None, "sink names, or name -> options; jsonl is always on"),
    "health": Field("mapping", _mapping, "health checks and actions (nonfinite, dump_dir, warmup_steps ...)"),
    "overhead_budget": Field("float in (0, 1)", _number(0, 1, below_high=True), "allowed share of step time spent monitoring"),
    "buffer_size": Field("int in [0, 1e8]", _int(0, MAX_ROWS), "rows a TrainStep/attach_ring device ring must have at least; "
                         "0 = auto (2 x flush_steps); also caps how far overhead_budget widens the flush window"),
    "reduce_ranks": Field("list of int in [0, 1e7) or null", _ranks,
                          "ranks whose loss makes train/global_loss and dist/* (pipeline parallel: last stage); null: all"),
    "collective_timeout_s": Field("float in (0, 1e7]", _number(0, MAX_SECONDS),
                                  "seconds the per-flush cross-rank collective may block before the run is closed FAILED"),
    "straggler": Field("mapping", lambda v: None,  # checked key by key (_NESTED)
                       "a rank whose own step time (its step without its wait for others) is above the other "
                       "ranks' median by margin (a fraction) in windows consecutive flush windows is named a "
                       "straggler; default {margin: 0.15, windows: 3}"),
    "alerts": Field("mapping", lambda v: None,  # checked key by key (_NESTED); docs/alerts.md
                    "chat/webhook alerts: {targets: [{type, url, secret}], on: [...], stall_seconds}"),
    "per_rank_curves": Field("'auto', 'none' or list of int", _curves,
                             "ranks whose own loss and step time rank 0 also logs (dist/loss/rank_{r}); auto: "
                             "every rank up to 16 ranks, none above (each rank's own files always have its curves)"),
    "sweep_id": Field("str or null", _text(optional=True), "groups the runs of one sweep"),
    "tags": Field("mapping", _tags, "tags for trackers (values become strings)"),
    "params": Field("mapping", _mapping, "the training job's hyperparameters, logged, not interpreted"),
}


#: ``straggler:`` keys, their defaults and checks.
STRAGGLER_DEFAULTS: Dict[str, Any] = {"margin": 0.15, "windows": 3}
_STRAGGLER_CHECKS: Dict[str, Check] = {"margin": _number(0, 100.0), "windows": _int(1, MAX_STEPS)}


def straggler_settings(value: Mapping[str, Any]) -> Dict[str, Any]:
    """The ``straggler`` mapping with every default filled in.

    Example:
        >>> straggler_settings({"windows": 5})
        {'margin': 0.15, 'windows': 5}
    """
    return {**STRAGGLER_DEFAULTS, **value}


def _check_straggler(value: Any) -> List[Tuple[Path, str]]:
    if not isinstance(value, Mapping):
        return [(("straggler",), f"expected a mapping such as {{margin: 0.15, windows: 3}}, got {value!r}")]
    problems: List[Tuple[Path, str]] = []
    for key, given in value.items():
        check = _STRAGGLER_CHECKS.get(key)
        message = check(given) if check else f"unknown key{did_you_mean(str(key), list(_STRAGGLER_CHECKS))}"
        if message:
            problems.append((("straggler", key), message))
    return problems


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


def _check_alerts(value: Any) -> List[Tuple[Path, str]]:
    from ..alerts.spec import check_alerts

    return check_alerts(value)


def _check_sinks(value: Any) -> List[Tuple[Path, str]]:
    """Names against the registry, each sink's options against the sink's own declaration."""
    from ..options import check_options
    from ..sinks.registry import available, check_available, sink_class

    if not isinstance(value, (Mapping, list, tuple, str)) and value is not None:
        return [(("sinks",), f"expected a list of sink names or a mapping name -> options, got {value!r}")]
    problems: List[Tuple[Path, str]] = []
    for name, options in normalise_sinks(value).items():
        try:
            check_available(name)
        except ConfigError:
            problems.append((("sinks", name), f"unknown sink {name!r}{did_you_mean(name, available())} "
                                              f"(registered sinks: {', '.join(available())})"))
            continue
        except ImportError as exc:
            problems.append((("sinks", name), str(exc)))
        if not isinstance(options, Mapping):
            problems.append((("sinks", name), f"sink options must be a mapping, got {options!r}"))
            continue
        problems.extend((("sinks", name, key), message)
                        for key, message in check_options(sink_class(name).options, options))
    return problems


# report each problem at its own key
_NESTED = {"sinks": _check_sinks, "straggler": _check_straggler, "alerts": _check_alerts}


def check_values(values: Mapping[str, Any]) -> List[Tuple[Path, str]]:
    """Every problem with the given settings (absent ones are not checked)."""
    problems: List[Tuple[Path, str]] = []
    for name, spec in FIELDS.items():
        if name not in values:
            continue
        if is_huge_int(values[name]):  # its repr would fail (Python prints at most 4,300 digits)
            problems.append(((name,), huge_int_problem(int_digits(values[name]))))
            continue
        if name in _NESTED:
            problems.extend(_NESTED[name](values[name]))
            continue
        message = spec.check(values[name])
        if message:
            problems.append(((name,), message))
    if values.get("layer_norms_group") and not values.get("layer_norms"):
        problems.append((("layer_norms_group",), "has no effect without layer_norms (the regex of parameters)"))
    if values.get("histogram_interval") and not values.get("histograms"):
        problems.append((("histogram_interval",), "has no effect without histograms (the regex of parameters)"))
    return problems

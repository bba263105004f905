"""``SWEEP.yaml``: the search space and how a sweep runs, checked whole before any trial starts.

Every problem is one line naming the file, the line and the key (with the nearest valid key for a misspelt one),
worded as every msbridge config problem is (``msbridge.options``), and all of them are reported at once. Optuna
is not imported here: a sweep file can be checked where Optuna is not installed (the samplers' and pruners'
arguments are checked against their signatures by ``msbridge.sweep.study`` once it is).

Example:
    >>> _ = open("sweep.yaml", "w").write("study: s1\\ncommand: python train.py\\nparams:\\n"
    ...                                   "  optimizer.learning_rate: {low: 1.0e-4, high: 1.0, log: true}\\n")
    >>> spec = load_spec("sweep.yaml")
    >>> spec.study, spec.trials, spec.params["optimizer.learning_rate"].log
    ('s1', 10, True)
"""
from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..config.yaml_lines import Origin, Tree, format_path, read_yaml
from ..errors import ConfigError
from ..options import Option, check_options, did_you_mean, expected, suggestion_budget

#: Where a sweep's trials write when ``experiment_dir`` is not given: msbridge's own default experiment dir.
DEFAULT_EXPERIMENT_DIR = "./msbridge_runs/{study}"
RANGE_KEYS = ("low", "high", "log", "step")
Choice = Union[None, bool, int, float, str]
#: The Optuna arguments each sampler and pruner takes from YAML (plain values; callables cannot be written there).
SAMPLER_ARGS = {
    "tpe": ("seed", "n_startup_trials", "n_ei_candidates", "consider_prior", "prior_weight", "consider_magic_clip",
            "consider_endpoints", "multivariate", "group", "warn_independent_sampling", "constant_liar"),
    "random": ("seed",),
    "grid": ("seed",),
    "cmaes": ("seed", "x0", "sigma0", "n_startup_trials", "warn_independent_sampling", "consider_pruned_trials",
              "restart_strategy", "popsize", "inc_popsize", "use_separable_cma", "with_margin", "lr_adapt"),
}
PRUNER_ARGS = {
    "median": ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"),
    "hyperband": ("min_resource", "max_resource", "reduction_factor", "bootstrap_count"),
    "successive_halving": ("min_resource", "reduction_factor", "min_early_stopping_rate", "bootstrap_count"),
    "none": (),
}

#: The top-level keys, as ``msbridge.options`` declares options (type, default, meaning, allowed values).
KEYS: Dict[str, Option] = {
    "study": Option(str, "", "the Optuna study's name; also the MLflow experiment and every trial's sweep_id"),
    "command": Option((str, list), None, "the training command (a string split as a shell does, or a list); the "
                                         "words after `--` on the command line take its place",
                      what="a command string or a list of words"),
    "params": Option(dict, {}, "the search space: `name: {low, high, log, step}` or `name: [choice, ...]`",
                     what="a mapping of parameter name -> range or list of choices"),
    "trials": Option(int, 10, "trials the study holds when the sweep is done (a rerun resumes up to it)", 1),
    "timeout": Option(float, None, "seconds after which no new trial starts (running ones finish)", 0,
                      low_open=True),
    "jobs": Option(int, 1, "trials at once on this host, each its own process", 1, high=257),
    "sampler": Option((str, dict), "tpe", f"one of {', '.join(SAMPLER_ARGS)}, or `{{type: tpe, seed: 1, ...}}` with "
                                          "the Optuna sampler's arguments", what="a sampler name or mapping"),
    "pruner": Option((str, dict), "median", f"one of {', '.join(PRUNER_ARGS)}, or `{{type: median, n_warmup_steps: "
                                            "...}}` with the Optuna pruner's arguments",
                     what="a pruner name or mapping"),
    "objective": Option(dict, {}, "`{metric: eval/loss, mode: min}`: what each trial is ranked on",
                        what="a mapping such as {metric: eval/loss, mode: min}"),
    "storage": Option(str, None, "the Optuna storage URL (default sqlite:///<experiment_dir>/optuna.db; "
                                 "postgresql://... for many hosts)"),
    "experiment_dir": Option(str, DEFAULT_EXPERIMENT_DIR, "where the trials' runs, the MLflow store and optuna.db "
                                                          "go; `{study}` is the study's name"),
    "devices": Option(list, None, "the devices trials run on, one each at a time (ASCEND_RT_VISIBLE_DEVICES, "
                                  "CUDA_VISIBLE_DEVICES, DEVICE_ID 0 in the trial's process); at least `jobs` of them",
                      what="a list of device ids such as [0, 1, 2, 3]"),
}
OBJECTIVE_KEYS = {"metric": Option(str, "eval/loss", "the recorded metric each trial is ranked and pruned on"),
                  "mode": Option(str, "min", "min or max: which value is better", choices=("min", "max"))}


@dataclass(frozen=True)
class Param:
    """One searched parameter: a range (``low``..``high``, ``log``, ``step``) or a list of ``choices``.

    Example:
        >>> Param("lr", low=1e-4, high=1.0, log=True).kind
        'float'
    """

    name: str
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: Tuple[Choice, ...] = ()

    @property
    def kind(self) -> str:
        """``categorical``, ``int`` (both bounds and the step integers) or ``float``."""
        if self.choices:
            return "categorical"
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high))
        return "int" if ints and (self.step is None or isinstance(self.step, int)) else "float"

    def grid(self) -> Optional[List[Choice]]:
        """Every value a grid search tries, or None when the range has no step to enumerate."""
        if self.choices:
            return list(self.choices)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            return None
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return [round(self.low + i * self.step, 12) for i in range(count)]


@dataclass(frozen=True)
class SweepSpec:
    """A checked ``SWEEP.yaml``. Build it with ``load_spec``.

    Example:
        >>> spec = SweepSpec("sweep.yaml", "s1", ("python", "train.py"), {}, experiment_dir="/runs/{study}")
        >>> spec.directory, spec.storage_url
        ('/runs/s1', 'sqlite:////runs/s1/optuna.db')
    """

    path: str
    study: str
    command: Tuple[str, ...]
    params: Mapping[str, Param]
    trials: int = 10
    timeout: Optional[float] = None
    jobs: int = 1
    sampler: Mapping[str, Any] = field(default_factory=lambda: {"type": "tpe"})
    pruner: Mapping[str, Any] = field(default_factory=lambda: {"type": "median"})
    metric: str = "eval/loss"
    mode: str = "min"
    storage: Optional[str] = None
    experiment_dir: str = DEFAULT_EXPERIMENT_DIR
    devices: Tuple[str, ...] = ()

    @property
    def directory(self) -> str:
        """The experiment dir, absolute, with ``{study}`` filled in."""
        return os.path.abspath(self.experiment_dir.replace("{study}", self.study))

    @property
    def storage_url(self) -> str:
        """``storage``, else ``sqlite:///<experiment dir>/optuna.db``."""
        return self.storage or f"sqlite:///{os.path.join(self.directory, 'optuna.db')}"


class _Checker:
    """Collects problems as ``file:line: key: message``, each at the line its key was written."""

    def __init__(self, tree: Tree, shown: str) -> None:
        self.tree, self.shown, self.problems = tree, shown, []  # type: Tree, str, List[str]

    def problem(self, path: Tuple[Any, ...], message: str) -> None:
        origin = self.tree.origin_of(path) or Origin(self.shown)
        self.problems.append(f"{origin}: {format_path(path) or 'top level'}: {message}")


def _parse_param(check: _Checker, name: str, value: Any) -> Optional[Param]:
    """One entry of ``params``: a list of choices, or a mapping of ``low``, ``high``, ``log``, ``step``."""
    path = ("params", name)
    if isinstance(value, list):
        bad = [v for v in value if not isinstance(v, (type(None), bool, int, float, str))]
        if not value or bad:
            check.problem(path, "expected a non-empty list of plain choices (numbers, strings, true/false, "
                                f"null), got {value!r}")
            return None
        return Param(name, choices=tuple(value))
    if not isinstance(value, dict):
        check.problem(path, expected("a range {low, high, log, step} or a list of choices", value))
        return None
    found = len(check.problems)
    for key in value:
        if key not in RANGE_KEYS:
            hint = did_you_mean(str(key), RANGE_KEYS) or " (valid: low, high, log, step)"
            check.problem(path + (key,), f"unknown key{hint}")
    for key in ("low", "high"):
        number = value.get(key)
        if key not in value:
            check.problem(path, f"a range needs {key}")
        elif isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            check.problem(path + (key,), expected("a finite number", number))
    if "log" in value and not isinstance(value["log"], bool):
        check.problem(path + ("log",), expected("true or false", value["log"]))
    step = value.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, float)) or not step > 0):
        check.problem(path + ("step",), expected("a number > 0", step))
    if len(check.problems) > found:
        return None
    return _range_param(check, name, value)


def _range_param(check: _Checker, name: str, value: Mapping[str, Any]) -> Optional[Param]:
    """A range's relations, as Optuna would refuse them, found here at their line."""
    path = ("params", name)
    low, high, log, step = value["low"], value["high"], value.get("log", False), value.get("step")
    if low > high:
        check.problem(path + ("high",), f"must be >= low, which is {low!r}; got {high!r}")
    elif log and step is not None:
        check.problem(path + ("step",), "cannot be used with log: true (Optuna samples a log range without a step)")
    elif log and low <= 0:
        check.problem(path + ("low",), f"must be > 0 with log: true; got {low!r}")
    else:
        return Param(name, low, high, log, step)
    return None


def _named(check: _Checker, key: str, value: Any, arguments: Mapping[str, Sequence[str]]) -> Optional[Dict[str, Any]]:
    """``sampler`` / ``pruner``: a name, or a mapping with ``type`` and the Optuna class's arguments."""
    given = {"type": value} if isinstance(value, str) else dict(value)
    kind = given.get("type")
    if kind not in arguments:
        at = (key, "type") if isinstance(value, dict) else (key,)
        hint = did_you_mean(str(kind), list(arguments)) if isinstance(kind, str) else ""
        check.problem(at, expected(f"one of {', '.join(arguments)}", kind) + hint)
        return None
    valid = arguments[kind]
    for name in given:
        if name != "type" and name not in valid:
            takes = f" (valid: {', '.join(valid)})" if valid else f" ({key} {kind} takes no arguments)"
            check.problem((key, name), f"unknown argument of {key} {kind}{did_you_mean(str(name), valid) or takes}")
    return given


def _objective(check: _Checker, value: Mapping[str, Any]) -> Tuple[str, str]:
    for key, message in check_options(OBJECTIVE_KEYS, value):
        check.problem(("objective", key), message.replace("unknown option", "unknown key"))
    metric, mode = value.get("metric", "eval/loss"), value.get("mode", "min")
    return (metric if isinstance(metric, str) else "eval/loss"), (mode if mode in ("min", "max") else "min")


def _command(check: _Checker, value: Any, given: Sequence[str]) -> Tuple[str, ...]:
    if given:
        return tuple(given)
    if value is None:
        check.problem(("command",), "no training command: set command: in the file, or give it after `--` "
                                    "(msbridge sweep SWEEP.yaml -- python train.py)")
        return ()
    try:
        words = shlex.split(value) if isinstance(value, str) else [str(w) for w in value]
    except ValueError as exc:
        check.problem(("command",), f"cannot split it as a shell would: {exc}")
        return ()
    if not words:
        check.problem(("command",), "is empty")
    return tuple(words)


def _devices(check: _Checker, data: Mapping[str, Any]) -> Tuple[str, ...]:
    """``devices``: distinct ids (numbers or names), at least ``jobs`` of them (each running trial holds one)."""
    given = data.get("devices")
    if not isinstance(given, list) or not given:
        if given == []:
            check.problem(("devices",), "is empty; leave it out to run trials without a device of their own")
        return ()
    ids = [str(d) for d in given if (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
           or (isinstance(d, str) and d.strip())]
    if len(ids) != len(given) or len(set(ids)) != len(ids):
        check.problem(("devices",), expected("a list of distinct device ids (integers >= 0 or names)", given))
        return ()
    jobs = data.get("jobs", 1)
    if isinstance(jobs, int) and jobs > len(ids):
        check.problem(("jobs",), f"must be <= the number of devices ({len(ids)}): each running trial holds one")
    return tuple(ids)


def check_spec(tree: Tree, shown: str, command: Sequence[str] = ()) -> Tuple[Optional[SweepSpec], List[str]]:
    """The ``SweepSpec`` of one parsed document, or None, and every problem found in it."""
    check = _Checker(tree, shown)
    data = tree.data
    for key, message in check_options(KEYS, data):
        check.problem((key,), message.replace("unknown option", "unknown key"))
    if not data.get("study") and "study" not in data:
        check.problem((), "study: is required (the Optuna study's name, the MLflow experiment and the sweep_id)")
    params: Dict[str, Param] = {}
    for name, value in (data.get("params") or {}).items() if isinstance(data.get("params"), dict) else ():
        parsed = _parse_param(check, str(name), value)
        if parsed is not None:
            params[str(name)] = parsed
    if not data.get("params"):
        check.problem(("params",) if "params" in data else (), "params: the search space is empty; give at least "
                                                               "one, e.g. optimizer.learning_rate: {low: 1.0e-4, "
                                                               "high: 1.0, log: true}")
    sampler = _named(check, "sampler", data.get("sampler", "tpe"), SAMPLER_ARGS) \
        if isinstance(data.get("sampler", "tpe"), (str, dict)) else None
    pruner = _named(check, "pruner", data.get("pruner", "median"), PRUNER_ARGS) \
        if isinstance(data.get("pruner", "median"), (str, dict)) else None
    objective = data.get("objective") if isinstance(data.get("objective"), dict) else {}
    metric, mode = _objective(check, objective)
    words = _command(check, data.get("command"), command)
    devices = _devices(check, data)
    if sampler and sampler["type"] == "grid":
        for name, param in params.items():
            if param.grid() is None:
                check.problem(("params", name), "the grid sampler needs a list of choices or a step to enumerate")
    if check.problems:
        return None, check.problems
    spec = SweepSpec(shown, data["study"], words, params, data.get("trials", 10), data.get("timeout"),
                     data.get("jobs", 1), sampler, pruner, metric, mode, data.get("storage"),
                     data.get("experiment_dir", DEFAULT_EXPERIMENT_DIR), devices)
    return spec, []


def load_spec(path: str, command: Sequence[str] = ()) -> SweepSpec:
    """The checked sweep file at ``path``; ``command`` (the words after ``--``) replaces its ``command``.

    Raises:
        ConfigError: every problem, one ``file:line: key: message`` line each.
    """
    with suggestion_budget():
        trees, problems = read_yaml(path, path)
        if not problems and len(trees) != 1:
            problems = [f"{path}: expected one YAML document, got {len(trees)}"]
        spec = None
        if not problems:
            spec, problems = check_spec(trees[0], path, command)
    if problems:
        raise ConfigError(problems)
    return spec

"""``load_config``: the validated, immutable ``Config`` (``settings``) from YAML, a dict or a Config.

``Config`` holds msbridge's own settings; ``params`` holds the training job's
hyperparameters (model, optimizer, runner ...) that msbridge logs but does not
interpret. ``load_config`` runs the whole pipeline: compose (``base_config:``,
``---`` documents, ``--set``) -> resolve ``${...}`` -> map dialects -> check
every value (``Config`` checks its own) and directory -> ``Config``. Every problem is collected first and
raised together as one ``ConfigError``, each line with ``file:line`` where YAML
gives it. What each value's source was is kept in ``Config.provenance``.

Example:
    >>> cfg = load_config({"experiment": "tiny-lm", "sinks": ["jsonl", "tensorboard"]})
    >>> cfg.flush_steps, sorted(cfg.sinks)
    (100, ['jsonl', 'tensorboard'])
"""
from __future__ import annotations

import logging
import os
from dataclasses import MISSING, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ..errors import ConfigError
from ..options import expected, suggestion_budget
from ..paths import (
    MAX_COMPONENT_BYTES,
    experiment_dir_template,
    render_experiment_dir,
    render_output_dir,
    render_template,
)
from .canonical import canonicalize
from .directories import path_problem, placeholder_problem, static_prefix, volatile_reason, writable_problem
from .interpolate import interpolate
from .keys import Assignment, Note, Provenance
from .mindformers_entry import ENTRY_NAME
from .prepare import Prepared, Source, drop_huge_ints, prepare
from .settings import DEFAULT_OUTPUT_DIR, FIELD_NAMES, Config, SettingsError
from .settings import plain as thaw
from .yaml_lines import Origin, Path, Tree, format_path

__all__ = ["Config", "DEFAULT_OUTPUT_DIR", "FIELD_NAMES", "Provenance", "build_config",
           "load_config", "log_notes", "thaw"]

log = logging.getLogger("msbridge")

OUTPUT_PLACEHOLDERS = ("experiment", "run_name", "rank", "timestamp")
EXPERIMENT_DIR = "{experiment_dir}"
#: Part of the note on a directory that may be wiped; ``log_notes`` says each such note once per process.
VOLATILE_WARNING = "it may be wiped (reboot, tmp cleaner)"
_SAID_VOLATILE: Set[str] = set()


def _defaults() -> Dict[str, Any]:
    return {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(Config)}


class _Checker:
    """Turns canonical-path problems into ``file:line: user.key: message`` lines."""

    def __init__(self, winners: Dict[Path, Assignment], failed: Set[Path],
                 origins: Optional[Mapping[Path, Origin]] = None) -> None:
        self.winners, self.failed, self.origins = winners, failed, origins or {}
        self.problems: List[str] = []
        self.notes: List[Note] = []
        self.volatile: Set[str] = set()

    def source(self, path: Path) -> Tuple[Optional[Origin], Path]:
        for end in range(len(path), 0, -1):
            item = self.winners.get(path[:end])
            if item is not None:  # a value inside a list the setting holds has its own line in the file
                source = item.source + path[end:]
                inside = self.origins.get(source) if end < len(path) else None
                same = inside is not None and item.origin is not None and inside.file == item.origin.file
                return (inside if same else item.origin), source
        deeper = next((a for t, a in self.winners.items() if t[:len(path)] == path), None)
        if deeper is None:
            return None, path
        extra = len(deeper.target) - len(path)
        return deeper.origin, deeper.source[:len(deeper.source) - extra]

    def problem(self, path: Path, message: str) -> None:
        origin, source = self.source(path)
        if any(source[:len(bad)] == bad for bad in self.failed):
            return  # its ${...} could not be resolved; that problem is already reported
        renamed = source and path and isinstance(source[-1], str) and source[-1] != path[-1]
        sets = f" (it sets {format_path(path)})" if renamed else ""
        text = f"{format_path(source)}: {message}{sets}"
        self.problems.append(f"{origin}: {text}" if origin else text)

    def directory(self, path: Path, template: Any, placeholders: Sequence[str] = (),
                  checked_as: Optional[str] = None) -> None:
        """Check a directory template with the allowed ``placeholders`` (none: a plain path).

        ``checked_as``: the template to create and write-test instead (``{experiment_dir}`` filled in).
        """
        if not isinstance(template, str) or not template:
            self.problem(path, expected("a directory path", template))
            return
        bad = placeholder_problem(template, placeholders) if placeholders else None
        if bad:
            self.problem(path, bad)
            return
        template = checked_as or template
        prefix = static_prefix(template) if placeholders else os.path.expanduser(template)
        problem = writable_problem(prefix) or (path_problem(_longest(template)) if placeholders else None)
        if problem:
            self.problem(path, problem)
            return
        reason = volatile_reason(prefix)
        if reason and os.path.abspath(prefix) not in self.volatile:  # once per directory
            self.volatile.add(os.path.abspath(prefix))
            origin, source = self.source(path)
            self.notes.append(Note(origin or Origin("default"), f"{format_path(source)}: {os.path.abspath(prefix)!r} "
                                   f"is {reason}: {VOLATILE_WARNING} and the run's curves with "
                                   "it; use a persistent directory", logging.WARNING))


def _longest(template: str) -> str:
    """``template`` with each placeholder at its longest (a name: a safe component's bytes and its hash)."""
    longest = {"experiment": "x" * (MAX_COMPONENT_BYTES + 9), "run_name": "x" * (MAX_COMPONENT_BYTES + 9),
               "rank": "9" * 7, "timestamp": "0" * 15}
    try:
        return template.format(**longest)
    except (KeyError, IndexError, ValueError):
        return static_prefix(template)  # the template's own problem is reported where it is checked


def _check(full: Dict[str, Any], checker: _Checker) -> Optional[Config]:
    """Report every problem of ``full`` to ``checker``; the ``Config`` when its values are valid.

    The values are checked once, by ``Config`` itself (``settings.setting_problems``); what only a file can
    have wrong (a directory, a template's references) is checked here.
    """
    try:
        config: Optional[Config] = Config(**full)
    except SettingsError as exc:
        config = None
        for path, message in exc.located:
            checker.problem(path, message)
    if isinstance(full["run_name"], str) and isinstance(full["params"], Mapping):
        try:
            render_template(full["run_name"], full["params"], full, {"timestamp": "t", "rank": 0})
        except ConfigError as exc:
            checker.problem(("run_name",), str(exc).split(": ", 1)[-1])
    if full["monitor_on"] is False:
        origin, source = checker.source(("monitor_on",))
        checker.notes.append(Note(origin or Origin("default"), f"{format_path(source)}: false -> msbridge builds "
                                  "no sink and records nothing", logging.WARNING))
    if full["monitor_on"] is not True:
        return config
    _check_run_dirs(full, checker)
    health = full["health"] if isinstance(full["health"], Mapping) else {}
    if "dump_dir" in health:
        checker.directory(("health", "dump_dir"), health["dump_dir"], OUTPUT_PLACEHOLDERS)
    sinks = full["sinks"] if isinstance(full["sinks"], Mapping) else {}
    from ..sinks.registry import fault_policy

    for name, options in sinks.items():
        for key, value in _sink_dirs(options):
            if fault_policy(options) != "warn":  # a "warn" sink's are warnings: ``_check_stores``
                checker.directory(("sinks", name, key), value)
    if config is not None:
        _check_stores(config.sinks, full, checker)
    return config


def _check_stores(sinks: Mapping[str, Mapping[str, Any]], full: Dict[str, Any], checker: _Checker) -> None:
    """Each tracker's store where its options leave it to the default (the experiment dir), checked as a given one
    is (an MLflow store this MLflow cannot use ...); a sink with ``on_fault: warn`` has all its faults as warnings."""
    from ..options import check_options
    from ..sinks.registry import OFF_FOR_RUN, ON_FAULT, check_available, sink_class, with_store_defaults

    experiment_dir = _experiment_dir(full)
    for name, options in sinks.items():
        warn = options.get(ON_FAULT) == "warn"
        try:
            check_available(name)
            cls = sink_class(name)
        except (ConfigError, ImportError) as exc:  # a fault sink_problems reports for a "fail" sink
            problems = [("", str(exc))] if warn else []
        else:
            given = {k: v for k, v in options.items() if k != ON_FAULT}
            placed = with_store_defaults(name, given, experiment_dir) if experiment_dir else given
            problems = [(k, m) for k, m in check_options(cls.options, placed) if warn or k not in given]
            problems += [(k, m) for k, m in ((k, writable_problem(os.path.expanduser(v)))
                                             for k, v in _sink_dirs(options)) if warn and m]
        for key, message in problems:
            if warn:
                origin, source = checker.source(("sinks", name))
                checker.notes.append(Note(origin or Origin("default"), f"{format_path(source)}: {OFF_FOR_RUN}: "
                                          f"{message}; jsonl records every step", logging.WARNING))
            else:
                checker.problem(("sinks", name), f"{key} (by default {placed[key]!r}): {message}")


def _sink_dirs(options: Any) -> List[Tuple[str, str]]:
    """A sink's directory options (``logdir``, ``summary_dir`` ...) given as text."""
    items = options.items() if isinstance(options, Mapping) else ()
    return [(str(key), value) for key, value in items if str(key).endswith("dir") and isinstance(value, str)]


def _experiment_dir(full: Dict[str, Any]) -> Optional[str]:
    """The experiment dir, when it is known before the run; else None."""
    try:
        return render_experiment_dir(experiment_dir_template(full["experiment_dir"], full["output_dir"]),
                                     full["experiment"])
    except (ConfigError, ValueError, KeyError, IndexError, TypeError):
        return None  # the template's own problem is reported where it is checked


def _check_run_dirs(full: Dict[str, Any], checker: _Checker) -> None:
    """``experiment_dir`` (when set) and ``output_dir``, the latter with ``{experiment_dir}`` filled in."""
    output_dir, experiment_dir = full["output_dir"], full["experiment_dir"]
    if not (isinstance(output_dir, str) and output_dir and (experiment_dir is None or isinstance(experiment_dir, str))):
        return  # Config said what is wrong with the type
    if experiment_dir is not None:
        before = len(checker.problems)
        checker.directory(("experiment_dir",), experiment_dir, ("experiment",))
        if len(checker.problems) > before and output_dir.startswith(EXPERIMENT_DIR):
            return  # output_dir's problem would be the same one, said again
    if output_dir.find(EXPERIMENT_DIR, 1) >= 0:
        checker.problem(("output_dir",), f"{EXPERIMENT_DIR} may only start output_dir: {output_dir!r}")
        return
    filled = output_dir.replace(EXPERIMENT_DIR, experiment_dir_template(experiment_dir, output_dir), 1)
    before = len(checker.problems)
    checker.directory(("output_dir",), output_dir, ("experiment_dir",) + OUTPUT_PLACEHOLDERS, checked_as=filled)
    existing = _existing_run_dir(full) if len(checker.problems) == before else None
    problem = writable_problem(existing) if existing else None
    if problem:  # said at the setting that names this dir (output_dir, else run_name or experiment_dir)
        key = next((k for k in ("output_dir", "run_name", "experiment_dir", "experiment")
                    if checker.source((k,))[0] is not None), "output_dir")
        checker.problem((key,), f"the run dir {existing!r} exists and cannot be written "
                                f"({problem.rsplit(': ', 1)[-1]})")


def _existing_run_dir(full: Dict[str, Any]) -> Optional[str]:
    """Rank 0's run dir when its name is known before the run (no ``{timestamp}``) and it already exists."""
    if "{timestamp}" in full["output_dir"] + str(full["run_name"]) or not isinstance(full["experiment"], str) \
            or not isinstance(full["run_name"], str) or not isinstance(full["params"], Mapping):
        return None
    experiment_dir = _experiment_dir(full)
    if experiment_dir is None:
        return None
    try:
        name = render_template(full["run_name"], full["params"], full, {"rank": 0})
        run_dir = render_output_dir(full["output_dir"], full["experiment"], name, 0, "", experiment_dir)
    except (ConfigError, ValueError, KeyError, IndexError):
        return None  # the template's own problem is reported where it is checked
    return run_dir if os.path.isdir(run_dir) else None


def _provenance(source: str, tree: Tree, winners: Dict[Path, Assignment], written: Dict[Path, str],
                notes: List[Note]) -> Provenance:
    def key(path: Path) -> str:
        return f"{format_path(path)} = {written[path]}" if path in written else format_path(path)

    origins: Dict[Path, Tuple[str, str]] = {}
    for target, item in winners.items():
        origins[target] = (str(item.origin), key(item.source))
        if isinstance(item.value, (Mapping, list)) and item.value:
            depth = len(item.source)
            for path, origin in tree.origins.items():
                if len(path) > depth and path[:depth] == item.source:
                    origins[target + path[depth:]] = (str(origin), key(path))
    return Provenance(source, origins, tuple(notes))


def build_config(source: Union[Source, Config] = None, overrides: Sequence[str] = (),
                 entry: Optional[Mapping[str, Any]] = None, name: str = ENTRY_NAME,
                 label: Optional[str] = None) -> Config:
    """Like ``load_config``, but logs nothing (``msbridge config`` prints the notes itself).

    ``entry``/``name``/``label``: see ``prepare`` (the mindformers callback passes its own entry).
    """
    if isinstance(source, Config):
        source = source.to_dict()
    with suggestion_budget():  # nearest-key suggestions capped: linear time in the number of unknown keys
        prepared = prepare(source, overrides, entry, name, label)
        if isinstance(source, (str, os.PathLike)) and not prepared.tree.data and not prepared.problems:
            prepared.problems.append(f"{prepared.label}:1: the file holds no settings (it is empty, or only comments "
                                     "or null); write msbridge settings, or a training YAML with a monitor_config: "
                                     "section")
        return _checked(prepared)


def _checked(prepared: Prepared) -> Config:
    """The pipeline after preparation: interpolate, canonical names, validate.

    Raises:
        ConfigError: every problem found, including those found while preparing.
    """
    notes, problems, label = list(prepared.notes), list(prepared.problems), prepared.label
    tree, problems_of_ints, huge = drop_huge_ints(prepared.tree)  # a dict or --set may hold one
    tree, ref_problems, failed, written = interpolate(tree)
    problems += problems_of_ints
    failed |= huge
    values, winners, mapped = canonicalize(tree, failed, prepared.sections)
    problems += ref_problems + mapped.problems
    notes += mapped.notes
    full = dict(_defaults(), **values)
    checker = _Checker(winners, failed, tree.origins)
    config = _check(full, checker)
    problems += checker.problems
    if problems or config is None:
        raise ConfigError(list(dict.fromkeys(problems)))
    notes = list(dict.fromkeys(notes + checker.notes))
    object.__setattr__(config, "_provenance", _provenance(label, tree, winners, written, notes))
    return config


def load_config(source: Union[str, "os.PathLike[str]", Mapping[str, Any], Config, None] = None,
                overrides: Sequence[str] = ()) -> Config:
    """A validated ``Config`` from a YAML file path, a dict or a Config, with ``key=value`` overrides.

    Each dialect mapping and warning is logged once on the ``msbridge`` logger.

    Raises:
        ConfigError: with ``.problems``, one ``file:line: key: message`` line per problem.

    Example:
        >>> cfg = load_config("train.yaml", overrides=["monitor_config.interval=50"])
    """
    if isinstance(source, Config) and not overrides:
        return source
    return log_notes(build_config(source, overrides))


def log_notes(config: Config) -> Config:
    """Log each dialect mapping and warning of ``config`` on the ``msbridge`` logger; a volatile directory's warning
    once per process (a sweep's runs share their directories), though ``config check`` shows it every time."""
    for note in config.provenance.notes:
        text = str(note)
        if VOLATILE_WARNING in text:
            if text in _SAID_VOLATILE:
                continue
            _SAID_VOLATILE.add(text)
        log.log(note.level, "msbridge config: %s", text)
    return config

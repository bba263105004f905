"""Keys as users wrote them: where msbridge's section is, what each key became, what was said.

``Key`` is the handle a dialect handler gets for one user key: it records the
``Assignment``s to canonical paths, the ``Note`` line that says so once, and
problems, all pointing at the key's ``file:line``. A loaded config keeps where
each value came from as its ``Provenance``.

Example:
    >>> out = Mapped()
    >>> key = Key(out, ("monitor_config", "interval"), Origin("run.yaml", 5), {}, "monitor_config")
    >>> key.set(("flush_steps",), 20); key.says("flush_steps")
    >>> str(out.notes[0])
    'run.yaml:5: monitor_config.interval -> flush_steps'
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Tuple

from .yaml_lines import Origin, Path, format_path

SECTIONS = ("msbridge", "monitor_config")  # when both are present, ``msbridge:`` is msbridge's


def dig(data: Any, *path: Any) -> Any:
    """The value at ``path`` in nested mappings, None where a step is missing or not a mapping.

    Example:
        >>> dig({"parallel_config": {"data_parallel": 8}}, "parallel_config", "data_parallel")
        8
        >>> dig({"parallel_config": 8}, "parallel_config", "data_parallel") is None
        True
    """
    node = data
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


#: Top-level sections that mark a file as a training YAML even without a monitor section.
TRAINING_SECTIONS = frozenset({
    "model", "runner_config", "optimizer", "lr_schedule", "callbacks", "context", "parallel", "parallel_config",
    "train_dataset", "train_dataset_task", "trainer", "processor", "runner_wrapper", "recompute_config",
    "eval_dataset", "metric", "moe_config", "run_mode"})


def section_of(data: Mapping[Any, Any]) -> Optional[str]:
    """The section holding msbridge's settings in a training YAML, or None if there is none."""
    return next((name for name in SECTIONS if name in data), None)


def is_training_yaml(data: Mapping[Any, Any]) -> bool:
    """A training YAML has a monitor section or a known training section (model, runner_config ...)."""
    return section_of(data) is not None or any(key in TRAINING_SECTIONS for key in data)


def show(value: Any) -> str:
    """A value as YAML spells it in a note (``true``, ``null``, ``'skip'``, ``20``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


@dataclass(frozen=True)
class Note:
    """One line saying what a key became (or that a value was overridden), logged once."""

    origin: Origin
    text: str
    level: int = logging.INFO

    def __str__(self) -> str:
        return f"{self.origin}: {self.text}"


@dataclass(frozen=True)
class Assignment:
    """``target`` (a canonical path such as ``("health", "dump_dir")``) set from user key ``source``."""

    target: Path
    value: Any
    source: Path
    origin: Origin


@dataclass
class Mapped:
    """What mapping a config produced: assignments, note lines, problems."""

    assignments: List[Assignment] = field(default_factory=list)
    notes: List[Note] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    where: Callable[[Path], Optional[Origin]] = lambda path: None


class Key:
    """One user key being mapped: where it is, its siblings, and where results go."""

    def __init__(self, out: Mapped, path: Path, origin: Origin, section: Mapping[Any, Any],
                 section_name: Optional[str]) -> None:
        self.out, self.path, self.origin = out, path, origin
        self.section, self.section_name = section, section_name

    def set(self, target: Path, value: Any) -> None:
        self.out.assignments.append(Assignment(target, value, self.path, self.origin))

    def says(self, text: str, level: int = logging.INFO) -> None:
        self.out.notes.append(Note(self.origin, f"{format_path(self.path)} -> {text}", level))

    def problem(self, text: str) -> None:
        self.out.problems.append(f"{self.origin}: {format_path(self.path)}: {text}")

    def child(self, name: str, origin: Optional[Origin]) -> "Key":
        return Key(self.out, self.path + (name,), origin or self.origin, self.section, self.section_name)

    def mindformers_only(self, what: str) -> None:
        if self.section_name == "monitor_config":
            self.says(f"left to mindformers ({what}); msbridge does not use it")
        else:
            self.says(f"no effect: only mindformers reads it ({what}), under monitor_config:", logging.WARNING)


@dataclass(frozen=True)
class Provenance:
    """Where a loaded config's values came from, and the dialect lines said while loading.

    Example:
        >>> cfg = load_config("monitor.yaml")
        >>> cfg.provenance.origin(("flush_steps",))
        ('monitor.yaml:4', 'monitor_config.interval')
    """

    source: str = "<defaults>"
    origins: Mapping[Path, Tuple[str, str]] = field(default_factory=dict)
    notes: Tuple[Note, ...] = ()

    def origin(self, path: Path) -> Tuple[str, str]:
        """``(where, user key)`` of ``path`` or its nearest ancestor; ``("default", "")`` if unset."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.origins:
                return self.origins[path[:end]]
        return ("default", "")

    @property
    def warnings(self) -> Tuple[str, ...]:
        return tuple(str(n) for n in self.notes if n.level >= logging.WARNING)

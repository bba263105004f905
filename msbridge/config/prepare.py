"""Preparation: a config source turned into one tree of settings, before the checking pipeline.

``prepare`` is the only config step that reads files. It composes the source
(``base_config:`` files, ``---`` documents, ``--set`` overrides; see
``compose``). When the source is a mindformers run YAML with an
``MSBridgeMonitor`` entry under ``callbacks:``, it also composes the msbridge
YAML the entry names with ``config:`` and lays the entry out as msbridge
sections (``mindformers_entry``). What it returns then goes once, one way,
through interpolation, canonical names and validation (``load``).

Example:
    >>> prepared = prepare("run.yaml", ["monitor_config.interval=50"])
    >>> prepared.sections
    [('monitor_config',), ('callbacks', 1)]
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ..limits import huge_int_problem, int_digits, is_huge_int
from .compose import compose
from .keys import Note, section_of
from .mindformers_entry import ENTRY_NAME, entry_sections, find_entry, graft, on_top
from .yaml_lines import Origin, Path, Tree, format_path

Source = Union[str, "os.PathLike[str]", Mapping[str, Any], None]


@dataclass
class Prepared:
    """A composed tree, the label its messages use, and what composing it found.

    ``sections`` names the msbridge sections of a mindformers run YAML with a
    callbacks entry (None: the usual sections, see ``canonicalize``).
    """

    tree: Tree
    label: str
    sections: Optional[List[Path]] = None
    notes: List[Note] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def label_of(source: Source) -> str:
    """How messages name ``source``: its path, ``<dict>`` or ``<defaults>``."""
    if source is None:
        return "<defaults>"
    return "<dict>" if isinstance(source, Mapping) else os.fspath(source)


def prepare(source: Source, overrides: Sequence[str] = (), entry: Optional[Mapping[str, Any]] = None,
            name: str = ENTRY_NAME, label: Optional[str] = None) -> Prepared:
    """Compose ``source``; lay out its ``name`` callbacks entry (the one whose keys are ``entry``, if given).

    Without ``entry``, the first ``MSBridgeMonitor`` entry of a run YAML that has
    no ``msbridge:`` section is used (as ``msbridge config check`` reads it).
    """
    label = label or label_of(source)
    tree, notes, problems = compose(source, overrides, label=label)
    index = None
    if entry is not None or section_of(tree.data) != "msbridge":
        index = find_entry(tree.data, entry, name)
    if index is None:
        return Prepared(tree, label, None, notes, problems)
    config_file = tree.data["callbacks"][index].get("config")
    tree = on_top(tree, index)
    if config_file is not None:
        tree, more = _with_config_file(tree, index, config_file, label)
        problems += more
    tree, sections, more_notes, more_problems = entry_sections(tree, index, label)
    return Prepared(tree, label, sections, notes + more_notes, problems + more_problems)


def _with_config_file(tree: Tree, index: int, name: Any, label: str) -> Tuple[Tree, List[str]]:
    """The msbridge YAML named by the entry's ``config:`` (relative to the run YAML, else the cwd), grafted."""
    origin = tree.origins.get(("callbacks", index, "config"), Origin(label))
    if not isinstance(name, str) or not name:
        return tree, [f"{origin}: callbacks[{index}].config: expected the path of a msbridge YAML, got {name!r}"]
    here = os.path.dirname(os.path.abspath(label)) if os.path.isfile(label) else os.getcwd()
    path = os.path.join(here, name)
    if not os.path.isfile(path) and os.path.isfile(name):
        path = name
    loaded, _, problems = compose(path)
    section = section_of(loaded.data)
    prefix: Path = (section,) if section is not None else ()  # a training YAML: its msbridge section
    data = loaded.data[section] if section is not None else loaded.data
    if not isinstance(data or {}, Mapping):
        return tree, problems + [f"{origin}: callbacks[{index}].config: {name!r} holds no mapping of msbridge "
                                 "settings"]
    return graft(tree, index, loaded, prefix), problems


def drop_huge_ints(tree: Tree) -> Tuple[Tree, List[str], Set[Path]]:
    """``tree`` with every integer over ``MAX_INT_DIGITS`` digits replaced by None, one problem for each,
    and their paths (later checks skip them, as they skip an unresolved reference).

    Example:
        >>> from msbridge.config.yaml_lines import Tree
        >>> tree, problems, failed = drop_huge_ints(Tree({"params": {"seed": 10 ** 100}}))
        >>> tree.data, failed
        ({'params': {'seed': None}}, {('params', 'seed')})
    """
    problems: List[str] = []
    failed: Set[Path] = set()

    def walk(value: Any, path: Path) -> Any:
        if isinstance(value, Mapping):
            return {k: walk(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path + (i,)) for i, v in enumerate(value)]
        if is_huge_int(value):
            where = tree.origin_of(path)
            text = f"{format_path(path)}: {huge_int_problem(int_digits(value))}"
            problems.append(f"{where}: {text}" if where else text)
            failed.add(path)
            return None
        return value

    if not problems_possible(tree.data):
        return tree, problems, failed
    return Tree(walk(tree.data, ()), dict(tree.origins)), problems, failed


def problems_possible(value: Any) -> bool:
    """Whether ``value`` holds any integer over the limit (a quick look before copying the tree)."""
    if isinstance(value, Mapping):
        return any(problems_possible(v) or is_huge_int(k) for k, v in value.items())
    if isinstance(value, list):
        return any(problems_possible(v) for v in value)
    return is_huge_int(value)

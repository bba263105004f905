"""A ``MSBridgeMonitor`` entry in a mindformers run YAML's ``callbacks:`` list, as msbridge sections.

mindformers builds ``MSBridgeMonitor`` from the entry's keys; msbridge also
reads the run's ``monitor_config:`` so that ``step_interval``, ``dump_path``,
the global-norm keys ... are written once. ``entry_sections`` turns a composed
run YAML into the tree and sections that ``config.config_from_tree`` checks.
Settings, lowest precedence first:

1. ``monitor_config:`` (the standalone dialect; its ``monitor_on`` stays
   mindformers' switch for TrainingStateMonitor);
2. the msbridge YAML named by the entry's ``config:``;
3. the entry's own keys.

Messages name the key as ``callbacks[i].key`` with its file and line. Used by
``msbridge.mindformers`` (the callback) and by ``msbridge config check`` (a run
YAML with such an entry). Nothing here imports mindformers.

Example:
    >>> tree, _, _ = compose("run.yaml")
    >>> index = find_entry(tree.data)
    >>> tree, sections, notes, problems = entry_sections(tree, index, "run.yaml")
    >>> sections
    [('monitor_config',), ('callbacks', 1)]
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, List, Mapping, Optional, Tuple

from .compose import compose, deep_merge
from .keys import Note, section_of
from .yaml_lines import Origin, Path, Tree

ENTRY_NAME = "MSBridgeMonitor"
#: Keys of the entry that are mindformers' or the entry's own, not msbridge settings.
_ENTRY_KEYS = ("type", "config", "auto_register")


def entry_sections(tree: Tree, index: int, label: str) -> Tuple[Tree, List[Path], List[Note], List[str]]:
    """The tree with the entry ready to check, msbridge's sections in it, notes and problems."""
    notes: List[Note] = []
    problems: List[str] = []
    base = _top_seq(tree)
    tree = _entry_on_top(tree, index, base)
    config_file = tree.data["callbacks"][index].get("config")
    if config_file is not None:
        tree, problems = _graft_config_file(tree, index, config_file, label, base)
    tree = _without(tree, [("callbacks", index, key) for key in _ENTRY_KEYS])
    monitor = tree.data.get("monitor_config")
    if isinstance(monitor, Mapping) and "monitor_on" in monitor:
        notes.append(Note(tree.origins.get(("monitor_config", "monitor_on"), Origin(label)),
                          "monitor_config.monitor_on -> left to mindformers (its TrainingStateMonitor); "
                          "MSBridgeMonitor runs because callbacks lists it"))
        tree = _without(tree, [("monitor_config", "monitor_on")])
    sections: List[Path] = [("monitor_config",)] if isinstance(tree.data.get("monitor_config"), Mapping) else []
    sections.append(("callbacks", index))
    return tree, sections, notes, problems


def find_entry(data: Mapping[str, Any], entry: Optional[Mapping[str, Any]] = None,
               name: str = ENTRY_NAME) -> Optional[int]:
    """The index in ``callbacks:`` of the entry of type ``name`` (whose other keys are ``entry``, if given)."""
    callbacks = data.get("callbacks")
    if not isinstance(callbacks, list):
        return None
    for index, item in enumerate(callbacks):
        if isinstance(item, Mapping) and item.get("type") == name:
            if entry is None or {k: v for k, v in item.items() if k not in ("type", "auto_register")} == entry:
                return index
    return None


def _top_seq(tree: Tree) -> int:
    return max((o.seq for o in tree.origins.values()), default=0)


def _entry_on_top(tree: Tree, index: int, base: int) -> Tree:
    """The entry's own keys in the highest layer: they win over monitor_config and the config file."""
    prefix = ("callbacks", index)
    return Tree(tree.data, {p: replace(o, seq=base + 2) if p[:2] == prefix else o for p, o in tree.origins.items()})


def _graft_config_file(tree: Tree, index: int, name: Any, label: str, base: int) -> Tuple[Tree, List[str]]:
    """The msbridge YAML named by ``config:`` merged under the entry's own keys."""
    where = ("callbacks", index, "config")
    origin = tree.origins.get(where, Origin(label))
    if not isinstance(name, str) or not name:
        return tree, [f"{origin}: callbacks[{index}].config: expected the path of a msbridge YAML, got {name!r}"]
    here = os.path.dirname(os.path.abspath(label)) if os.path.isfile(label) else os.getcwd()
    path = os.path.join(here, name)  # relative to the run YAML, else to the working directory
    if not os.path.isfile(path) and os.path.isfile(name):
        path = name
    loaded, _, problems = compose(path)
    data = loaded.data
    prefix: Path = ()
    section = section_of(data)
    if section is not None:  # a training YAML: its msbridge section
        data, prefix = data[section] or {}, (section,)
    if not isinstance(data, Mapping):
        return tree, problems + [f"{origin}: callbacks[{index}].config: {name!r} holds no mapping of msbridge "
                                 "settings"]
    entry = tree.data["callbacks"][index]
    tree.data["callbacks"][index] = deep_merge(data, entry)
    at = ("callbacks", index)
    origins = {at + p[len(prefix):]: replace(o, seq=base + 1) for p, o in loaded.origins.items()
               if p[:len(prefix)] == prefix and len(p) > len(prefix)}
    origins.update(tree.origins)  # the entry's own keys keep their origins (and win)
    return Tree(tree.data, origins), problems


def _without(tree: Tree, paths: List[Path]) -> Tree:
    for path in paths:
        node: Any = tree.data
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, Mapping) else node[part] if isinstance(node, list) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    gone = set(paths)
    return Tree(tree.data, {p: o for p, o in tree.origins.items() if not any(p[:len(g)] == g for g in gone)})

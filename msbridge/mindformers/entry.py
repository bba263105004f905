"""The ``Config`` of one ``MSBridgeMonitor`` entry in a mindformers run YAML.

mindformers hands a third-party callback the keys of its own ``callbacks:``
entry and nothing else. So that ``monitor_config`` (``step_interval``,
``dump_path``, the global-norm keys ...) is written once and read by both,
``entry_config`` looks for the run YAML the entry came from: the file of the
``mindformers.Trainer`` being built (``Trainer(args="run.yaml")``), else a
``--config FILE`` argument (``run_mindformer.py``), else the Trainer's loaded
config (no line numbers). The entry is found in its ``callbacks:`` list by its
keys, so every message names the file, the line and ``callbacks[i]``.

Settings, lowest precedence first:

1. ``monitor_config:`` (the same dialect as a standalone file; ``monitor_on``
   stays mindformers' switch for its own TrainingStateMonitor);
2. the file named by the entry's ``config:`` (a msbridge YAML);
3. the entry's own keys.

Every other top-level section (model, optimizer, runner_config ...) is logged as
a training param. Validation is the standalone YAML's, with the same
did-you-mean errors.

Example:
    >>> cfg = entry_config({"experiment": "tiny-llama", "sinks": ["jsonl"], "flush_steps": 10})
    >>> cfg.flush_steps
    10
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..compose import compose, deep_merge, plain
from ..config import Config, config_from_tree, log_notes
from ..keys import Note, section_of
from ..yaml_source import Origin, Path, Tree

ENTRY_NAME = "MSBridgeMonitor"
#: Keys of the entry that are mindformers' or the entry's own, not msbridge settings.
_ENTRY_KEYS = ("type", "config", "auto_register")

Located = Tuple[Tree, int, str, List[str]]  # tree, index in callbacks, label, problems


def entry_config(entry: Mapping[str, Any], name: str = ENTRY_NAME) -> Config:
    """The validated ``Config`` for the callback entry whose keys (``type`` aside) are ``entry``."""
    entry = plain(entry)
    tree, index, label, problems = _locate(entry, name)
    notes: List[Note] = []
    base = _top_seq(tree)
    tree = _entry_on_top(tree, index, base)
    config_file = entry.get("config")
    if config_file is not None:
        tree, more = _graft_config_file(tree, index, config_file, label, base)
        problems = problems + more
    tree = _without(tree, [("callbacks", index, key) for key in _ENTRY_KEYS])
    monitor = tree.data.get("monitor_config")
    if isinstance(monitor, Mapping) and "monitor_on" in monitor:
        notes.append(Note(tree.origins.get(("monitor_config", "monitor_on"), Origin(label)),
                          "monitor_config.monitor_on -> left to mindformers (its TrainingStateMonitor); "
                          "MSBridgeMonitor runs because callbacks lists it"))
        tree = _without(tree, [("monitor_config", "monitor_on")])
    sections: List[Path] = [("monitor_config",)] if isinstance(tree.data.get("monitor_config"), Mapping) else []
    sections.append(("callbacks", index))
    return log_notes(config_from_tree(tree, label, notes, problems, sections=sections))


def _locate(entry: Dict[str, Any], name: str) -> Located:
    """The run YAML (or config) holding ``entry``, and the entry's index in ``callbacks``."""
    trainer = _building_trainer()
    for path in _candidate_files(trainer):
        tree, _, problems = compose(path)
        index = _find_entry(tree.data, entry, name)
        if index is not None:
            return tree, index, path, problems
    loaded = getattr(trainer, "config", None)
    if isinstance(loaded, Mapping):
        data = plain(loaded)
        index = _find_entry(data, entry, name)
        if index is not None:
            return _tree_of(data, "<mindformers config>"), index, "<mindformers config>", []
    label = f"<callbacks entry {name}>"
    return _tree_of({"callbacks": [dict(entry, type=name)]}, label), 0, label, []


def _building_trainer() -> Any:
    """The ``mindformers.Trainer`` on the call stack (it is building its callbacks), if any."""
    from mindformers import Trainer

    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _candidate_files(trainer: Any) -> List[str]:
    files = []
    args = getattr(trainer, "args", None)
    if isinstance(args, str):
        files.append(args)
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            files.append(argv[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return [f for f in dict.fromkeys(files) if f.endswith((".yaml", ".yml")) and os.path.isfile(f)]


def _find_entry(data: Mapping[str, Any], entry: Mapping[str, Any], name: str) -> Optional[int]:
    callbacks = data.get("callbacks")
    if not isinstance(callbacks, list):
        return None
    for index, item in enumerate(callbacks):
        if isinstance(item, Mapping) and item.get("type") == name:
            if {k: v for k, v in item.items() if k not in ("type", "auto_register")} == entry:
                return index
    return None


def _tree_of(data: Dict[str, Any], label: str) -> Tree:
    return compose(data, label=label)[0]


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

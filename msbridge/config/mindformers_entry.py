"""A ``MSBridgeMonitor`` entry in a mindformers run YAML's ``callbacks:`` list, laid out as msbridge sections.

mindformers builds ``MSBridgeMonitor`` from the entry's keys; msbridge also
reads the run's ``monitor_config:`` so that ``step_interval``, ``dump_path``,
the global-norm keys ... are written once. Settings, lowest precedence first:

1. ``monitor_config:`` (the standalone dialect; its ``monitor_on`` stays
   mindformers' switch for TrainingStateMonitor);
2. the msbridge YAML named by the entry's ``config:`` (``prepare`` reads it
   and hands it to ``graft``);
3. the entry's own keys.

Everything here is a pure tree transformation (nothing imports mindformers), except
``find_seq_length``, which may read ``pretrained_model_dir``'s ``config.json``. Messages
name the key as ``callbacks[i].key`` with its file and line. mindformers' own rules
for ``monitor_config`` and ``runner_wrapper`` are applied first (``mindformers_check``).

Example:
    >>> index = find_entry(tree.data)
    >>> tree = on_top(tree, index)
    >>> tree, sections, notes, problems = entry_sections(tree, index, "run.yaml")
    >>> sections
    [('monitor_config',), ('callbacks', 1)]
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, List, Mapping, Optional, Tuple

from .compose import deep_merge
from .keys import Note, dig
from .mindformers_check import check_run_yaml
from .yaml_lines import Origin, Path, Tree

ENTRY_NAME = "MSBridgeMonitor"
#: Keys of the entry that are mindformers' or the entry's own, not msbridge settings.
_ENTRY_KEYS = ("type", "config", "auto_register")


def entry_sections(tree: Tree, index: int, label: str) -> Tuple[Tree, List[Path], List[Note], List[str]]:
    """The tree without the entry's own keys and the keys left to mindformers, msbridge's sections in it,
    notes and problems (mindformers' own rules, ``mindformers_check``)."""
    tree, notes, problems = check_run_yaml(tree, index, label)
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


def on_top(tree: Tree, index: int) -> Tree:
    """The entry's own keys in the highest layer: they win over monitor_config and its config file."""
    prefix, top = ("callbacks", index), _top_seq(tree) + 2
    return Tree(tree.data, {p: replace(o, seq=top) if p[:2] == prefix else o for p, o in tree.origins.items()})


def graft(tree: Tree, index: int, loaded: Tree, prefix: Path) -> Tree:
    """``loaded`` (the entry's ``config:`` file, its settings under ``prefix``) merged under the entry's keys.

    Call after ``on_top``: the file's settings land one layer below the entry's own.
    """
    data = loaded.data
    for key in prefix:
        data = data[key] or {}
    entry = tree.data["callbacks"][index]
    tree.data["callbacks"][index] = deep_merge(data, entry)
    at, seq = ("callbacks", index), _top_seq(tree) - 1
    origins = {at + p[len(prefix):]: replace(o, seq=seq) for p, o in loaded.origins.items()
               if p[:len(prefix)] == prefix and len(p) > len(prefix)}
    origins.update(tree.origins)  # the entry's own keys keep their origins (and win)
    return Tree(tree.data, origins)


def _without(tree: Tree, paths: List[Path]) -> Tree:
    for path in paths:
        node: Any = tree.data
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, Mapping) else node[part] if isinstance(node, list) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    gone = set(paths)
    return Tree(tree.data, {p: o for p, o in tree.origins.items() if not any(p[:len(g)] == g for g in gone)})


#: Where mindformers run YAMLs keep the sequence length (for tokens/s), the first found wins: the model config,
#: the Megatron dataset's config (``BlendedMegatronDatasetDataLoader``), the dataset section.
SEQ_LENGTH_PATHS: Tuple[Path, ...] = (("model", "model_config", "seq_length"),
                                      ("train_dataset", "data_loader", "config", "seq_length"),
                                      ("train_dataset", "data_loader", "seq_length"), ("train_dataset", "seq_length"))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def find_seq_length(data: Mapping[str, Any]) -> Tuple[Optional[int], Optional[Path], str]:
    """The run YAML's sequence length, the path it was found at, and where that is in words ('' for a
    YAML path; ``pretrained_model_dir``'s ``config.json`` otherwise). ``(None, None, "")``: none."""
    for path in SEQ_LENGTH_PATHS:
        node = dig(data, *path)
        if _positive_int(node):
            return node, path, ""
    model_dir = data.get("pretrained_model_dir")
    if isinstance(model_dir, str) and model_dir:
        config = os.path.join(model_dir, "config.json")
        try:
            with open(config, encoding="utf-8") as fh:
                value = json.load(fh).get("seq_length")
        except (OSError, ValueError, AttributeError):
            return None, None, ""
        if _positive_int(value):
            return value, ("pretrained_model_dir",), f" ({config})"
    return None, None, ""

"""From a composed tree to canonical settings: file shape, params, dialects, precedence.

Two file shapes:

- a pure msbridge file: msbridge keys at the top level, the training job's
  hyperparameters under ``params:``;
- a training YAML (mindformers style): msbridge's keys under ``msbridge:`` or,
  if there is none, under ``monitor_config:``; every other top-level section
  (model, optimizer, runner_config, callbacks ...) becomes ``params``, unchecked.

Keys in msbridge's place are checked strictly: each is a setting, a dialect
name (see ``dialects``) or an error. When two keys set one setting, the later
layer wins (with a note); within one layer two different values are an error.

Example:
    >>> values, winners, mapped = canonicalize(Tree({"monitor_config": {"interval": 20}, "model": {}}))
    >>> values["flush_steps"], values["params"]
    (20, {'model': {}})
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..options import did_you_mean
from .dialects import HANDLERS, VOCABULARY
from .keys import TRAINING_SECTIONS, Assignment, Key, Mapped, Note, is_training_yaml, section_of
from .mindformers_entry import find_seq_length
from .settings import FIELD_NAMES
from .yaml_lines import Origin, Path, Tree, format_path

_FLATTENED = ("health", "straggler", "alerts", "tags", "params")


def _leaves(value: Any, path: Path) -> List[Tuple[Path, Any]]:
    """Leaf paths of nested mappings; an empty mapping and any non-mapping are leaves."""
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, path + (k,))]
    return [(path, value)]


class _Canonicalizer:
    def __init__(self, tree: Tree, failed: Set[Path]) -> None:
        self.tree, self.failed = tree, failed
        self.out = Mapped(where=tree.origin_of)

    def origin(self, path: Path) -> Origin:
        return self.tree.origin_of(path) or Origin("<unknown>")

    def assign_leaves(self, target: Path, value: Any, source: Path) -> None:
        for sub, leaf in _leaves(value, ()):
            self.out.assignments.append(Assignment(target + sub, leaf, source + sub, self.origin(source + sub)))

    def section(self, data: Mapping[Any, Any], prefix: Path, name: Any) -> None:
        for key, value in data.items():
            path = prefix + (key,)
            if path in self.failed:
                continue
            if key in FIELD_NAMES:
                self.setting(key, value, path)
            elif key in HANDLERS:
                HANDLERS[key](Key(self.out, path, self.origin(path), data, name), value)
            else:
                self.out.problems.append(f"{self.origin(path)}: {format_path(path)}: unknown key"
                                         f"{did_you_mean(str(key), VOCABULARY) or self._hint(key, prefix)}")

    @staticmethod
    def _hint(key: Any, prefix: Path) -> str:
        if not prefix and key in TRAINING_SECTIONS:
            return ("; training sections belong under 'params:' (or put msbridge's settings "
                    "under 'monitor_config:' or 'msbridge:')")
        return ""

    def setting(self, key: str, value: Any, path: Path) -> None:
        if key == "sinks":
            self.sinks(value, path)
        elif key in _FLATTENED:
            self.assign_leaves((key,), value, path)
        else:
            self.out.assignments.append(Assignment((key,), value, path, self.origin(path)))

    def sinks(self, value: Any, path: Path) -> None:
        """``[names]``, one name, or ``{name: options | true | null | false}``."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            entries = [(name, None, path + (i,)) for i, name in enumerate(value)]
        elif isinstance(value, Mapping):
            entries = [(name, options, path + (name,)) for name, options in value.items()]
        else:
            self.out.assignments.append(Assignment(("sinks",), value, path, self.origin(path)))
            return
        self.out.assignments.append(Assignment(("sinks",), {}, path, self.origin(path)))
        for name, options, where in entries:
            if not isinstance(name, str):
                self.out.problems.append(f"{self.origin(where)}: {format_path(where)}: expected a sink name, "
                                         f"got {name!r}")
            elif options is False and name == "jsonl":
                self.out.problems.append(f"{self.origin(where)}: {format_path(where)}: jsonl cannot be turned "
                                         "off: it is the write-ahead log every other sink is rebuilt from")
            elif options is False:
                self.out.notes.append(Note(self.origin(where), f"{format_path(where)} -> not added (false)"))
            else:
                self.assign_leaves(("sinks", name), {} if options is None or options is True else options, where)

    def training(self, sections: Sequence[Path]) -> None:
        """A training YAML: ``sections`` hold msbridge's keys (later ones win where two set one
        setting); every other top-level section is a training param."""
        data = self.tree.data
        if not sections:
            first = next(iter(data))
            self.out.notes.append(Note(self.origin((first,)), "no monitor_config: or msbridge: section: msbridge "
                                       "uses its defaults, and every section is a training param"))
        tops = {path[0] for path in sections if len(path) == 1}
        shown = " and ".join(format_path(path) + ":" for path in sections) or "monitor_config:"
        for key, value in data.items():
            if key in tops:
                continue
            if key in FIELD_NAMES and key not in ("output_dir", "params"):
                self.out.notes.append(Note(self.origin((key,)), f"{key} -> params.{key}: a top-level key of a "
                                           f"training YAML is a training setting; msbridge reads {shown}",
                                           logging.WARNING))
            if key == "monitor_config":
                self.out.notes.append(Note(self.origin((key,)), "monitor_config -> params.monitor_config "
                                           "(left to mindformers; msbridge reads the msbridge: section)"))
            self.assign_leaves(("params",) if key == "params" else ("params", key), value, (key,))
        for path in sections:
            section: Any = data
            for part in path:
                section = section[part]
            if section is None:
                continue
            if not isinstance(section, Mapping):
                self.out.problems.append(f"{self.origin(path)}: {format_path(path)}: expected a mapping of msbridge "
                                         f"settings, got {section!r}")
            else:
                self.section(section, path, format_path(path))
        self.seq_length_from_model()

    def seq_length_from_model(self) -> None:
        """The run YAML's sequence length (``mindformers_entry.find_seq_length``), or one line that tokens/s is off."""
        if any(a.target == ("seq_length",) for a in self.out.assignments):
            return
        value, path, where = find_seq_length(self.tree.data)
        if value is None:
            if "model" in self.tree.data:
                self.out.notes.append(Note(self.origin(("model",)), "no seq_length in model.model_config, "
                                           "train_dataset or pretrained_model_dir's config.json: tokens/s is off; "
                                           "set seq_length (msbridge's key) to turn it on", logging.WARNING))
            return
        origin = self.origin(path)
        self.out.assignments.append(Assignment(("seq_length",), value, path, origin))
        self.out.notes.append(Note(origin, f"{format_path(path)}{where} -> seq_length: {value} (for tokens/s)"))


def _winners(assignments: List[Assignment], out: Mapped) -> Dict[Path, Assignment]:
    """One assignment per target: the latest layer wins; one layer writing two values is an error."""
    winners: Dict[Path, Assignment] = {}
    for item in assignments:
        old = winners.get(item.target)
        if old is None or (old.value == item.value and type(old.value) is type(item.value)):
            winners[item.target] = item if old is None or item.origin.seq >= old.origin.seq else old
            continue
        first, last = sorted((old, item), key=lambda a: a.origin.seq)
        target = format_path(item.target)
        if first.origin.seq == last.origin.seq:
            out.problems.append(f"{last.origin}: {format_path(last.source)}: conflicts with "
                                f"{format_path(first.source)} ({first.origin}): both set {target} "
                                f"({last.value!r} vs {first.value!r}); keep one")
        else:
            out.notes.append(Note(last.origin, f"{format_path(last.source)} overrides {format_path(first.source)} "
                                  f"({first.origin}) for {target}: {last.value!r}"))
        winners[item.target] = last
    return winners


def _build(winners: Dict[Path, Assignment]) -> Dict[str, Any]:
    values: Dict[str, Any] = {}
    for target in sorted(winners, key=len):
        node: Any = values
        for part in target[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[target[-1]] = winners[target].value
    return values


def canonicalize(tree: Tree, failed: Set[Path] = frozenset(), sections: Optional[Sequence[Path]] = None,
                 ) -> Tuple[Dict[str, Any], Dict[Path, Assignment], Mapped]:
    """Canonical settings (only those the config sets), the assignment behind each, and notes/problems.

    ``sections``: where msbridge's keys are in a training YAML (default: ``msbridge:``, else
    ``monitor_config:``); ``msbridge.mindformers`` passes ``monitor_config`` and its callback entry."""
    work = _Canonicalizer(tree, set(failed))
    if sections is not None:
        work.training(sections)
    elif is_training_yaml(tree.data):
        name = section_of(tree.data)
        work.training([(name,)] if name is not None else [])
    else:
        work.section(tree.data, (), None)
    winners = _winners(work.out.assignments, work.out)
    return _build(winners), winners, work.out

"""Composition: ``base_config:``/``base:`` inheritance, ``---`` documents and ``--set`` overrides.

Layers are applied in this order, each over the result of the ones before:

1. the files named by ``base_config:`` (or ``base:``), a path or a list of paths,
   in the order listed, each itself composed first;
2. the file's first document, then each later ``---`` document;
3. each ``--set key=value``, in the order given (the value typed as YAML).

Mappings deep-merge; any other value (lists too) replaces. A base path is
looked up relative to the including file's directory, then relative to each of
its parent directories (so ``configs/llama2/llama2_7b.yaml`` written from a repo
root also resolves). Every layer gets a higher ``Origin.seq``, so later layers
win wherever two spellings of one setting meet.

Example:
    >>> tree, notes, problems = compose("run.yaml", ["monitor_config.interval=50"])
    >>> tree.data["monitor_config"]["interval"], str(tree.origins[("monitor_config", "interval")])
    (50, '--set')
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..masking import is_secret_key
from ..options import did_you_mean
from .dialects import VOCABULARY
from .keys import Note, is_training_yaml, section_of
from .settings import plain
from .yaml_lines import Origin, Path, Tree, format_path, read_yaml, yaml_value

BASE_KEYS = ("base_config", "base")
#: Base files one chain may nest (mindformers' own go 2-3 deep); past it the chain is refused, named.
MAX_BASE_DEPTH = 50


def deep_merge(base: Mapping[Any, Any], over: Mapping[Any, Any]) -> Dict[Any, Any]:
    """``over`` on top of ``base``: mappings merge key by key, everything else replaces.

    Example:
        >>> deep_merge({"a": {"x": 1, "y": [1]}}, {"a": {"y": [2]}})
        {'a': {'x': 1, 'y': [2]}}
    """
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _replaced(path: Path, base: Any, over: Any) -> bool:
    """Whether merging ``over`` onto ``base`` replaces the value at ``path`` of ``base``."""
    for key in path:
        if not isinstance(over, Mapping) or key not in over:
            return False
        if not (isinstance(base, Mapping) and isinstance(over[key], Mapping)):
            return True
        base, over = base.get(key), over[key]
    return True


def merge_trees(base: Tree, over: Tree) -> Tree:
    """``deep_merge`` of the data, keeping the origin of every value that survives."""
    origins = {p: o for p, o in base.origins.items() if not _replaced(p, base.data, over.data)}
    origins.update(over.origins)
    return Tree(deep_merge(base.data, over.data), origins)


class _Composer:
    def __init__(self) -> None:
        self.seq = 0
        self.problems: List[str] = []

    def stamp(self, tree: Tree) -> Tree:
        self.seq += 1
        return tree.stamped(self.seq)

    def layers(self, docs: List[Tree], where_dir: str, chain: Tuple[str, ...]) -> Tree:
        acc = Tree()
        for index, doc in enumerate(docs):
            found = [k for k in BASE_KEYS if k in doc.data]
            if index > 0 and found:
                self.problems.append(f"{doc.origins[(found[0],)]}: {found[0]}: only the first document "
                                     "may name base files")
            elif len(found) > 1:
                self.problems.append(f"{doc.origins[(found[1],)]}: {found[1]}: use one of "
                                     f"{' or '.join(BASE_KEYS)}, not both")
            for key in found:
                origin = doc.origins[(key,)]
                names = doc.data.pop(key)
                doc.origins = {p: o for p, o in doc.origins.items() if p[0] != key}
                if index == 0:
                    for name in self._base_names(names, key, origin):
                        acc = merge_trees(acc, self.base_file(name, where_dir, key, origin, chain))
            acc = merge_trees(acc, self.stamp(doc))
        return acc

    def _base_names(self, names: Any, key: str, origin: Origin) -> List[str]:
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            self.problems.append(f"{origin}: {key}: expected a file path or a list of file paths, got {names!r}")
            return []
        return names

    def base_file(self, name: str, where_dir: str, key: str, origin: Origin, chain: Tuple[str, ...]) -> Tree:
        path = _find_base(name, where_dir)
        if path is None:
            self.problems.append(f"{origin}: {key}: cannot find {name!r} (looked relative to {where_dir!r} "
                                 "and its parent directories)")
            return Tree()
        return self.file(path, chain, f"{origin}: {key}")

    def file(self, path: str, chain: Tuple[str, ...] = (), included_at: str = "") -> Tree:
        real = os.path.realpath(path)
        shown = _display(path)
        if real in chain:
            names = [_display(p) for p in chain[chain.index(real):]] + [shown]
            self.problems.append(f"{included_at or shown}: base files include each other: {_chain_text(names)}")
            return Tree()
        if len(chain) >= MAX_BASE_DEPTH:
            names = [_display(p) for p in chain] + [shown]
            self.problems.append(f"{included_at or shown}: base files nest deeper than {MAX_BASE_DEPTH} levels: "
                                 f"{_chain_text(names)}; refused")
            return Tree()
        docs, problems = read_yaml(path, shown)
        self.problems.extend(problems)
        return self.layers(docs, os.path.dirname(os.path.abspath(path)), chain + (real,))

    def mapping(self, data: Mapping[str, Any], label: str = "<dict>") -> Tree:
        origin = Origin(label)
        copy = plain(data)
        tree = Tree(copy, {p: origin for p in _paths(copy, ())})
        return self.layers([tree], os.getcwd(), ())


def _paths(value: Any, path: Path) -> List[Path]:
    out: List[Path] = []
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        out.append(path + (key,))
        out.extend(_paths(item, path + (key,)))
    return out


def _find_base(name: str, where_dir: str) -> Optional[str]:
    name = os.path.expanduser(name)
    if os.path.isabs(name):
        return name if os.path.isfile(name) else None
    directory = where_dir
    while True:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def _chain_text(names: List[str], ends: int = 4) -> str:
    """``a -> b -> c``; a long chain as its first and last ``ends`` files around how many were left out.

    Example:
        >>> _chain_text([f"{i}.yaml" for i in range(10)], 2)
        '0.yaml -> 1.yaml -> ... (6 more) -> 8.yaml -> 9.yaml'
    """
    if len(names) <= 2 * ends + 1:
        return " -> ".join(names)
    return " -> ".join(names[:ends] + [f"... ({len(names) - 2 * ends} more)"] + names[-ends:])


def _display(path: str) -> str:
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else rel


def set_path(data: Dict[Any, Any], path: Path, value: Any) -> Optional[str]:
    """Set ``data[a][b]... = value``, creating mappings on the way; a problem text or None.

    Example:
        >>> data = {"a": [{"b": 1}]}
        >>> set_path(data, ("a", 0, "b"), 2), data
        (None, {'a': [{'b': 2}]})
    """
    node: Any = data
    for depth, key in enumerate(path):
        if isinstance(node, list) and not (isinstance(key, int) and key < len(node)):
            return f"{format_path(path[:depth])} is a list of {len(node)} items; {key!r} is not one of its indexes"
        if depth == len(path) - 1:
            node[key] = value
            return None
        nxt = node[key] if isinstance(node, list) else node.get(key)
        if nxt is None:
            nxt = node[key] = {}
        if not isinstance(nxt, (dict, list)):
            held = "a value (not shown)" if any(is_secret_key(k) for k in path[:depth + 1]) else repr(nxt)
            return f"{format_path(path[:depth + 1])} is {held}, not a mapping"
        node = nxt
    return None


def sinks_by_name(tree: Tree, path: Path) -> None:
    """Before ``--set sinks.NAME.option=...`` on ``sinks: [a, NAME]`` (or ``sinks: NAME``): make the list the
    mapping it means, ``{a: {}, NAME: {}}``, keeping each item's origin, so the value lands in NAME's options.

    Example:
        >>> tree = Tree({"sinks": ["jsonl", "mlflow"]})
        >>> sinks_by_name(tree, ("sinks", "mlflow", "tracking_uri")); tree.data
        {'sinks': {'jsonl': {}, 'mlflow': {}}}
    """
    for at in (0, 1):  # sinks at the top, or in the monitor section
        if len(path) <= at + 1 or path[at] != "sinks" or not isinstance(path[at + 1], str):
            continue
        parent = tree.data if at == 0 else tree.data.get(path[0])
        names = parent.get("sinks") if isinstance(parent, dict) else None
        names = [names] if isinstance(names, str) else names
        if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
            continue
        where = path[:at + 1]
        parent["sinks"] = {name: {} for name in names}
        for index, name in enumerate(names):
            if where + (index,) in tree.origins:
                tree.origins[where + (name,)] = tree.origins.pop(where + (index,))


def _override_path(key: str, data: Mapping[str, Any]) -> Tuple[Optional[Path], str]:
    """The tree path a ``--set`` key addresses, plus a note when it was redirected."""
    parts: List[Any] = [int(p) if p.isdigit() else p for p in key.split(".")]
    if not all(str(p) for p in parts):
        return None, "expected a dotted key such as monitor_config.interval"
    section = section_of(data) or ("msbridge" if is_training_yaml(data) else None)
    if section is None or parts[0] in data:
        return tuple(parts), ""
    if parts[0] == "params" and len(parts) > 1:
        return tuple(parts[1:]), f"{key} -> {format_path(tuple(parts[1:]))} (training sections are the params)"
    if parts[0] in VOCABULARY:
        return (section,) + tuple(parts), f"{key} -> {section}.{key}"
    hint = did_you_mean(str(parts[0]), list(VOCABULARY) + [str(k) for k in data])
    return None, f"unknown key{hint or '; add it under params. to set a training value'}"


def apply_overrides(tree: Tree, overrides: Sequence[str], composer: "_Composer") -> Tuple[Tree, List[Note]]:
    """Apply each ``--set key=value`` as its own layer; problems go to ``composer.problems``."""
    notes: List[Note] = []
    for text in overrides:
        key, sep, raw = str(text).partition("=")
        key = key.strip()
        if not sep or not key:
            composer.problems.append(f"--set {text!r}: expected KEY=VALUE, e.g. monitor_config.interval=50")
            continue
        path, note = _override_path(key, tree.data)
        if path is None:
            composer.problems.append(f"--set {key}: {note}")
            continue
        try:
            value = yaml_value(raw, key)
        except ValueError as exc:
            shown = "the value (not shown)" if any(is_secret_key(part) for part in key.split(".")) else \
                f"the value {raw!r}"
            composer.problems.append(f"--set {key}: {shown} is not valid YAML" +
                                     ("" if shown.endswith("(not shown)") else f": {exc}"))
            continue
        sinks_by_name(tree, path)
        problem = set_path(tree.data, path, value)
        if problem:
            composer.problems.append(f"--set {key}: {problem}")
            continue
        composer.seq += 1
        origin = Origin("--set", None, composer.seq)
        tree.origins = {p: o for p, o in tree.origins.items() if p[:len(path)] != path}
        tree.origins[path] = origin
        if note:
            notes.append(Note(origin, note))
    return tree, notes


def compose(source: Union[str, "os.PathLike[str]", Mapping[str, Any], None],
            overrides: Sequence[str] = (), label: str = "<dict>") -> Tuple[Tree, List[Note], List[str]]:
    """The composed tree of ``source`` (a YAML path or a dict, shown as ``label``), with overrides applied.

    Returns the tree, the notes on redirected ``--set`` keys, and every problem found.
    """
    composer = _Composer()
    if source is None:
        tree = Tree()
    elif isinstance(source, Mapping):
        tree = composer.mapping(source, label)
    else:
        tree = composer.file(os.fspath(source))
    tree, notes = apply_overrides(tree, overrides, composer)
    return tree, notes, composer.problems

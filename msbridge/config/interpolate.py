"""``${a.b.c}`` references between config values, across sections.

A value that is exactly one reference (``${monitor_config.per_print_times}``)
takes the referenced value with its type (an int stays an int, a mapping stays
a mapping). A reference inside a longer string is formatted into it (``true``,
``false`` and ``null`` spelled as in YAML). ``$${`` writes a literal ``${``.
List items are addressed by index: ``${callbacks.0.type}``. References are
resolved after composition and ``--set``, so an override moves every value
that refers to it. A missing key and a cycle are problems that show the chain.

Example:
    >>> tree = Tree({"a": {"n": 10}, "b": "${a.n}", "c": "n=${a.n}"})
    >>> resolved, problems, failed, written = interpolate(tree)
    >>> resolved.data["b"], resolved.data["c"]
    (10, 'n=10')
"""
from __future__ import annotations

import copy
import re
from typing import Any, Dict, List, Mapping, Set, Tuple

from ..errors import did_you_mean
from .yaml_lines import Path, Tree, format_path

_REF = re.compile(r"(\$?)\$\{([^${}]*)\}")
_WHOLE = re.compile(r"^\$\{([^${}]*)\}$")


class _Unresolved(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _dotted(path: Path) -> str:
    return ".".join(str(p) for p in path)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


class _Resolver:
    def __init__(self, data: Mapping[Any, Any]) -> None:
        self.data = data
        self.active: Set[str] = set()
        self.done: Dict[str, Any] = {}

    def node(self, value: Any, path: Path, trail: List[str]) -> Any:
        if isinstance(value, Mapping):
            return {k: self.node(v, path + (k,), trail) for k, v in value.items()}
        if isinstance(value, list):
            return [self.node(v, path + (i,), trail) for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            return self.string(value, path, trail)
        return value

    def string(self, value: str, path: Path, trail: List[str]) -> Any:
        key = _dotted(path)
        if key in self.done:
            return copy.deepcopy(self.done[key])
        trail = trail if trail and trail[-1] == key else trail + [key]
        if key in self.active:
            raise _Unresolved(f"reference cycle: {' -> '.join(trail)}")
        self.active.add(key)
        try:
            whole = _WHOLE.match(value)
            if whole:
                result = self.follow(whole.group(1).strip(), trail)
            else:
                result = _REF.sub(lambda m: self.embed(m, trail), value)
        finally:
            self.active.discard(key)
        self.done[key] = result
        return result

    def embed(self, match: "re.Match[str]", trail: List[str]) -> str:
        if match.group(1):
            return "${" + match.group(2) + "}"
        value = self.follow(match.group(2).strip(), trail)
        if isinstance(value, (Mapping, list)):
            raise _Unresolved(f"${{{match.group(2)}}} is a {'mapping' if isinstance(value, Mapping) else 'list'}"
                              " and cannot be part of a string; refer to it as the whole value")
        return _text(value)

    def follow(self, ref: str, trail: List[str]) -> Any:
        node: Any = self.data
        path: Path = ()
        for part in ref.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                key: Any = int(part)
            elif isinstance(node, Mapping) and part in node:
                key = part
            else:
                choices = [str(k) for k in node] if isinstance(node, Mapping) else []
                hint = did_you_mean(part, choices)
                shown = " -> ".join(trail + [ref])
                raise _Unresolved(f"${{{ref}}}: {_dotted(path + (part,))!r} is not defined{hint} ({shown})")
            node, path = node[key], path + (key,)
        return self.node(node, path, trail + [ref])


def interpolate(tree: Tree) -> Tuple[Tree, List[str], Set[Path], Dict[Path, str]]:
    """Resolve every reference in ``tree``.

    Returns the resolved tree; one problem per value that cannot be resolved
    (prefixed with that value's ``file:line``); the paths of those values (they
    keep their unresolved text, and later checks skip them); and the text as
    written of every value that was resolved, by path (for provenance).
    """
    resolver = _Resolver(tree.data)
    problems: List[str] = []
    failed: Set[Path] = set()
    written: Dict[Path, str] = {}

    def walk(value: Any, path: Path) -> Any:
        if isinstance(value, Mapping):
            return {k: walk(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, path + (i,)) for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            try:
                resolved = resolver.string(value, path, [])
                written[path] = value
                return resolved
            except _Unresolved as exc:
                where = tree.origin_of(path)
                problems.append(f"{where}: {format_path(path)}: {exc.message}" if where
                                else f"{format_path(path)}: {exc.message}")
                failed.add(path)
        return value

    return Tree(walk(tree.data, ()), dict(tree.origins)), problems, failed, written

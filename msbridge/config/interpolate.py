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
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from ..masking import MIN_REMEMBERED, is_secret_key, mask_text, remember, secret_paths
from ..options import did_you_mean
from .yaml_lines import MAX_FILE_BYTES, MAX_VALUES, Path, Tree, format_path

_REF = re.compile(r"(\$?)\$\{([^${}]*)\}")
_WHOLE = re.compile(r"^\$\{([^${}]*)\}$")


#: References one config may follow, and what resolving them may produce in all (as a file may hold).
MAX_REFERENCES = 10_000
MAX_RESOLVED_VALUES = MAX_VALUES
MAX_RESOLVED_CHARS = MAX_FILE_BYTES
#: Resolving is recursive, some ten frames per reference in a chain (some through ``re.sub``): a 10,000-link
#: chain runs on a thread of its own with this stack and recursion limit, so it resolves instead of overflowing.
_FRAMES = 12 * MAX_REFERENCES
_STACK_BYTES = 256 << 20


class _Trail:
    """The chain of references being followed, shared by every step of it: pushing is O(1), so a 10,000-link
    chain costs linear memory (a list copied at each link cost 400 MB)."""

    __slots__ = ("last", "parent", "length")

    def __init__(self, last: Optional[str] = None, parent: "Optional[_Trail]" = None) -> None:
        self.last, self.parent = last, parent
        self.length = (parent.length if parent else 0) + (last is not None)

    def push(self, item: str) -> "_Trail":
        return _Trail(item, self)

    def shown(self, limit: int = 8) -> str:
        """``a -> b -> c``; a longer chain keeps its first and last few links."""
        items, node = [], self
        while node is not None and node.last is not None:
            items.append(node.last)
            node = node.parent
        items.reverse()
        if len(items) > limit:
            items = items[:limit // 2] + [f"... {len(items) - limit:,} more ..."] + items[-(limit // 2):]
        return " -> ".join(items)


class _Unresolved(Exception):
    def __init__(self, message: str, root: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.root = root or message  # the first cause, which every value depending on it repeats


class _OverLimit(_Unresolved):
    """Resolving went past a limit: the whole resolution stops (a ``${}`` bomb)."""


def _size(value: Any, values: int, chars: int) -> Tuple[int, int]:
    """Keys and items, and characters, in ``value``; counting stops once past ``values`` or ``chars``."""
    count = length = 0
    todo = [value]
    while todo and count <= values and length <= chars:
        item = todo.pop()
        count += 1
        if isinstance(item, str):
            length += len(item)
        elif isinstance(item, Mapping):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return count, length


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
        self.done: Dict[str, Tuple[Any, Tuple[int, int]]] = {}  # key -> (resolved value, its size)
        self.unresolved: Dict[str, str] = {}  # key -> why it cannot be resolved
        self.references = 0
        self.secrets: List[Tuple[str, Any]] = []  # (reference, value) of each secret-looking key followed
        self.values, self.chars = MAX_RESOLVED_VALUES, MAX_RESOLVED_CHARS  # what resolved values may still add

    def charge(self, size: Tuple[int, int]) -> None:
        self.values, self.chars = self.values - size[0], self.chars - size[1]
        if self.values < 0 or self.chars < 0:
            raise _OverLimit(f"resolving its ${{...}} makes the config larger than {MAX_RESOLVED_VALUES:_} keys "
                             f"and items and {MAX_RESOLVED_CHARS // 2 ** 20} MiB of text (a ${{}} bomb?); refused")

    def node(self, value: Any, path: Path, trail: _Trail) -> Any:
        if isinstance(value, Mapping):
            return {k: self.node(v, path + (k,), trail) for k, v in value.items()}
        if isinstance(value, list):
            return [self.node(v, path + (i,), trail) for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            return self.string(value, path, trail)
        return value

    def string(self, value: str, path: Path, trail: _Trail) -> Any:
        key = _dotted(path)
        if key in self.done:
            result, size = self.done[key]
            self.charge(size)  # before the copy is made
            return copy.deepcopy(result)
        trail = trail if trail.last == key else trail.push(key)
        if key in self.active:
            raise _Unresolved(f"reference cycle: {trail.shown()}")
        if key in self.unresolved:  # said once, where it was first met: each value of a chain is followed once
            raise _Unresolved(f"${{{key}}} cannot be resolved: {self.unresolved[key]}", self.unresolved[key])
        self.active.add(key)
        try:
            whole = _WHOLE.match(value)
            if whole:
                result = self.follow(whole.group(1).strip(), trail)
            else:
                _check_braces(value)
                result = _REF.sub(lambda m: self.embed(m, trail), value)
        except _OverLimit:
            raise
        except _Unresolved as exc:
            self.unresolved.setdefault(key, exc.root)
            raise
        finally:
            self.active.discard(key)
        size = _size(result, self.values, self.chars)
        self.charge(size)
        self.done[key] = (result, size)
        return result

    def embed(self, match: "re.Match[str]", trail: _Trail) -> str:
        if match.group(1):
            return "${" + match.group(2) + "}"
        value = self.follow(match.group(2).strip(), trail)
        if isinstance(value, (Mapping, list)):
            raise _Unresolved(f"${{{match.group(2)}}} is a {'mapping' if isinstance(value, Mapping) else 'list'}"
                              " and cannot be part of a string; refer to it as the whole value")
        return _text(value)

    def follow(self, ref: str, trail: _Trail) -> Any:
        self.references += 1
        if self.references > MAX_REFERENCES:
            raise _OverLimit(f"more than {MAX_REFERENCES:_} ${{...}} references to follow; refused")
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
                shown = trail.push(ref).shown()
                raise _Unresolved(f"${{{ref}}}: {_dotted(path + (part,))!r} is not defined{hint} ({shown})")
            node, path = node[key], path + (key,)
        if any(is_secret_key(part) for part in path if isinstance(part, str)):
            self.secrets.append((ref, node))
        return self.node(node, path, trail.push(ref))


def _check_braces(value: str) -> None:
    """Refuse a ``${`` that no ``}`` closes (``'lr=${params.lr'``) or one nested in another."""
    rest = _REF.sub("", value).replace("$${", "")
    if "${" in rest:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise _Unresolved(f"{shown!r} has a ${{ that no }} closes (or one ${{...}} inside another); write "
                          "${key.path}, or $${ for a literal ${")


def _check_secrets(path: Path, resolved: Any, secrets: List[Tuple[str, Any]]) -> None:
    """Refuse a value under a key that does not look secret which now shows a secret it referred to
    (``run_name: r-${params.api_key}``): masking goes by key names, so it would be written unmasked."""
    if not secrets or any(is_secret_key(part) for part in path if isinstance(part, str)) \
            or isinstance(resolved, (Mapping, list)):
        return
    shown = mask_text(_text(resolved), by_value=False)  # what masking by shape leaves of it
    for ref, secret in secrets:
        if not isinstance(secret, (Mapping, list)) and _text(secret) and _text(secret) in shown:
            raise _Unresolved(f"${{{ref}}} puts a secret into a setting whose name does not look like one, so it "
                              "would be written unmasked (a run name becomes directory names, file headers and "
                              "tracker runs); remove the reference")


def interpolate(tree: Tree) -> Tuple[Tree, List[str], Set[Path], Dict[Path, str]]:
    """Resolve every reference in ``tree``.

    Returns the resolved tree; one problem per value that cannot be resolved
    (prefixed with that value's ``file:line``); the paths of those values (they
    keep their unresolved text, and later checks skip them); and the text as
    written of every value that was resolved, by path (for provenance).
    """
    outcome: List[Any] = []

    def run() -> None:
        try:
            outcome.append(_interpolate(tree))
        except BaseException as exc:  # raised again on the caller's thread
            outcome.append(exc)

    limit, stack = sys.getrecursionlimit(), threading.stack_size()
    sys.setrecursionlimit(max(limit, _FRAMES + limit))
    try:
        threading.stack_size(_STACK_BYTES)
        worker = threading.Thread(target=run, name="msbridge-interpolate", daemon=True)
        worker.start()
    finally:
        threading.stack_size(stack)
    try:
        worker.join()
    finally:
        sys.setrecursionlimit(limit)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _interpolate(tree: Tree) -> Tuple[Tree, List[str], Set[Path], Dict[Path, str]]:
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
                resolver.secrets = []
                resolved = resolver.string(value, path, _Trail())
                _check_secrets(path, resolved, resolver.secrets)
                written[path] = value
                return resolved
            except _OverLimit as exc:
                exc.message = _where(tree, path) + exc.message  # the value whose resolving went over
                raise
            except _Unresolved as exc:
                where = tree.origin_of(path)
                problems.append(f"{where}: {format_path(path)}: {exc.message}" if where
                                else f"{format_path(path)}: {exc.message}")
                failed.add(path)
        return value

    try:
        resolved = walk(tree.data, ())
        problems += _names_holding_secrets(tree, resolved)
        return Tree(resolved, dict(tree.origins)), problems, failed, written
    except _OverLimit as exc:  # nothing is resolved: every value with a reference is skipped by later checks
        return tree, [exc.message], set(_referring(tree.data)), {}


#: Settings that become directory names, file headers and tracker run names: they may not hold a secret.
NAME_KEYS = frozenset({"run_name", "experiment", "experiment_name", "output_dir"})


def _names_holding_secrets(tree: Tree, data: Any) -> List[str]:
    """Remember every secret of ``data`` (masked by value from now on, wherever it was copied), and a problem
    for each name setting that holds one (``run_name: *k`` where ``api_key: &k ...``): a name is not masked."""
    found = secret_paths(data)
    for _, secret in found:
        remember(secret)
    texts = [(path, str(v)) for path, v in found if not isinstance(v, (Mapping, list))]
    problems: List[str] = []
    for path, name in _name_settings(data, ()):
        held = next((p for p, t in texts if t == name or len(t) >= MIN_REMEMBERED and t in name), None)
        if held is not None:
            problems.append(f"{_where(tree, path)}holds the value of {format_path(held)}, a secret (a YAML alias or "
                            "a copy of it); a name is written unmasked into directory names, file headers and "
                            "trackers: give it a name of its own")
    return problems


def _name_settings(value: Any, path: Path) -> List[Tuple[Path, str]]:
    """``(path, text)`` of every string setting named like ``NAME_KEYS``, at any depth."""
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    out: List[Tuple[Path, str]] = []
    for key, item in items:
        if isinstance(item, str) and key in NAME_KEYS:
            out.append((path + (key,), item))
        elif isinstance(item, (Mapping, list)):
            out.extend(_name_settings(item, path + (key,)))
    return out


def _referring(value: Any, path: Path = ()) -> List[Path]:
    """The path of every string in ``value`` that holds a ``${``."""
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _referring(v, path + (k,))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _referring(v, path + (i,))]
    return [path] if isinstance(value, str) and "${" in value else []


def _where(tree: Tree, path: Path) -> str:
    where = tree.origin_of(path)
    return (f"{where}: " if where else "") + f"{format_path(path)}: "

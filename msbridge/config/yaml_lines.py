"""YAML text -> plain data plus where every key came from (file and line).

PyYAML's ``safe_load`` forgets line numbers; this module composes the node
graph instead and records, for every mapping key and list item, the ``Origin``
(file, line) it was written at. It also reports what ``safe_load`` silently
accepts: a key written twice in one mapping. Floats such as ``1e-4`` load as
floats (YAML 1.2), not as strings as plain PyYAML does.

Example:
    >>> docs, problems = parse_yaml("a:\\n  b: 1e-4\\n", "run.yaml")
    >>> docs[0].data, str(docs[0].origins[("a", "b")])
    ({'a': {'b': 0.0001}}, 'run.yaml:2')
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

import yaml

Path = Tuple[Any, ...]


@dataclass(frozen=True)
class Origin:
    """Where a value was written: ``file:line``, ``--set``, or ``<dict>``.

    ``seq`` orders layers: a value from a later layer (a later ``---`` document,
    an including file, a ``--set``) has a higher ``seq`` and wins.

    Example:
        >>> str(Origin("run.yaml", 4))
        'run.yaml:4'
    """

    file: str
    line: Optional[int] = None
    seq: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


@dataclass
class Tree:
    """Plain config data and the origin of every key path in it.

    Example:
        >>> Tree({"a": 1}, {("a",): Origin("x.yaml", 1)}).origin_of(("a",))
        Origin(file='x.yaml', line=1, seq=0)
    """

    data: Dict[Any, Any] = field(default_factory=dict)
    origins: Dict[Path, Origin] = field(default_factory=dict)

    def origin_of(self, path: Path) -> Optional[Origin]:
        """The origin of ``path`` or of its nearest ancestor that has one."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.origins:
                return self.origins[path[:end]]
        return None

    def stamped(self, seq: int) -> "Tree":
        """The same tree with every origin moved to layer ``seq``."""
        return Tree(self.data, {p: replace(o, seq=seq) for p, o in self.origins.items()})


def format_path(path: Path) -> str:
    """``("a", "b", 1, "c")`` -> ``"a.b[1].c"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-4`` as a float, as YAML 1.2 does."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Walker:
    """Turns one composed document into a Tree, collecting problems."""

    def __init__(self, loader: _Loader, filename: str) -> None:
        self.loader = loader
        self.filename = filename
        self.origins: Dict[Path, Origin] = {}
        self.problems: List[str] = []
        self._stack: set = set()

    def where(self, node: yaml.Node) -> str:
        return f"{self.filename}:{node.start_mark.line + 1}"

    def value(self, node: yaml.Node, path: Path) -> Any:
        if id(node) in self._stack:
            self.problems.append(f"{self.where(node)}: {format_path(path)}: an alias refers to itself")
            return None
        self._stack.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                out = []
                for i, item in enumerate(node.value):
                    self.origins[path + (i,)] = Origin(self.filename, item.start_mark.line + 1)
                    out.append(self.value(item, path + (i,)))
                return out
            return self.loader.construct_object(node, deep=True)
        finally:
            self._stack.discard(id(node))

    def mapping(self, node: yaml.MappingNode, path: Path) -> Dict[Any, Any]:
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                self.problems.append(f"{self.filename}:{line}: {format_path(path + (key,))}: key written twice "
                                     f"(first at line {seen[key]}); YAML would silently keep only the last")
            seen.setdefault(key, line)
        self.loader.flatten_mapping(node)
        out: Dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.loader.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):
                self.problems.append(f"{self.where(key_node)}: {format_path(path)}: a key must be a scalar")
                continue
            self.origins[path + (key,)] = Origin(self.filename, key_node.start_mark.line + 1)
            out[key] = self.value(value_node, path + (key,))
        return out


def parse_yaml(text: str, filename: str) -> Tuple[List[Tree], List[str]]:
    """Every ``---`` document of ``text`` as a Tree, plus the problems found.

    A syntax error ends parsing (the documents before it are kept); a document
    whose top level is not a mapping is a problem and is dropped.
    """
    loader = _Loader(text)
    docs: List[Tree] = []
    problems: List[str] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            walker = _Walker(loader, filename)
            data = walker.value(node, ()) if node is not None else {}
            problems.extend(walker.problems)
            if data is None:
                data = {}
            if not isinstance(data, dict):
                problems.append(f"{walker.where(node)}: the top level must be a mapping of keys, "
                                f"got {type(data).__name__} {data!r}")
                continue
            docs.append(Tree(data, walker.origins))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problems.append(f"{filename}{line}: YAML syntax error: {exc.problem or exc.context}")
    finally:
        loader.dispose()
    return docs, problems


def yaml_value(text: str) -> Any:
    """A ``--set`` value typed as YAML types it (``5`` -> 5, ``true`` -> True, ``[a, b]`` -> list).

    Raises:
        ValueError: the text is not valid YAML.
    """
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).replace("\n", " ")) from None

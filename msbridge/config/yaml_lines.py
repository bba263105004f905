"""YAML text -> plain data plus where every key came from (file and line).

PyYAML's ``safe_load`` forgets line numbers; this module composes the node
graph instead and records, for every mapping key and list item, the ``Origin``
(file, line) it was written at. It also reports what ``safe_load`` silently
accepts: a key written twice in one mapping. Floats such as ``1e-4`` load as
floats (YAML 1.2), not as strings as plain PyYAML does.

A file is loaded within limits, so a broken or hostile one is a problem with
its file and line, never a hang or a traceback: ``MAX_FILE_BYTES``, UTF-8 text,
``MAX_DEPTH`` levels of nesting and ``MAX_VALUES`` keys and items, counted while
composing (a huge file stops at its limit) and again once aliases and merge keys
are expanded (an alias bomb stops there in milliseconds); plain data tags only
(``!!python/...``, ``!Ref`` are refused unread) and integers of at most
``limits.MAX_INT_DIGITS`` digits. libyaml (C) makes the parse events when PyYAML
has it; composing, where the limits are counted, is PyYAML's own.

Example:
    >>> docs, problems = parse_yaml("a:\\n  b: 1e-4\\n", "run.yaml")
    >>> docs[0].data, str(docs[0].origins[("a", "b")])
    ({'a': {'b': 0.0001}}, 'run.yaml:2')
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

import yaml

from ..limits import MAX_INT_DIGITS, huge_int_problem, int_digits, is_huge_int
from ..masking import is_secret_key

Path = Tuple[Any, ...]

#: A config file larger than this is refused unread: msbridge and training YAMLs are kilobytes.
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Levels of nested mappings and lists one document may have.
MAX_DEPTH = 100
#: Keys and list items one document may hold once its aliases and merge keys are expanded.
MAX_VALUES = 100_000
_BOM = b"\xef\xbb\xbf"


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
        part = {True: "on", False: "off"}.get(part, part) if isinstance(part, bool) else part  # YAML 1.1 `on:`
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class LimitError(yaml.MarkedYAMLError):
    """A document over one of the loader's limits (nesting, expanded size)."""


try:  # libyaml's parser (C) makes the events; composing stays in Python, where the limits are counted
    from yaml._yaml import CParser as _Parser
except ImportError:  # PyYAML built without libyaml: its own parser, about three times slower
    _Parser = None


class _Loader(yaml.composer.Composer, *((_Parser,) if _Parser else (yaml.reader.Reader, yaml.scanner.Scanner,
              yaml.parser.Parser)), yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """A safe loader that reads ``1e-4`` as a float, as YAML 1.2 does, and composes at most ``MAX_DEPTH``
    levels and ``MAX_VALUES`` nodes (counted as they are composed, so a huge file stops there)."""

    def __init__(self, stream: Any) -> None:
        if _Parser:
            _Parser.__init__(self, stream)
        else:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._depth = 0
        self._nodes = 0

    def compose_document(self) -> Any:
        self._nodes = 0  # the limit is per document
        return super().compose_document()

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise LimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            if self._nodes > MAX_VALUES:  # counted while composing: a huge file stops here, not after
                raise LimitError(None, None, f"more than {MAX_VALUES} keys and items", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.yaml_constructors = dict(yaml.SafeLoader.yaml_constructors)
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
_STD = "tag:yaml.org,2002:"
#: The only tags msbridge reads: plain data. Any other (``!!python/...``, ``!Ref``) is refused.
_SCALAR_TAGS = frozenset(_STD + t for t in ("null", "bool", "int", "float", "binary", "timestamp", "str"))
_INT_TAG = _STD + "int"
_NUMBER_TAGS = (_INT_TAG, _STD + "float")
#: Keys whose value is an id or a name: a plain scalar keeps the text as written (``82e33229``, ``0012``, ``12e3``),
#: never read as a number (mindformers' PyYAML reads ``82e33229`` as a string, and ``0012`` as 10).
TEXT_KEYS = frozenset({"sweep_id", "run_name", "experiment", "study"})
#: Characters an integer scalar may have before it is refused unconstructed (its digits are checked after).
_MAX_INT_TEXT = 4 * MAX_INT_DIGITS
_INVALID = object()  # a scalar its tag could not construct (already reported)


class _Walker:
    """Turns one composed document into a Tree, collecting problems."""

    def __init__(self, loader: _Loader, filename: str) -> None:
        self.loader = loader
        self.filename = filename
        self.origins: Dict[Path, Origin] = {}
        self.problems: List[str] = []
        self._stack: set = set()
        self._keys: Dict[int, Any] = {}

    def where(self, node: yaml.Node) -> str:
        return f"{self.filename}:{node.start_mark.line + 1}"

    def value(self, node: yaml.Node, path: Path) -> Any:
        if id(node) in self._stack:
            self.problems.append(f"{self.where(node)}: {format_path(path)}: an alias refers to itself")
            return None
        self._stack.add(id(node))
        try:
            if not isinstance(node, yaml.ScalarNode) and not self.allowed(node, path):
                return _INVALID
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                out = []
                for i, item in enumerate(node.value):
                    self.origins[path + (i,)] = Origin(self.filename, item.start_mark.line + 1)
                    value = self.value(item, path + (i,))
                    out.append(None if value is _INVALID else value)
                return out
            return self.construct(node, path)
        finally:
            self._stack.discard(id(node))

    def allowed(self, node: yaml.Node, path: Path) -> bool:
        """Whether ``node``'s tag is plain data; an unknown tag is a problem (its value is not read)."""
        tags = _SCALAR_TAGS if isinstance(node, yaml.ScalarNode) else \
            {_STD + "seq"} if isinstance(node, yaml.SequenceNode) else {_STD + "map"}
        if node.tag in tags:
            return True
        tag = node.tag.replace(_STD, "!!")
        self.problems.append(f"{self.where(node)}: {format_path(path) or 'value'}: the YAML tag {tag!r} is not "
                             "allowed; a config holds plain data (mappings, lists, strings, numbers, true/false, "
                             "null, dates)")
        return False

    def construct(self, node: yaml.Node, path: Path) -> Any:
        """The scalar's value; one its tag cannot hold (``!!int x``, ``2024-02-30``) is a problem and ``_INVALID``."""
        if not self.allowed(node, path):
            return _INVALID
        if path and path[-1] in TEXT_KEYS and _number_as_written(self.loader, node):
            return node.value
        if node.tag == _INT_TAG and len(node.value) > _MAX_INT_TEXT:
            self.problems.append(f"{self.where(node)}: {format_path(path) or 'value'}: "
                                 f"{huge_int_problem(len(node.value))}")
            return _INVALID
        try:
            value = self.loader.construct_object(node, deep=True)
            if is_huge_int(value):
                self.problems.append(f"{self.where(node)}: {format_path(path) or 'value'}: "
                                     f"{huge_int_problem(int_digits(value))}")
                return _INVALID
            return value
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            self.loader.recursive_objects.pop(node, None)
            reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            said = f"{node.value!r} is not a valid {tag}: {reason}"
            if any(is_secret_key(k) for k in path):  # a secret's value, and the reason quoting it, stay unprinted
                said = f"the value (not shown) is not a valid {tag}"
            self.problems.append(f"{self.where(node)}: {format_path(path) or 'value'}: {said}")
            return _INVALID

    def key(self, node: yaml.Node, path: Path) -> Any:
        """The key's value, constructed once per node; ``_INVALID`` for a key that cannot be one (reported once)."""
        if id(node) not in self._keys:
            if isinstance(node, yaml.ScalarNode):
                self._keys[id(node)] = self.construct(node, path)
            else:
                self.problems.append(f"{self.where(node)}: {format_path(path) or 'top level'}: a key must be a scalar")
                self._keys[id(node)] = _INVALID
        return self._keys[id(node)]

    def mapping(self, node: yaml.MappingNode, path: Path) -> Dict[Any, Any]:
        seen: Dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.key(key_node, path)
            line = key_node.start_mark.line + 1
            if key is _INVALID:
                continue
            if key in seen:
                self.problems.append(f"{self.filename}:{line}: {format_path(path + (key,))}: key written twice "
                                     f"(first at line {seen[key]}); YAML would silently keep only the last")
            seen.setdefault(key, line)
        self.loader.flatten_mapping(node)
        out: Dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            if key is _INVALID:
                continue
            value = self.value(value_node, path + (key,))
            if value is not _INVALID:  # reported already; the setting keeps its default
                self.origins[path + (key,)] = Origin(self.filename, key_node.start_mark.line + 1)
                out[key] = value
        return out


def read_yaml(path: str, shown: str) -> Tuple[List[Tree], List[str]]:
    """Every ``---`` document of the YAML file at ``path`` (named ``shown`` in problems), plus the problems.

    The file must be a regular file of at most ``MAX_FILE_BYTES`` of UTF-8 text.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return [], [f"{shown}: not a regular file"]
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return [], [f"{shown}: cannot read the config file: {exc.strerror or exc}"]
    if len(data) > MAX_FILE_BYTES:
        return [], [f"{shown}: larger than {MAX_FILE_BYTES // 2 ** 20} MiB; a config file is kilobytes "
                    "(is this the right file?)"]
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        offset = exc.start + (len(_BOM) if data.startswith(_BOM) else 0)
        line = data[:offset].count(b"\n") + 1
        return [], [f"{shown}:{line}: not UTF-8 text (byte {offset} is 0x{data[offset]:02x}); save the file as UTF-8"]
    return parse_yaml(text, shown)


def check_size(node: yaml.Node) -> None:
    """Raise ``LimitError`` if ``node``, its aliases (and merge keys) followed, holds more than ``MAX_VALUES``
    keys and items or ``MAX_DEPTH`` levels. Linear in the composed graph: each shared node is measured once."""
    measured: Dict[int, Tuple[int, int]] = {}  # node -> (values, levels below it)
    inside: set = set()

    def deeper(mark: Any) -> LimitError:
        return LimitError(None, None, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded", mark)

    def measure(node: yaml.Node, depth: int) -> Tuple[int, int]:
        if id(node) in inside:
            return 1, 0  # an alias inside its own anchor: the walker reports it
        if id(node) not in measured:
            if depth > MAX_DEPTH:
                raise deeper(node.start_mark)
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else []
            inside.add(id(node))
            size, height = 1, 0
            for child in children:
                values, levels = measure(child, depth + 1)
                size, height = size + values, max(height, levels + 1)
                if size > MAX_VALUES:
                    raise LimitError(None, None, f"more than {MAX_VALUES} keys and items once aliases are expanded "
                                     "(an alias bomb?)", node.start_mark)
            inside.discard(id(node))
            measured[id(node)] = (size, height)
        size, height = measured[id(node)]
        if depth + height > MAX_DEPTH:
            raise deeper(node.start_mark)
        return size, height

    measure(node, 0)


def _shape(data: Any) -> str:
    """What a value is, never what it holds: a refused file's content (a token file, /etc/passwd) stays unprinted.

    Example:
        >>> _shape("root:x:0:0"), _shape([1, 2])
        ('a str of 10 characters', 'a list of 2 items')
    """
    if isinstance(data, (str, bytes, list, tuple)):
        unit = "character" if isinstance(data, (str, bytes)) else "item"
        return f"a {type(data).__name__} of {len(data)} {unit}{'' if len(data) == 1 else 's'}"
    return f"a {type(data).__name__}"


def parse_yaml(text: str, filename: str) -> Tuple[List[Tree], List[str]]:
    """Every ``---`` document of ``text`` as a Tree, plus the problems found.

    A syntax error or a limit ends parsing (the documents before it are kept); a
    document whose top level is not a mapping is a problem and is dropped.
    """
    docs: List[Tree] = []
    problems: List[str] = []
    loader: Optional[_Loader] = None
    try:
        loader = _Loader(text)
        while loader.check_node():
            node = loader.get_node()
            check_size(node)
            walker = _Walker(loader, filename)
            data = walker.value(node, ()) if node is not None else {}
            problems.extend(walker.problems)
            if data is None or data is _INVALID:
                data = {}
            if not isinstance(data, dict):
                problems.append(f"{walker.where(node)}: the top level must be a mapping of keys, "
                                f"got {_shape(data)} (not shown: is this the right file?)")
                continue
            docs.append(Tree(data, walker.origins))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        if isinstance(exc, LimitError):
            problems.append(f"{filename}{line}: {exc.problem}; refused")
        elif "maximum nesting depth" in str(exc.problem):  # libyaml's own bound (1000), met before ours
            problems.append(f"{filename}{line}: nested deeper than {MAX_DEPTH} levels; refused")
        else:
            problems.append(f"{filename}{line}: YAML syntax error: {exc.problem or exc.context}")
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, other controls)
        line = text[:exc.position].count("\n") + 1
        problems.append(f"{filename}:{line}: YAML does not allow the character {chr(exc.character)!r} "
                        f"(character {exc.position} of the file)")
    finally:
        if loader is not None:
            loader.dispose()
    return docs, problems


def _number_as_written(loader: _Loader, node: yaml.Node) -> bool:
    """A plain scalar that YAML read as a number by its look alone (no quotes, no ``!!int`` tag)."""
    return (isinstance(node, yaml.ScalarNode) and node.tag in _NUMBER_TAGS and not node.style
            and loader.resolve(yaml.ScalarNode, node.value, (True, False)) == node.tag)


def yaml_value(text: str, key: str = "") -> Any:
    """A ``--set`` value typed as YAML types it (``5`` -> 5, ``true`` -> True, ``[a, b]`` -> list),
    within the limits of a file; the value of an id or a name (``TEXT_KEYS``, the last part of ``key``) keeps the
    text as written.

    Example:
        >>> yaml_value("0012"), yaml_value("0012", key="sweep_id")
        (10, '0012')

    Raises:
        ValueError: the text is not valid YAML, or is over a limit.
    """
    loader: Optional[_Loader] = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        check_size(node)
        if key.rsplit(".", 1)[-1] in TEXT_KEYS and _number_as_written(loader, node):
            return node.value
        return loader.construct_document(node)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        reason = exc.problem if isinstance(exc, LimitError) else str(exc)
        raise ValueError(reason.replace("\n", " ")) from None
    finally:
        if loader is not None:
            loader.dispose()

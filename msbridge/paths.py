"""Where a run writes: the run name and output dir templates, rendered safely.

``run_name`` may reference config values (``tiny-lm-lr{optimizer.learning_rate}``,
looked up in the training params first, then in msbridge's own settings) and
``{timestamp}``. ``output_dir`` may use ``{experiment}``, ``{run_name}``,
``{rank}`` and ``{timestamp}``. Names are reduced to one safe path component,
so a run name can never escape the output directory, and two different names
never share a directory (``safe_component``).

Example:
    >>> render_template("lm-lr{optimizer.lr}", {"optimizer": {"lr": 0.001}})
    'lm-lr0.001'
"""
from __future__ import annotations

import hashlib
import os
import re
import time
import unicodedata
from typing import Any, Mapping, Optional

from .errors import ConfigError

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.\-]*)\}")
_SAFE_ASCII = re.compile(r"[A-Za-z0-9._+=@,-]")
#: UTF-8 bytes of a name's readable part (file systems allow 255 per component; the hash adds 9).
MAX_COMPONENT_BYTES = 120


def timestamp(now: Optional[float] = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))


def lookup(path: str, *scopes: Mapping[str, Any]) -> Any:
    """``a.b.c`` in the first scope that has it; KeyError otherwise."""
    for scope in scopes:
        node: Any = scope
        for part in path.split("."):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                break
        else:
            return node
    raise KeyError(path)


def render_template(template: str, *scopes: Mapping[str, Any], what: str = "run_name") -> str:
    """Fill ``{dotted.key}`` fields from the scopes; an unknown key is a ConfigError."""

    def fill(match: "re.Match[str]") -> str:
        try:
            return str(lookup(match.group(1), *scopes))
        except KeyError:
            raise ConfigError(f"{what}: {template!r} references {{{match.group(1)}}}, "
                              "which is not a config value") from None

    return _FIELD.sub(fill, template)


def safe_component(name: str) -> str:
    """One path component for ``name``, readable, and distinct for distinct names.

    Kept: ASCII letters, digits and ``._+=@,-``, and any other letter, digit or mark
    (``run-ü``, ``实验一``), NFC-normalised. Separators, spaces, controls, NUL,
    invisible format characters and other symbols become ``_``; leading and
    trailing ``.``/``_`` go (never ``.``, ``..`` or a hidden name); the name is cut
    to ``MAX_COMPONENT_BYTES`` of UTF-8. Whenever anything was replaced, dropped,
    normalised or cut, ``-`` and 8 hex digits of the original's SHA-1 follow, so
    two names that clean to the same text still get two directories.

    Example:
        >>> safe_component("tiny-lm-lr0.001"), safe_component("run-ü")
        ('tiny-lm-lr0.001', 'run-ü')
        >>> safe_component("../etc/passwd")
        'etc_passwd-e96c47ea'
    """
    text = unicodedata.normalize("NFC", str(name))
    cleaned = "".join(ch if _keep(ch) else "\0" for ch in text)
    cleaned = re.sub("\0+", "_", cleaned).strip("._")
    readable = cleaned.encode("utf-8")[:MAX_COMPONENT_BYTES].decode("utf-8", "ignore").rstrip("._")
    if readable and readable == name:
        return readable
    digest = hashlib.sha1(str(name).encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{readable or 'run'}-{digest}"


def _keep(ch: str) -> bool:
    if ch.isascii():
        return bool(_SAFE_ASCII.match(ch))
    return unicodedata.category(ch)[0] in "LNM"


def render_output_dir(template: str, experiment: str, run_name: str, rank: int, stamp: str) -> str:
    """The absolute run directory. Placeholder values are single safe components."""
    values = {"experiment": safe_component(experiment), "run_name": safe_component(run_name),
              "rank": str(rank), "timestamp": stamp}
    try:
        path = template.format(**values)
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"output_dir: unknown placeholder {exc} in {template!r}; "
                          "use {experiment}, {run_name}, {rank} or {timestamp}") from None
    return os.path.abspath(os.path.expanduser(path))

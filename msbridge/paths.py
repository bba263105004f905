"""Where a run writes: the run name and output dir templates, rendered safely.

``run_name`` may reference config values (``tiny-lm-lr{optimizer.learning_rate}``,
looked up in the training params first, then in msbridge's own settings) and
``{timestamp}``. ``output_dir`` may use ``{experiment}``, ``{run_name}``,
``{rank}`` and ``{timestamp}``. Names are reduced to one safe path component,
so a run name can never escape the output directory.

Example:
    >>> render_template("lm-lr{optimizer.lr}", {"optimizer": {"lr": 0.001}})
    'lm-lr0.001'
"""
from __future__ import annotations

import os
import re
import time
from typing import Any, Mapping, Optional

from .errors import ConfigError

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.\-]*)\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@,-]+")


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
    """One path component: separators and other unsafe characters become '_', never '.' or '..'."""
    cleaned = _UNSAFE.sub("_", name).strip("._") or "run"
    return cleaned[:200]


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

"""Where a run writes: the run name, output dir and experiment dir templates, rendered safely.

``run_name`` may reference config values (``tiny-lm-lr{optimizer.learning_rate}``,
looked up in the training params first, then in msbridge's own settings) and
``{timestamp}``. ``output_dir`` may use ``{experiment}``, ``{run_name}``,
``{rank}``, ``{timestamp}`` and, as its first component, ``{experiment_dir}``.
Names are reduced to one safe path component, so a run name can never escape
the output directory, and two different names never share a directory
(``safe_component``).

The experiment dir holds the stores an experiment's runs share (MLflow's
``mlflow.db`` and ``mlartifacts/``, TensorBoard's ``tensorboard/``, MindInsight's
``summary/``). It is the ``experiment_dir`` setting; when that is not set, it is
``./msbridge_runs/{experiment}`` for an ``output_dir`` that starts with
``{experiment_dir}`` (the default), else the leading part of ``output_dir``
before its first per-run component: never a directory the user did not name.

Example:
    >>> render_template("lm-lr{optimizer.lr}", {"optimizer": {"lr": 0.001}})
    'lm-lr0.001'
    >>> experiment_dir_template(None, "/data/{experiment}/{run_name}")
    '/data/{experiment}'
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import sys
import time
import unicodedata
from typing import Any, List, Mapping, Optional

from .errors import ConfigError
from .masking import is_secret_key, mask_text

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.\-]*)\}")
_SAFE_ASCII = re.compile(r"[A-Za-z0-9._+=@,-]")
#: UTF-8 bytes of a name's readable part (file systems allow 255 per component; the hash adds 9).
MAX_COMPONENT_BYTES = 120


def timestamp(now: Optional[float] = None) -> str:
    """``now`` (default: the current time) as local ``YYYYmmdd-HHMMSS``, the stamp in default run names.

    Example:
        >>> stamp = timestamp()  # e.g. '20261201-143108'
        >>> len(stamp), stamp[8], stamp.replace("-", "").isdigit()
        (15, '-', True)
    """
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
    """Fill ``{dotted.key}`` fields from the scopes; an unknown key, or one that names a secret
    (``{api_key}``: the name becomes a directory, a header and a tracker's run name), is a ConfigError."""
    secret = next((m.group(1) for m in _FIELD.finditer(template)
                   if any(is_secret_key(part) for part in m.group(1).split("."))), None)
    if secret is not None:
        raise ConfigError(f"{what}: {template!r} references {{{secret}}}, which looks like a secret; a name is "
                          "written unmasked into directory names, file headers and trackers, so it may not hold one")

    def fill(match: "re.Match[str]") -> str:
        try:
            value = str(lookup(match.group(1), *scopes))
        except KeyError:
            raise ConfigError(f"{what}: {template!r} references {{{match.group(1)}}}, "
                              "which is not a config value") from None
        if mask_text(value) != value:  # a secret's value copied under another key (a YAML alias), or credentials
            raise ConfigError(f"{what}: {template!r} references {{{match.group(1)}}}, which holds a secret (a copy "
                              "of a secret-looking key's value, or credentials); a name is written unmasked into "
                              "directory names, file headers and trackers, so it may not hold one")
        return value

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


def render_output_dir(template: str, experiment: str, run_name: str, rank: int, stamp: str,
                      experiment_dir: Optional[str] = None) -> str:
    """The absolute run directory. Placeholder values are single safe components (``experiment_dir``: a path)."""
    values = {"experiment": safe_component(experiment), "run_name": safe_component(run_name),
              "rank": str(rank), "timestamp": stamp}
    if experiment_dir is not None:
        values["experiment_dir"] = experiment_dir.rstrip("/") or "/"
    try:
        path = template.format(**values)
    except (KeyError, IndexError) as exc:
        raise ConfigError(f"output_dir: unknown placeholder {exc} in {template!r}; "
                          f"use {', '.join('{' + k + '}' for k in values)}") from None
    return os.path.abspath(os.path.expanduser(path))


#: The experiment dir when neither ``experiment_dir`` nor a placed ``output_dir`` says otherwise.
DEFAULT_EXPERIMENT_DIR = "./msbridge_runs/{experiment}"
#: Placeholders that make an output_dir component per run (the experiment dir stops before them).
PER_RUN = ("{run_name}", "{rank}", "{timestamp}")


def experiment_dir_template(experiment_dir: Optional[str], output_dir: str) -> str:
    """The experiment dir template: ``experiment_dir`` if set, else derived from ``output_dir`` (see above)."""
    if experiment_dir:
        return experiment_dir
    if output_dir.startswith("{experiment_dir}"):
        return DEFAULT_EXPERIMENT_DIR
    parts = output_dir.split("/")
    for index, part in enumerate(parts):
        if any(field in part for field in PER_RUN):
            return "/".join(parts[:index]) or ("/" if output_dir.startswith("/") else ".")
    return output_dir


def render_experiment_dir(template: str, experiment: str) -> str:
    """The absolute experiment dir; ``{experiment}`` is its only placeholder."""
    try:
        path = template.format(experiment=safe_component(experiment))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"experiment_dir: {template!r} is not a valid template ({exc}); "
                          "its only placeholder is {experiment}") from None
    return os.path.abspath(os.path.expanduser(path))


def recorded_experiment_dir(meta: Mapping[str, Any], run_dir: str) -> str:
    """The experiment dir a run's ``run.json`` (``meta``) names, for the run dir now at ``run_dir``.

    A run dir moved with its experiment dir around it keeps that relation; a run from before
    ``experiment_dir`` was recorded had its stores in the run dir's parent.
    """
    run_dir = os.path.abspath(run_dir)
    recorded, was = meta.get("experiment_dir"), meta.get("run_dir")
    if not recorded:
        return os.path.dirname(run_dir.rstrip("/"))
    if was and (was.rstrip("/") + "/").startswith(recorded.rstrip("/") + "/"):
        return os.path.normpath(os.path.join(run_dir, os.path.relpath(recorded, was)))
    return recorded


def free_space(path: str) -> str:
    """The space left on ``path``'s file system, as ``"1.5 MB"`` (``"unknown"`` if it cannot be read)."""
    try:
        free = float(shutil.disk_usage(path).free)
    except OSError:
        return "unknown"
    units, i = ("bytes", "kB", "MB", "GB", "TB"), 0
    while free >= 1000 and i < len(units) - 1:
        free, i = free / 1000, i + 1
    return f"{free:.0f} bytes" if i == 0 else f"{free:.1f} {units[i]}"


def msbridge_command() -> str:
    """This msbridge as a command any shell runs as it is: the ``msbridge`` script of this Python's
    environment (absolute, so no venv needs activating), else ``python -m msbridge.cli.main``."""
    script = os.path.join(os.path.dirname(sys.executable), "msbridge")
    if os.access(script, os.X_OK):
        return shlex.quote(script)
    return f"{shlex.quote(sys.executable)} -m msbridge.cli.main"


def view_commands(run_dir: str, sinks: Mapping[str, Mapping[str, str]]) -> List[str]:
    """The exact commands to look at this run, runnable as printed from any directory; viewers bind 127.0.0.1."""
    from .adapters._tracker_facts import VIEWED_SINKS

    exe, run = msbridge_command(), shlex.quote(run_dir)
    commands = [f"{exe} view {run}"] if any(name in sinks for name in VIEWED_SINKS) else []
    if importlib.util.find_spec("matplotlib") is not None:
        commands.append(f"{exe} plot {run}")
    commands.append(f"{exe} diagnose {run}")
    return [mask_text(c) for c in commands]

"""What the rest of msbridge knows about the built-in trackers, without importing one: which URIs MLflow reads a
tracking store from (``tracking_uri_problem``, the ``tracking_uri`` option's check, so ``config check`` validates
it with no MLflow import), which sinks ``msbridge view`` starts a viewer for (``VIEWED_SINKS``), and how many
params a tracker's own view of them takes (``tracker_params``).

A URI is refused here when MLflow, or the first write to its store, would refuse it later: an unknown scheme, an
http(s)/database URI with no host, a port outside 1-65535 or a control character (CR/LF), a sqlite store whose
directory cannot be created and written (``sqlite:////proc/mlflow.db``) or whose existing file this MLflow cannot use
(``mlflow_tracker.store.local.store_problem``: an older or newer schema, not a database ...), and MLflow's filesystem store
(``file:``, or a path), which MLflow 3 refuses unless ``MLFLOW_ALLOW_FILE_STORE=true``.

Example:
    >>> tracking_uri_problem("sqlite:///runs/mlflow.db") is None
    True
    >>> tracking_uri_problem("http://127.0.0.1:99999")
    "'http://127.0.0.1:99999': port 99999 is not one of 1-65535"
"""
from __future__ import annotations

import logging
import os
import re
import urllib.parse
from typing import Any, Dict, Mapping, Optional, Tuple

from msbridge.config.directories import path_problem, writable_problem
from msbridge.addresses import address_problem
from msbridge.options import did_you_mean

#: The URI schemes MLflow 3 reads a tracking store from (``postgresql+psycopg2`` counts as ``postgresql``);
#: a plugin adds its own through the ``mlflow.tracking_store`` entry point.
MLFLOW_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks",
                  "databricks-uc", "uc")
#: Schemes of a store on a server: a host is needed, and a port, when given, must be a port.
_NETWORK_SCHEMES = ("http", "https", "postgresql", "mysql", "mssql")
#: The sinks ``msbridge view`` starts a viewer for.
VIEWED_SINKS = ("mlflow", "tensorboard", "mindinsight")


def tracking_uri_problem(uri: Any) -> Optional[str]:
    """What is wrong with ``uri`` as an MLflow tracking URI, or None: it must have a scheme MLflow accepts and be
    usable (see above), or be a path (one with a ``/``, or one word without spaces) that can be written."""
    if not isinstance(uri, str) or not uri:
        return None  # the Option's type check speaks for it
    control = re.search(r"[\x00-\x1f\x7f]", uri)
    if control:
        return f"the URI holds the control character {control.group()!r} at position {control.start()}"
    scheme, sep, rest = uri.partition(":")
    if not sep or "/" in scheme or len(scheme) == 1:  # no scheme (a one-letter one would be a drive)
        if "/" in uri or uri.startswith(("~", ".")) or not re.search(r"\s", uri):
            return _file_store_problem(uri) or _store_dir_problem(uri, uri)
        return (f"{uri!r} is neither a URI (such as http://127.0.0.1:5000 or sqlite:///mlflow.db) nor a path "
                "(a path with spaces needs a /)")
    base = scheme.split("+", 1)[0].lower()
    if base in _NETWORK_SCHEMES:
        problem = address_problem(uri)
        if problem == "names no host" and base in ("http", "https"):
            return f"{uri!r} names no host; write {base}://HOST:PORT"
        return f"{uri!r}: {problem}" if problem else None
    if base == "sqlite":
        path = _sqlite_file(rest)
        return _store_dir_problem(uri, os.path.dirname(path) or ".") or _sqlite_store_problem(path)
    if base == "file":
        return _file_store_problem(uri) or _store_dir_problem(uri, urllib.parse.urlsplit(uri).path)
    if base in MLFLOW_SCHEMES or base in _plugin_schemes():
        return None
    return (f"scheme {scheme!r} is not one MLflow reads ({', '.join(MLFLOW_SCHEMES)}, or a path)"
            f"{did_you_mean(base, MLFLOW_SCHEMES)}")


def _sqlite_file(rest: str) -> str:
    """The database file of ``sqlite:`` + ``rest``: ``///a.db`` is relative, ``////a/b.db`` absolute."""
    path = rest[3:] if rest.startswith("///") else rest.lstrip("/")
    return path.split("?", 1)[0]


def _store_dir_problem(uri: str, directory: str) -> Optional[str]:
    """Why the store directory of ``uri`` cannot be made and written, or None (not checked while a template)."""
    if "{" in directory or not directory or directory == ":memory:":
        return None
    problem = path_problem(directory) or writable_problem(directory)
    return f"{uri!r}: {problem}" if problem else None


def _sqlite_store_problem(path: str) -> Optional[str]:
    """Why this MLflow cannot use the existing sqlite store file ``path`` (``store_problem``), or None."""
    if "{" in path or not path or path == ":memory:":
        return None
    from msbridge.adapters.mlflow_tracker.store.local import store_problem

    return store_problem(os.path.abspath(path)) or None


def _file_store_problem(uri: str) -> Optional[str]:
    """MLflow 3 refuses its filesystem store unless ``MLFLOW_ALLOW_FILE_STORE`` opts in: said in its words."""
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("true", "1"):
        return None
    return (f"{uri!r} is MLflow's filesystem store; MLflow 3 says: \"The filesystem tracking backend (e.g., "
            "'./mlruns') is in maintenance mode and will not receive further updates. Please migrate to a database "
            "backend (e.g., 'sqlite:///mlflow.db')\". Remove tracking_uri (msbridge's default is "
            "sqlite:///<experiment dir>/mlflow.db) or write tracking_uri: sqlite:///mlflow.db; to keep the filesystem "
            "store, set MLFLOW_ALLOW_FILE_STORE=true as MLflow says")


def _plugin_schemes() -> Tuple[str, ...]:
    from importlib.metadata import entry_points
    try:
        return tuple(ep.name for ep in entry_points(group="mlflow.tracking_store"))
    except Exception:  # a broken distribution's metadata: the built-in schemes still hold
        return ()


#: Params a tracker's own view of them takes (TensorBoard's HParams, MindInsight's lineage): past this, the first
#: ones in the config's order; run.json and the jsonl header hold them all. Measured on this project's 2-vCPU VM
#: (2026-12-04): 100,000 params took 26 s (TensorBoard) and 23 s (MindInsight) to encode with the pure-Python
#: protobuf that MindSpore installs, past either sink's close bound.
TRACKER_PARAMS = 1000


def tracker_params(flat: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """``flat`` cut to its first ``TRACKER_PARAMS`` keys, said once (``where``: the sink's view).

    Example:
        >>> len(tracker_params({f"p{i}": i for i in range(5000)}, "TensorBoard's HParams"))
        1000
    """
    if len(flat) <= TRACKER_PARAMS:
        return dict(flat)
    logging.getLogger("msbridge").warning(
        "msbridge: %d params; %s takes the first %d (run.json holds every one)", len(flat), where, TRACKER_PARAMS)
    return dict(list(flat.items())[:TRACKER_PARAMS])

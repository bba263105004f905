"""What an MLflow run holds besides metrics: names MLflow accepts, params, tags, the description, times.

MLflow's limits (``mlflow/utils/validation.py``): a key of at most 250 characters of
``[/\\w.\\- :]``, a param value of 6000 characters, a tag value of 8000. A name MLflow would
reject is cleaned (``clean_key``) and ends with 8 hex digits of the name's hash, so two names never
become one (``acc@1`` and ``acc_1`` were one metric with two values a step); the sink says each
mapping once. A value too long is logged as ``sha256:<hex>`` of itself, except the run's description
(the README), which is cut at a line.

Example:
    >>> clean_key("loss (train)"), clean_key("acc@1"), clean_key("acc_1")
    ('loss _train_-dbbf7c64', 'acc_1-71dfc155', 'acc_1')
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Dict, Mapping, Optional

from msbridge.masking import mask_secrets, mask_text
from msbridge.sinks.base import RunInfo, flatten, json_safe

RUN_ID_TAG = "msbridge.run_id"
NOTE_TAG = "mlflow.note.content"  # the run page's description
#: MLflow's "Machine learning" experiment kind, as its UI's kind selector writes it.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 8000
MAX_KEY_LENGTH = 250
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def clean_key(key: str) -> str:
    """A name MLflow accepts: bad characters become ``_``, path-like parts are fixed; a name that changed, or
    one over 250 characters (cut), ends with ``-`` and 8 hex digits of the original's hash, so two different
    names never clean to one."""
    name = _BAD_KEY_CHARS.sub("_", str(key))
    name = "/".join("__" if p == ".." else p for p in name.split("/") if p not in ("", ".")) or "_"
    if name != key or len(name) > MAX_KEY_LENGTH:
        name = name[:MAX_KEY_LENGTH - 9].rstrip("/") + "-" + hashlib.sha256(str(key).encode()).hexdigest()[:8]
    return name


def as_params(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, str]:
    """Dot keys with string values, as MLflow stores params; a list or empty mapping stays one JSON value."""
    return {k: json.dumps(json_safe(v), default=str) if isinstance(v, (Mapping, list, tuple)) else str(v)
            for k, v in flatten(tree, prefix).items()}


def epoch_ms(seconds: float) -> Optional[int]:
    """Epoch seconds as MLflow's milliseconds; None (MLflow takes now) when unknown."""
    return int(round(seconds * 1000)) if seconds > 0 else None


def fit(value: str, limit: int) -> str:
    """A value MLflow stores whole, or ``sha256:<hex>`` of one that is too long."""
    return value if len(value) <= limit else "sha256:" + hashlib.sha256(value.encode()).hexdigest()


def clean_keys(items: Mapping[str, str], renamed: Dict[str, str]) -> Dict[str, str]:
    """``items`` under valid MLflow names; every renamed key is added to ``renamed``."""
    out: Dict[str, str] = {}
    for key, value in items.items():
        new = clean_key(key)
        if new != key and (new in items or new in out):  # two names clean to one: keep them apart
            new = clean_key(new[:MAX_KEY_LENGTH - 9] + "-" + hashlib.sha256(key.encode()).hexdigest()[:8])
        if new != key:
            renamed[key] = new
        out[new] = value
    return out


def run_note(readme: str) -> str:
    """The run README as the run's description: masked, cut at a line to fit MLflow's tag limit."""
    text = mask_text(readme)
    if len(text) <= MAX_TAG_LENGTH:
        return text
    tail = "\n\n(cut here: the whole README is the run's artifact README.md)\n"
    head = text[:MAX_TAG_LENGTH - len(tail)]
    return head[:head.rfind("\n") + 1 or len(head)] + tail


def run_params(run: RunInfo) -> Dict[str, str]:
    """The job's hyperparameters with dot keys, plus msbridge's own settings under ``msbridge.``."""
    config = dict(run.config)
    own = {k: v for k, v in config.items() if k not in ("params", "tags")}
    return mask_secrets({**as_params(config.get("params") or {}), **as_params(own, "msbridge.")})


def run_tags(run: RunInfo) -> Dict[str, str]:
    """Versions, host, world size, git commit, sweep id, the config's tags and the job's run id."""
    meta = run.metadata
    versions = meta.get("versions") or {}
    git = meta.get("git") or {}
    tags = {f"{name}.version": versions.get(name) for name in ("msbridge", "mindspore", "mindformers", "python")}
    tags.update({"msbridge.world_size": run.world_size, "msbridge.host": meta.get("host"),
                 "mlflow.source.name": meta.get("command"), "mlflow.source.git.commit": git.get("commit"),
                 "msbridge.git_dirty": git.get("dirty"), "msbridge.sweep_id": run.config.get("sweep_id"),
                 **dict(run.config.get("tags") or {}), RUN_ID_TAG: run.run_id})
    return {k: str(v) for k, v in mask_secrets(tags).items() if v is not None}

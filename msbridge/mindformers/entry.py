"""The ``Config`` of one ``MSBridgeMonitor`` entry in a mindformers run YAML.

mindformers hands a third-party callback the keys of its own ``callbacks:``
entry and nothing else. So that ``monitor_config`` (``step_interval``,
``dump_path``, the global-norm keys ...) is written once and read by both,
``entry_config`` looks for the run YAML the entry came from: the file of the
``mindformers.Trainer`` being built (``Trainer(args="run.yaml")``; the pynative
``mindformers.pynative.trainer.Trainer(config="run.yaml")``), else a
``--config FILE`` argument (``run_mindformer.py``), else the Trainer's loaded
config (no line numbers). The entry is found in its ``callbacks:`` list by its
keys, so every message names the file, the line and ``callbacks[i]``; what
is read from where is ``msbridge.config.mindformers_entry``'s. Every other top-level
section (model, optimizer, runner_config ...) is logged as a training param.

Example:
    >>> cfg = entry_config({"experiment": "tiny-llama", "sinks": ["jsonl"], "flush_steps": 10})
    >>> cfg.flush_steps
    10
"""
from __future__ import annotations

import inspect
import os
import sys
from typing import Any, Dict, List, Mapping, Tuple, Union

from ..config.compose import compose, plain
from ..config.load import Config, build_config, log_notes
from ..config.mindformers_entry import ENTRY_NAME, find_entry

Located = Tuple[Union[str, Dict[str, Any]], str]  # the source holding the entry, and its label


def entry_config(entry: Mapping[str, Any], name: str = ENTRY_NAME) -> Config:
    """The validated ``Config`` for the callback entry whose keys (``type`` aside) are ``entry``."""
    entry = plain(entry)
    source, label = _locate(entry, name)
    return log_notes(build_config(source, entry=entry, name=name, label=label))


def _locate(entry: Dict[str, Any], name: str) -> Located:
    """The run YAML (or mindformers' loaded config) that holds ``entry`` in its ``callbacks``."""
    trainer, given = _building_trainer()
    for path in _candidate_files(given):
        if find_entry(compose(path)[0].data, entry, name) is not None:
            return path, path
    loaded = getattr(trainer, "config", None)
    if hasattr(loaded, "to_dict") and not isinstance(loaded, Mapping):  # the pynative Trainer's TrainConfig
        loaded = loaded.to_dict()
    if isinstance(loaded, Mapping):
        data = plain(loaded)
        if find_entry(data, entry, name) is not None:
            return data, "<mindformers config>"
    return {"callbacks": [dict(entry, type=name)]}, f"<callbacks entry {name}>"


def _building_trainer() -> Tuple[Any, Any]:
    """The mindformers Trainer on the call stack (it is building its callbacks), if any, and the run
    config it was given: the graph-mode Trainer keeps it as ``args``; the pynative one
    (``mindformers.pynative``, 1.9 on) only in its ``__init__``'s ``config`` argument."""
    from mindformers import Trainer

    kinds: Tuple[type, ...] = (Trainer,)
    pynative = sys.modules.get("mindformers.pynative.trainer.trainer")  # imported when that Trainer is used
    if pynative is not None:
        kinds += (pynative.Trainer,)
    trainer, given = None, None
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, kinds) and (trainer is None or candidate is trainer):
            trainer = candidate
            if not isinstance(given, str):
                given = getattr(candidate, "args", None) if isinstance(candidate, Trainer) else \
                    frame.f_locals.get("config")
        frame = frame.f_back
    return trainer, given


def _candidate_files(given: Any) -> List[str]:
    files = []
    if isinstance(given, str):
        files.append(given)
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            files.append(argv[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return [f for f in dict.fromkeys(files) if f.endswith((".yaml", ".yml")) and os.path.isfile(f)]



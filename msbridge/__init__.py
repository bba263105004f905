"""msbridge: one monitor callback for MindSpore training, one metric stream, pluggable sinks.

Importing msbridge imports MindSpore lazily and never imports mlflow,
tensorboardX, mindformers or a sink adapter (``msbridge.adapters.*`` is imported
when a configured sink's class is looked up).

Example:
    >>> from msbridge import BridgeMonitor
    >>> model.train(3, dataset, callbacks=[BridgeMonitor.from_yaml("monitor.yaml")])
"""
from __future__ import annotations

import logging
import os
from typing import Any

# MindSpore's generated *_pb2 modules need the pure-Python protobuf runtime, and MindSpore selects
# it when it is imported. A tracker (mlflow, tensorboardX) imported first would lock in the C
# runtime and break `import mindspore`. Choosing it here too keeps any import order working.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

from .config.load import Config, load_config
from .errors import ConfigError, MissingDependencyError, MsbridgeError
from .masking import MaskingFilter
from .sinks.base import Event, Record, RunInfo, Sink

__version__ = "0.1.0"

# Every line msbridge logs has URI credentials and secret query parameters masked.
logging.getLogger("msbridge").addFilter(MaskingFilter())

__all__ = [
    "BridgeMonitor", "TrainStep", "attach_ring", "Config", "ConfigError", "Event", "MissingDependencyError", "MsbridgeError",
    "Record", "RunInfo", "Sink", "TrackedRun", "load_config", "track", "__version__",
]


_LAZY = {"BridgeMonitor": "callback", "TrainStep": "capture.train_step", "attach_ring": "capture.ring_cell",
         "track": "functional", "TrackedRun": "functional"}


def __getattr__(name: str) -> Any:
    # These build on MindSpore classes: import MindSpore only when one is asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'msbridge' has no attribute {name!r}")

"""msbridge inside MindSpore Transformers: one ``callbacks:`` entry in a mindformers run YAML.

Importing this module checks for mindformers (a missing one raises
``MissingDependencyError`` with ``pip install 'msbridge[mindformers]'``; a version
outside the tested range warns) and registers ``MSBridgeMonitor`` as a mindformers
CALLBACK and ``MSBridgeRing`` (msbridge's device ring buffer around any train
cell, for ``runner_wrapper:``) as a WRAPPER, idempotently (see ``registration``), and makes
mindformers' pipeline / gradient-accumulation wrapper reset keep ``MSBridgeRing`` (``pipeline``).

Two ways to make mindformers see it:

- import it before the Trainer is built (``import msbridge.mindformers``);
- mindformers' own ``auto_register``, with nothing imported by hand::

      export REGISTER_PATH=$(python -c "import msbridge.mindformers as m; print(m.REGISTER_PATH)")
      callbacks:
        - type: MSBridgeMonitor
          auto_register: msbridge_monitor.MSBridgeMonitor

Example (run YAML):
    callbacks:
      - type: MFLossMonitor
      - type: MSBridgeMonitor
        experiment: tiny-llama
        sinks: [jsonl, tensorboard, mlflow]
        # or put msbridge's settings in their own file:  config: msbridge.yaml
"""
from __future__ import annotations

from .registration import REGISTER_PATH, TESTED_VERSIONS, register, require_mindformers

require_mindformers()

from .monitor import MSBridgeMonitor  # noqa: E402  (needs mindformers, checked just above)
from .pipeline import keep_ring_through_reset  # noqa: E402
from .ring_wrapper import MSBridgeRing  # noqa: E402

register(MSBridgeMonitor)
register(MSBridgeRing, kind="wrapper")
keep_ring_through_reset()  # mindformers' pipeline / gradient-accumulation reset keeps MSBridgeRing (pipeline.py)

__all__ = ["MSBridgeMonitor", "MSBridgeRing", "REGISTER_PATH", "TESTED_VERSIONS", "register"]

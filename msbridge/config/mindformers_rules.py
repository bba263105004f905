"""mindformers' own rules for a run YAML, read from the installed mindformers without importing it.

``msbridge config check run.yaml`` (and ``MSBridgeMonitor`` before training) applies them to a run YAML
with a ``- type: MSBridgeMonitor`` entry, so that every ``monitor_config`` the check accepts, mindformers
accepts too:

- ``monitor_config`` keys: those of mindformers' ``MonitorConfig`` (``tools/register/template.py``), which
  raises ``KeyError: "The config 'monitor_config' gets an unexpected key: ..."`` for any other;
- ``*_format`` values: those TrainingStateMonitor's ``_check_attr_formats`` allows
  (``core/callback/callback.py``; ``'tensorboard'`` and ``'log'`` in 1.6 to 1.9);
- the arguments of the train cell ``runner_wrapper: {type: MSBridgeRing, wrapper: ...}`` builds
  (``wrapper/wrapper.py``), since mindformers' cells swallow unknown ones in ``**kwargs``;
- when mindformers' ``_reset_wrapper`` replaces ``runner_wrapper`` with ``MFPipelineWithLossScaleCell``
  (``pipeline_stage > 1``, or ``gradient_accumulation_steps > 1`` in semi-auto/auto parallel mode).

The source files are parsed (``ast``), not imported: importing mindformers writes ``./output/log``. Without
mindformers installed, the 1.9.0 values below are used.

Example:
    >>> sorted(monitor_keys())[:3]
    ['check_for_global_norm', 'device_local_loss_format', 'device_local_norm_format']
    >>> format_values()
    ('log', 'tensorboard')
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from .keys import dig

#: mindformers 1.9.0's ``MonitorConfig`` keys and ``*_format`` values, used when mindformers is not installed.
MONITOR_KEYS_1_9 = ("monitor_on", "dump_path", "target", "invert", "step_interval", "local_loss_format",
                    "local_norm_format", "device_local_norm_format", "device_local_loss_format",
                    "optimizer_state_format", "weight_state_format", "max_attention_logit_format",
                    "throughput_baseline", "print_struct", "check_for_global_norm", "global_norm_spike_threshold",
                    "global_norm_spike_count_threshold", "stable_rank_config", "health_checkpoint")
FORMATS_1_9 = ("log", "tensorboard")
#: ``MSBridgeRing``'s own keys; every other key goes to the cell named by ``wrapper``.
RING_KEYS = ("type", "wrapper", "ring_size", "auto_register")
#: What mindformers' Trainer passes to every wrapper itself (``create_model_wrapper``, ``_reset_wrapper``).
TRAINER_ARGS = ("network", "optimizer", "parallel_config", "calculate_per_token_loss", "global_norm_spike_threshold",
                "print_separate_loss", "use_skip_data_by_global_norm", "lr_scheduler", "grouped_lr_scheduler",
                "micro_batch_num")
_SEMI_AUTO = (1, 2, "semi_auto_parallel", "auto_parallel")


def _source(relative: str, package: str = "mindformers") -> Optional[ast.Module]:
    """The parsed source of ``<package>/<relative>``, or None (not installed, unreadable)."""
    try:
        spec = importlib.util.find_spec(package)  # finds the package without running it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], relative)
    try:
        with open(path, encoding="utf-8") as fh:
            return ast.parse(fh.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def _class(tree: Optional[ast.Module], name: str) -> Optional[ast.ClassDef]:
    if tree is None:
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)


@functools.lru_cache(maxsize=None)
def monitor_keys() -> Tuple[str, ...]:
    """The keys the installed mindformers' ``MonitorConfig`` accepts under ``monitor_config``."""
    node = _class(_source(os.path.join("tools", "register", "template.py")), "MonitorConfig")
    if node is None:
        return MONITOR_KEYS_1_9
    keys = tuple(t.id for item in node.body if isinstance(item, ast.Assign) for t in item.targets
                 if isinstance(t, ast.Name) and not t.id.startswith("_"))
    return keys or MONITOR_KEYS_1_9


@functools.lru_cache(maxsize=None)
def format_values() -> Tuple[str, ...]:
    """The ``*_format`` values the installed mindformers' TrainingStateMonitor accepts."""
    node = _class(_source(os.path.join("core", "callback", "callback.py")), "TrainingStateMonitor")
    for item in ast.walk(node) if node is not None else ():
        if isinstance(item, ast.FunctionDef) and item.name == "_check_attr_formats":
            for found in ast.walk(item):
                if isinstance(found, ast.Set) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                      for e in found.elts):
                    return tuple(sorted(e.value for e in found.elts))
    return FORMATS_1_9


#: Where the train cells a ``runner_wrapper`` names are defined: mindformers' and MindSpore's own.
CELL_SOURCES = (("mindformers", os.path.join("wrapper", "wrapper.py")),
                ("mindspore", os.path.join("nn", "wrap", "cell_wrapper.py")),
                ("mindspore", os.path.join("nn", "wrap", "loss_scale.py")))


@functools.lru_cache(maxsize=None)
def cell_arguments(wrapper: str) -> Optional[Tuple[str, ...]]:
    """The named ``__init__`` arguments of mindformers' or MindSpore's train cell ``wrapper`` (None: another
    cell, such as a user's own)."""
    for package, relative in CELL_SOURCES:
        node = _class(_source(relative, package), wrapper)
        init = next((i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == "__init__"), None) \
            if node is not None else None
        if init is not None:
            args = init.args
            return tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg != "self")
    return None



def _int(value: Any, default: int = 1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def wrapper_reset(data: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """What mindformers' ``_check_global_batch_size_for_auto_parallel`` / ``_reset_wrapper`` will do to
    ``runner_wrapper``, from the run YAML alone: None when it keeps it, else ``{"why": ..., "path": ...,
    "micro_batch_num": n}`` (the key that triggers it, and the micro batches the pipeline cell sums)."""
    if not isinstance(data.get("runner_wrapper"), Mapping):
        return None
    mode = dig(data, "parallel", "parallel_mode")
    if mode not in _SEMI_AUTO or data.get("use_parallel") is False:
        return None  # data parallel or stand-alone: mindformers sets pipeline_stage to 1 and keeps the wrapper
    stages = _int(dig(data, "parallel_config", "pipeline_stage"))
    accumulate = _int(dig(data, "runner_config", "gradient_accumulation_steps"))
    if stages > 1:
        return {"why": f"pipeline_stage: {stages}", "path": ("parallel_config", "pipeline_stage"),
                "micro_batch_num": _int(dig(data, "parallel_config", "micro_batch_num")), "stages": stages}
    if accumulate > 1:
        return {"why": f"gradient_accumulation_steps: {accumulate} in semi-auto/auto parallel mode",
                "path": ("runner_config", "gradient_accumulation_steps"), "micro_batch_num": accumulate,
                "stages": 1}
    return None


def _positive_int(value: Any) -> bool:  # mindformers' _is_positive_natural_number (a bool passes it)
    return isinstance(value, int) and value > 0


#: The values TrainingStateMonitor's constructor refuses (``__init__``, ``_init_config``,
#: ``_init_stable_rank_config``, ``_init_global_norm_monitor_config`` in 1.9.0): key -> (what a valid value is,
#: the test it passes, the error mindformers raises, the oldest supported version whose constructor checks it:
#: msbridge applies 1.9's rules on 1.6 too, and says so). Keys under ``stable_rank_config`` are dotted; a missing
#: key takes mindformers' default, which passes.
VALUE_RULES: Dict[str, Tuple[str, Any, str, str]] = {
    "step_interval": ("a positive integer", _positive_int, "TypeError: The value of 'monitor_config.step_interval' "
                                                           "should be positive integer", "1.9"),
    "global_norm_spike_count_threshold": ("a positive integer", _positive_int, "TypeError: 'monitor_config."
                                          "global_norm_spike_count_threshold' should be positive integer", "1.9"),
    "target": ("a non-empty list of strings, or null", lambda v: not v or (isinstance(v, list) and all(
        isinstance(i, str) for i in v)), "TypeError: The value of 'target' should be a list of str", "1.6"),
    "invert": ("true, false or null", lambda v: v is None or isinstance(v, bool),
               "TypeError: The value of 'invert' should be bool", "1.6"),
    "print_struct": ("true, false or null", lambda v: v is None or isinstance(v, bool),
                     "TypeError: The value of 'print_struct' should be bool", "1.6"),
    "throughput_baseline": ("null or a number > 0", lambda v: v is None or (isinstance(v, (int, float)) and v > 0),
                            "ValueError: The value of 'throughput_baseline' should be None or positive number", "1.6"),
    "stable_rank_config.step_interval": ("a positive integer", _positive_int, "TypeError: 'monitor_config."
                                         "stable_rank_config.step_interval' should be positive integer", "1.9"),
    "stable_rank_config.power_iteration_num": ("a positive integer", _positive_int, "TypeError: 'monitor_config."
                                               "stable_rank_config.power_iteration_num' should be positive integer",
                                               "1.9"),
}

"""A mindformers run YAML with a ``MSBridgeMonitor`` entry, checked by mindformers' rules and meanings.

``check_run_yaml`` runs before msbridge reads the run YAML's ``monitor_config`` (``mindformers_entry``):

- a key mindformers refuses under ``monitor_config`` (``mindformers_rules.monitor_keys``) is a problem; an
  msbridge setting there (``interval``, ``nan_check``, ``sinks`` ...) is told to move into the entry;
- a ``*_format`` value TrainingStateMonitor refuses (``mlflow``, ``jsonl`` ...) is a problem;
- mindformers' keys keep mindformers' meaning: ``step_interval`` thins TrainingStateMonitor only
  (MFLossMonitor, and msbridge, record every step); ``check_for_global_norm: False`` (its default) turns
  mindformers' check off, not msbridge's; ``dump_path`` is where mindformers' TensorDump files go, not
  msbridge's run dir. Those keys are left to mindformers, with one line each;
- ``runner_wrapper: {type: MSBridgeRing}`` options are checked, and when mindformers will replace the
  wrapper (pipeline, gradient accumulation) one line says so and what msbridge does then.

Example:
    >>> tree, notes, problems = check_run_yaml(tree, index=1, label="run.yaml")
    >>> problems
    ["run.yaml:9: monitor_config.interval: mindformers 1.9.0 refuses this key ...; move it into ..."]
"""
from __future__ import annotations

import logging
from importlib import metadata
from typing import Any, List, Mapping, Tuple

from ..names import PIPELINE_CELL
from ..options import did_you_mean
from ..sinks.registry import builtin_names
from .dialects import HANDLERS
from .keys import Note
from .mindformers_rules import (
    RING_KEYS,
    TRAINER_ARGS,
    VALUE_RULES,
    cell_arguments,
    format_values,
    monitor_keys,
    wrapper_reset,
)
from .settings import FIELD_NAMES
from .yaml_lines import Origin, Path, Tree

RING_NAME = "MSBridgeRing"
_ONLY_MINDFORMERS = {
    "step_interval": lambda v: f"left to mindformers: TrainingStateMonitor writes every {v} steps; MFLossMonitor "
                               "logs every step and so does msbridge (write step_interval in the MSBridgeMonitor "
                               "entry to thin msbridge's records)",
    "dump_path": lambda v: (f"left to mindformers: its TensorDump files (local_norm_format, device_local_norm_format)"
                            f" go to {v!r}/rank_N; msbridge's run files stay under output_dir") if v else
                           "left to mindformers (empty: it inserts no TensorDump); msbridge's run files stay under "
                           "output_dir",
}

#: mindformers' spike keys while its check is off (``check_for_global_norm`` not true, its default).
_SPIKE_KEYS = {
    "check_for_global_norm": "false: mindformers' own spike check (TREError) stays off; msbridge's grad-norm spike "
                             "check keeps its own setting (health.grad_norm_spike)",
    "global_norm_spike_threshold": "left to mindformers: with check_for_global_norm off it serves only "
                                   "use_skip_data_by_global_norm; msbridge's grad-norm spike check keeps its own limit",
    "global_norm_spike_count_threshold": "left to mindformers: with check_for_global_norm off msbridge's grad-norm "
                                         "spike check keeps its own count",
}


def _version() -> str:
    try:
        return metadata.version("mindformers")
    except metadata.PackageNotFoundError:
        return "1.9"


def check_run_yaml(tree: Tree, index: int, label: str) -> Tuple[Tree, List[Note], List[str]]:
    """mindformers' rules on ``monitor_config`` and ``runner_wrapper``; the keys left to mindformers removed
    from what msbridge reads (``tree`` is changed in place and returned)."""
    notes: List[Note] = []
    problems: List[str] = []
    where = _Where(tree, label, index)
    monitor = tree.data.get("monitor_config")
    if isinstance(monitor, Mapping):
        gone = _monitor_config(monitor, where, notes, problems)
        tree = _without(tree, [("monitor_config", key) for key in gone])
    _runner_wrapper(tree.data, where, notes, problems)
    return tree, notes, problems


class _Where:
    """``file:line`` of a path of the run YAML, and how to name the entry."""

    def __init__(self, tree: Tree, label: str, index: int) -> None:
        self.tree, self.label, self.index = tree, label, index

    def __call__(self, *path: Any) -> Origin:
        return self.tree.origins.get(tuple(path), Origin(self.label))

    @property
    def entry(self) -> str:
        origin = self("callbacks", self.index, "type")
        return f"the MSBridgeMonitor entry ({origin.file}:{origin.line}, callbacks[{self.index}])" \
            if origin.line else f"the MSBridgeMonitor entry (callbacks[{self.index}])"


def _monitor_config(monitor: Mapping[str, Any], where: _Where, notes: List[Note], problems: List[str]) -> List[str]:
    """Problems for what mindformers refuses; notes for the keys left to it. Returns the keys msbridge then
    leaves out (refused ones too: each is said once)."""
    accepted, formats, version = monitor_keys(), format_values(), _version()
    known = set(FIELD_NAMES) | set(HANDLERS)
    gone = []
    for key, value in monitor.items():
        at = f"{where('monitor_config', key)}: monitor_config.{key}"
        refused = f"mindformers {version} refuses this key (KeyError: The config 'monitor_config' gets an " \
                  f"unexpected key: {key})"
        if key not in accepted:
            problems.append(f"{at}: {refused}; it is an msbridge setting: move it into {where.entry}"
                            if key in known else f"{at}: {refused}{did_you_mean(key, accepted)}")
            gone.append(key)  # said once, here
        elif monitor.get("monitor_on") and _value_problem(at, key, value, formats, where, problems):
            gone.append(key)  # said once, here (with monitor_on false mindformers builds no monitor to refuse it)
        elif key in _ONLY_MINDFORMERS or (key in _SPIKE_KEYS and monitor.get("check_for_global_norm") is not True):
            text = _ONLY_MINDFORMERS[key](value) if key in _ONLY_MINDFORMERS else _SPIKE_KEYS[key]
            notes.append(Note(where("monitor_config", key), f"monitor_config.{key} -> {text}"))
            gone.append(key)
    return gone


def _value_problem(at: str, key: str, value: Any, formats: Tuple[str, ...], where: _Where,
                   problems: List[str]) -> bool:
    """A value mindformers' TrainingStateMonitor constructor refuses, said as it says it; True when one was said."""
    before = len(problems)
    if key.endswith("_format") and value:  # a false value (null, '', []) is "off" to mindformers
        _format_problem(at, key, value, formats, problems)
    checks = [(key, value)] if key in VALUE_RULES else []
    if key == "stable_rank_config" and isinstance(value, Mapping):
        checks = [(f"{key}.{sub}", v) for sub, v in value.items() if f"{key}.{sub}" in VALUE_RULES]
    for name, given in checks:
        what, valid, error, since = VALUE_RULES[name]
        counted = what == "a positive integer" and isinstance(given, bool)  # mindformers reads true as 1
        if valid(given) and not counted:
            continue
        at = f"{where('monitor_config', *name.split('.'))}: monitor_config.{name}"
        problems.append(f"{at}: expected {what}, got {given!r}: true is not a step count (mindformers would read it "
                        "as 1; write 1)" if counted else
                        f"{at}: expected {what}, got {given!r}: mindformers {since}+ refuses it ({error}) when the "
                        "Trainer builds its callbacks, before the first step")
    return len(problems) > before


def _format_problem(at: str, key: str, value: Any, formats: Tuple[str, ...], problems: List[str]) -> None:
    items = value if isinstance(value, list) else [value]
    allowed = " or ".join(repr(f) for f in formats)
    if not all(isinstance(i, str) for i in items):
        problems.append(f"{at}: mindformers' TrainingStateMonitor expects {allowed} or a list of them, got {value!r}")
        return
    for item in (i for i in items if i not in formats):
        hint = f"; to send this to {item}, list it in the MSBridgeMonitor entry's sinks" \
            if item in builtin_names() else did_you_mean(item, formats)
        problems.append(f"{at}: {item!r} is refused by mindformers' TrainingStateMonitor (ValueError: The value of "
                        f"{key} should be a `str` in {allowed}){hint}")


def _runner_wrapper(data: Mapping[str, Any], where: _Where, notes: List[Note], problems: List[str]) -> None:
    wrapper = data.get("runner_wrapper")
    if not isinstance(wrapper, Mapping):
        return
    ring = wrapper.get("type") == RING_NAME
    if ring:
        _ring_options(wrapper, where, problems)
    reset = wrapper_reset(data)
    if reset is None:
        return
    origin = where(*reset["path"])
    said = f"runner_wrapper -> mindformers replaces it with {PIPELINE_CELL} ({reset['why']}, {origin})"
    stages = reset["stages"]
    loss = (f"; the loss is taken from the last of the {stages} pipeline stages (train/global_loss over its ranks "
            "unless reduce_ranks is set; other ranks record no train/loss)") if stages > 1 else ""
    by = "micro_batch_num" if stages > 1 else "gradient_accumulation_steps"
    loss += _divided(data, f"{by} {reset['micro_batch_num']}")
    if ring:
        text = (f"{said}; msbridge keeps its ring around that cell ({RING_NAME} builds {PIPELINE_CELL}), so every "
                f"step's loss, overflow, loss scale, lr and global norm stay in the device ring{loss}. This needs "
                "`import msbridge.mindformers` before the Trainer is built; registered by auto_register only, the "
                "ring is lost and msbridge says so at train begin")
    else:
        text = (f"{said}; msbridge reads each step's outputs at its end (no device ring: with sink_mode only the "
                f"last step of each sink; runner_wrapper type: {RING_NAME} keeps every step){loss}")
    notes.append(Note(where("runner_wrapper", "type"), text, logging.WARNING))


def _divided(data: Mapping[str, Any], micro: str) -> str:
    """How MFLossMonitor (``_fix_loss_for_parallel``) divides the cell's loss, in words."""
    parts = [] if data.get("calculate_per_token_loss") is True else [micro]
    interleave = data.get("micro_batch_interleave_num")
    if isinstance(interleave, int) and not isinstance(interleave, bool) and interleave > 1:
        parts.append(f"micro_batch_interleave_num {interleave}")
    return f", divided by {' and '.join(parts)} as MFLossMonitor divides it" if parts else \
        ", not divided (calculate_per_token_loss), as MFLossMonitor takes it"


def _ring_options(wrapper: Mapping[str, Any], where: _Where, problems: List[str]) -> None:
    size = wrapper.get("ring_size", 1)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        problems.append(f"{where('runner_wrapper', 'ring_size')}: runner_wrapper.ring_size: expected an integer "
                        f">= 1, got {size!r}")
    cell = wrapper.get("wrapper", "MFTrainOneStepCell")
    if not isinstance(cell, str) or cell == RING_NAME:
        problems.append(f"{where('runner_wrapper', 'wrapper')}: runner_wrapper.wrapper: name the registered train "
                        f"cell {RING_NAME} builds (MFTrainOneStepCell ...), got {cell!r}")
        return
    arguments = cell_arguments(cell)
    valid = RING_KEYS + (arguments or ())
    for key in wrapper:
        if key in valid or key in TRAINER_ARGS:
            continue
        if arguments is not None:
            problems.append(f"{where('runner_wrapper', key)}: runner_wrapper.{key}: unknown key for {RING_NAME} or "
                            f"{cell} (its **kwargs would swallow it){did_you_mean(key, valid)}")
        elif did_you_mean(key, RING_KEYS):  # another cell's arguments are its own; a near-miss of ours is not
            problems.append(f"{where('runner_wrapper', key)}: runner_wrapper.{key}: not a key of {RING_NAME}"
                            f"{did_you_mean(key, RING_KEYS)} ({cell} is not a mindformers or MindSpore cell, so only "
                            f"{RING_NAME}'s own keys are checked)")


def _without(tree: Tree, paths: List[Path]) -> Tree:
    monitor = tree.data["monitor_config"]
    for path in paths:
        monitor.pop(path[-1], None)
    gone = set(paths)
    return Tree(tree.data, {p: o for p, o in tree.origins.items() if p[:2] not in gone})

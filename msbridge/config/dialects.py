"""The names users already write, each mapped to one msbridge setting and said once.

Three dialects are understood, in a pure msbridge file, under ``monitor_config:``
or under ``msbridge:``:

- mindformers 1.9 ``monitor_config`` (TrainingStateMonitor): ``dump_path``,
  ``*_format`` (``log`` / ``tensorboard`` / ``mlflow`` / ``jsonl`` / ``mindinsight``
  or a list of them), ``target``/``invert``, the global-norm spike keys, and
  the keys only mindformers uses (said to be left to it);
- keys from mindformers' ``monitor_config`` tutorials that mindformers itself does not read: ``interval``, ``nan_check``,
  ``exception_dump``, ``skip_nan_step``, ``warmup_steps``;
- MindSpore's ``SummaryCollector`` arguments (every one of ``SummaryCollector.__init__``): ``summary_dir``,
  ``collect_freq``, ``collect_specified_data``, ``keep_default_action``, ``custom_lineage_data``, and, said
  to have no effect with the reason, ``num_process``, ``collect_tensor_freq``, ``max_file_size``,
  ``export_options``; ``LossMonitor``'s ``per_print_times``; and names such configs put beside them:
  ``flush_interval``, ``keep_default_callbacks``, ``histogram_settings``.

Each handler turns one user key into ``Assignment``s to canonical paths and
one ``Note`` line (``monitor_config.interval -> flush_steps ...``). Nothing is
dropped without a line saying so.

Example:
    >>> from msbridge.config.keys import Mapped
    >>> from msbridge.config.yaml_lines import Origin
    >>> out = Mapped()
    >>> HANDLERS["interval"](Key(out, ("monitor_config", "interval"), Origin("run.yaml", 5), {}, None), 20)
    >>> out.assignments[0].target, str(out.notes[0])
    (('flush_steps',), 'run.yaml:5: monitor_config.interval -> flush_steps (steps between writes to disk; every step is still recorded)')
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..options import did_you_mean, expected
from ..sinks.registry import builtin_names
from .keys import Key, show
from .settings import FIELD_NAMES

FORMAT_VALUES = ("log",) + builtin_names()


Handler = Callable[[Key, Any], None]


def _typed(kind: str, ok: Callable[[Any], bool]) -> Callable[[Handler], Handler]:
    def wrap(handler: Handler) -> Handler:
        def checked(key: Key, value: Any) -> None:
            if ok(value):
                handler(key, value)
            else:
                key.problem(expected(kind, value))
        return checked
    return wrap


_is_bool = _typed("true or false", lambda v: isinstance(v, bool))
_is_count = _typed("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
_is_number = _typed("a number > 0", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)


def _off(value: Any) -> bool:
    """null, false, '' or [], as mindformers reads them (not 0, which YAML users do not write for "off")."""
    return value is None or value is False or value == [] or value == ""


def _alias(target: str, why: str = "") -> Handler:
    def handle(key: Key, value: Any) -> None:
        key.set((target,), value)
        key.says(target + (f" ({why})" if why else ""))
    return handle


def _health(*target: str, transform: Callable[[Any], Any] = lambda v: v) -> Handler:
    def handle(key: Key, value: Any) -> None:
        key.set(("health",) + target, transform(value))
        key.says(f"health.{'.'.join(target)}: {show(transform(value))}")
    return handle


def _dump_path(key: Key, value: Any) -> None:
    if value in (None, ""):
        key.says("no dump dir (empty); mindformers then inserts no TensorDump")
        return
    if not isinstance(value, str):
        key.problem(expected("a directory path", value))
        return
    key.set(("health", "dump_dir"), value)
    if "output_dir" in key.section:
        key.says("health.dump_dir")
        return
    output_dir = value.rstrip("/") + "/{experiment}/{run_name}"
    key.set(("output_dir",), output_dir)
    key.says(f"health.dump_dir, and output_dir {output_dir!r} (monitor output lands under dump_path)")


def _formats(value: Any) -> Optional[List[str]]:
    items = value if isinstance(value, list) else [value]
    return items if all(isinstance(i, str) for i in items) else None


def _format_handler(switch: Optional[str]) -> Handler:
    """``*_format: log | tensorboard | [..]``: turn ``switch`` on and add the named sinks."""

    def handle(key: Key, value: Any) -> None:
        if _off(value):
            key.says(f"null: nothing turned on{'' if switch is None else f'; {switch} keeps its own setting'}")
            return
        items = _formats(value)
        if items is None:
            key.problem(expected(f"one of {', '.join(map(repr, FORMAT_VALUES))} or a list of them", value))
            return
        bad = [i for i in items if i not in FORMAT_VALUES]
        for item in bad:
            key.problem(f"unknown format {item!r}{did_you_mean(item, FORMAT_VALUES)} "
                        f"(allowed: {', '.join(FORMAT_VALUES)})")
        if bad:
            return
        done = []
        if switch is None:  # max_attention_logit_format: mindformers computes them, MSBridgeMonitor forwards them
            if key.section_name != "monitor_config":
                key.mindformers_only("max attention logit")
                return
            done.append("forwarded from mindformers by MSBridgeMonitor: attention/max_logit/* at each flush "
                        "(parallel_core models with FlashAttention)")
        elif switch == "layer_norms":
            regex = _target_regex(key)
            key.set(("layer_norms",), regex)
            done.append(f"layer_norms: {regex!r}")
        else:
            key.set((switch,), True)
            done.append(f"{switch}: true")
        for sink in dict.fromkeys(i for i in items if i != "log"):
            key.set(("sinks", sink), {})
            done.append(f"sinks.{sink}")
        if "log" in items:
            done.append("log = the jsonl file and the console line")
        key.says(", ".join(done))
    return handle


def _target_regex(key: Key) -> str:
    """mindformers' ``target`` (patterns, ``re.search``) and ``invert`` as one regex."""
    target = key.section.get("target") or [".*"]
    patterns = [target] if isinstance(target, str) else target
    if not (isinstance(patterns, list) and all(isinstance(p, str) for p in patterns)):
        patterns = [".*"]  # a bad target is reported by its own handler
    joined = patterns[0] if len(patterns) == 1 else "|".join(f"(?:{p})" for p in patterns)
    return f"^(?!.*(?:{joined}))" if key.section.get("invert") is True else joined


#: mindformers' keys that turn on per-parameter norms (grad, weight, Adam moments): all map to ``layer_norms``.
_NORM_FORMATS = ("local_norm_format", "weight_state_format", "optimizer_state_format")


def _target(key: Key, value: Any) -> None:
    if not value:  # null or empty: every parameter, as mindformers reads it (``target or ['.*']``)
        key.says("null or empty: every parameter")
    elif not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
        key.problem(expected("a list of parameter-name patterns", value))
    elif any(key.section.get(k) for k in _NORM_FORMATS):
        key.says("the layer_norms regex (with invert)")
    else:
        key.says(f"no effect: msbridge uses it only with {', '.join(_NORM_FORMATS)}", logging.WARNING)


@_is_bool
def _invert(key: Key, value: bool) -> None:
    used = any(key.section.get(k) for k in _NORM_FORMATS)
    key.says("the layer_norms regex (negated)" if used else "no effect without target and a norm format",
             logging.INFO if used or not value else logging.WARNING)


def _summary_dir(key: Key, value: Any) -> None:
    """SummaryCollector's per-run dir: MindInsight is started on its parent, and lists the run by its name."""
    if not isinstance(value, str) or not value.strip("/"):
        key.problem(expected("a directory path", value))
        return
    base, job = os.path.split(value.rstrip("/"))
    base = base or "."
    key.set(("sinks", "mindinsight", "summary_base_dir"), base)
    if "run_name" in key.section:
        key.says(f"sinks.mindinsight.summary_base_dir: {base!r} (mindinsight start --summary-base-dir {base})")
        return
    key.set(("run_name",), job)
    key.says(f"sinks.mindinsight.summary_base_dir: {base!r}, run_name: {job!r} "
             f"(mindinsight start --summary-base-dir {base} lists the run as {job})")


@_is_bool
def _keep_default_callbacks(key: Key, value: bool) -> None:
    key.says("no effect: msbridge adds no default callbacks (its one progress line follows print_interval)",
             logging.WARNING)


@_is_bool
def _keep_default_action(key: Key, value: bool) -> None:
    """SummaryCollector: false collects only what ``collect_specified_data`` names (its loss too)."""
    specified = key.section.get("collect_specified_data")
    if value or not isinstance(specified, Mapping):
        key.says("msbridge's defaults apply to what collect_specified_data leaves out" if value else
                 "no effect without collect_specified_data (SummaryCollector then collects its defaults)")
        return
    if "collect_metric" in specified:
        key.says("only what collect_specified_data turns on; msbridge's own metrics (throughput, grad norm, "
                 "health) are still recorded")
        return
    key.set(("local_loss",), False)
    key.set(("global_loss",), False)
    key.says("local_loss, global_loss: false (collect_specified_data does not name collect_metric, so "
             "SummaryCollector would not collect the loss either; add collect_metric: true to record it)",
             logging.WARNING)


def _custom_lineage_data(key: Key, value: Any) -> None:
    """SummaryCollector's own lineage values: msbridge logs them as params (MLflow params, MindInsight lineage)."""
    if value is None:
        key.says("null: no custom lineage data")
        return
    scalar = (str, int, float)
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, scalar) and not isinstance(v, bool) for k, v in value.items()):
        key.problem(expected("a mapping of names to strings or numbers (as SummaryCollector takes)", value))
        return
    for name, item in value.items():
        key.set(("params", name), item)
    key.says(f"params: {', '.join(value)} (logged as the run's params: MLflow params, MindInsight's lineage)")


def _no_effect(reason: str, check: Optional[Handler] = None) -> Handler:
    """A SummaryCollector argument for something msbridge does not do: said, with why, never dropped silently."""
    def handle(key: Key, value: Any) -> None:
        key.says(f"no effect: {reason}", logging.INFO if _off(value) else logging.WARNING)
    return _is_positive_or_null(handle) if check is None else check(handle)


_is_positive_or_null = _typed("an integer > 0 or null", lambda v: v is None or (
    isinstance(v, int) and not isinstance(v, bool) and v > 0))
_is_mapping_or_null = _typed("a mapping or null", lambda v: v is None or isinstance(v, Mapping))


def _histograms(key: Key, value: Any) -> None:
    if _off(value):
        key.set(("histograms",), None)
        key.says("histograms: off")
        return
    if value is True:
        value = ".*"
    patterns = _formats(value)
    if patterns is None:
        key.problem(expected("a parameter-name regex, a list of them, or [] for off", value))
        return
    regex = patterns[0] if len(patterns) == 1 else "|".join(f"(?:{p})" for p in patterns)
    key.set(("histograms",), regex)
    key.says(f"histograms: {regex!r}")


def _sink_flag(name: str) -> Handler:
    def handle(key: Key, value: Any) -> None:
        if value is None or value is False:
            if name == "jsonl":
                key.problem("jsonl cannot be turned off: it is the write-ahead log every other sink is rebuilt from")
            else:
                key.says(f"sink {name} not added")
        elif value is True or isinstance(value, Mapping):
            key.set(("sinks", name), dict(value) if isinstance(value, Mapping) else {})
            key.says(f"sinks.{name}")
        else:
            key.problem(expected(f"true, false or a mapping of {name} sink options", value))
    return handle


def _mindformers_only(what: str) -> Handler:
    return lambda key, value: key.mindformers_only(what)


def _throughput_baseline(key: Key, value: Any) -> None:
    if value is None:
        key.says("null: nothing turned on")
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        key.set(("throughput",), True)
        key.says("throughput: true (the baseline itself is for mindformers' linearity figure)")
    else:
        key.problem(expected("null or a number > 0", value))


_NOT_RECORDED = {"collect_graph": "the computational graph", "collect_eval_lineage": "evaluation lineage",
                 "collect_input_data": "input data", "collect_dataset_graph": "the dataset graph",
                 "collect_landscape": "the loss landscape"}
_LINEAGE = "every run writes run.json, README.md and its params"


def _collect_item(key: Key, name: str, value: Any) -> None:
    if name == "histogram_regular":
        _histograms(key, value)
    elif name in _NOT_RECORDED:
        if value:
            key.says(f"not recorded by msbridge ({_NOT_RECORDED[name]}); MindSpore's SummaryCollector records it",
                     logging.WARNING)
        else:
            key.says(f"off (msbridge does not record {_NOT_RECORDED[name]})")
    elif not isinstance(value, bool):
        key.problem(expected("true or false", value))
    elif name == "collect_metric":
        key.set(("local_loss",), value)
        key.set(("global_loss",), value)
        key.says(f"local_loss, global_loss: {show(value)}")
    elif name == "collect_train_lineage":
        key.says(f"always on: {_LINEAGE}" if value else f"cannot be turned off: {_LINEAGE}",
                 logging.INFO if value else logging.WARNING)
    elif not value:
        key.says("off")
    elif "layer_norms" in key.section:
        key.says("no effect: layer_norms is set explicitly")
    else:
        key.set(("layer_norms",), ".*")
        key.says("layer_norms: '.*' (one norm per trainable parameter)")


SUMMARY_KEYS = ("collect_metric", "collect_train_lineage", "collect_trainable_params",
                "histogram_regular") + tuple(_NOT_RECORDED)


def _collect_specified_data(key: Key, value: Any) -> None:
    """SummaryCollector's ``collect_specified_data``, one line per key inside it."""
    if value is None:
        key.says("null: msbridge records its own defaults")
        return
    if not isinstance(value, Mapping):
        key.problem(expected("a mapping of collect_* switches", value))
        return
    for name, item in value.items():
        sub = key.child(name, key.out.where(key.path + (name,)))
        if name in SUMMARY_KEYS:
            _collect_item(sub, name, item)
        else:
            sub.problem(f"unknown key{did_you_mean(name, SUMMARY_KEYS)}")


HANDLERS: Dict[str, Handler] = {
    # mindformers 1.9 monitor_config (mindformers/tools/register/template.py: MonitorConfig)
    "dump_path": _dump_path,
    "local_loss_format": _format_handler("local_loss"),
    "device_local_loss_format": _format_handler("local_loss"),
    "local_norm_format": _format_handler("layer_norms"),
    "weight_state_format": _format_handler("layer_norms"),
    "device_local_norm_format": _format_handler("grad_norm"),
    "optimizer_state_format": _format_handler("layer_norms"),
    "max_attention_logit_format": _format_handler(None),
    "target": _target,
    "invert": _invert,
    "throughput_baseline": _throughput_baseline,
    "print_struct": _mindformers_only("prints parameter names, then stops training"),
    "check_for_global_norm": _is_bool(_health("grad_norm_spike", "check")),
    "global_norm_spike_threshold": _is_number(_health("grad_norm_spike", "threshold")),
    "global_norm_spike_count_threshold": _is_count(_health("grad_norm_spike", "count")),
    "stable_rank_config": _mindformers_only("weight stable rank"),
    "health_checkpoint": _mindformers_only("checkpoint health thresholds"),
    # monitor_config keys from mindformers' monitoring tutorials
    "interval": _alias("flush_steps", "steps between writes to disk; every step is still recorded"),
    "nan_check": _is_bool(_health("nonfinite", "check")),
    "skip_nan_step": _is_bool(_health("nonfinite", "action", transform=lambda v: "skip" if v else "stop")),
    "exception_dump": _is_bool(_health("dump_on_anomaly")),
    "warmup_steps": _is_count(_health("warmup_steps")),
    # MindSpore SummaryCollector / LossMonitor arguments
    "summary_dir": _summary_dir,
    "collect_freq": _alias("flush_steps", "steps between device->host copies and writes"),
    "flush_interval": _alias("flush_seconds", "seconds between writes"),
    "per_print_times": _alias("print_interval"),
    "keep_default_callbacks": _keep_default_callbacks,
    "keep_default_action": _keep_default_action,
    "custom_lineage_data": _custom_lineage_data,
    "num_process": _no_effect("msbridge writes summaries from the MindInsight sink's own thread and starts "
                              "no summary writer processes (SummaryCollector's writer pool)"),
    "collect_tensor_freq": _no_effect("msbridge records no TensorSummary data (histograms follow "
                                      "histogram_interval)"),
    "max_file_size": _no_effect("msbridge does not split or cap its summary files; the jsonl log is the "
                                "record every other sink is rebuilt from, and is never cut"),
    "export_options": _no_effect("msbridge exports no tensors (SummaryCollector's tensor_format: npy); "
                                 "keep MindSpore's SummaryCollector for that", _is_mapping_or_null),
    "collect_specified_data": _collect_specified_data,
    "histogram_settings": _histograms,
    # a sink named as a flag: ``mlflow: true`` or ``mlflow: {tracking_uri: ...}``
    **{name: _sink_flag(name) for name in builtin_names()},
}

VOCABULARY = FIELD_NAMES + tuple(HANDLERS)

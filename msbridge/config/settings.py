"""msbridge's settings, each declared once: a field of ``Config`` with its ``Option`` in the metadata.

A declaration is the whole of a setting: its type, default, range or choices, and
its meaning (docs/configuration.md's settings table is written from it by
``python -m msbridge.config.reference``). ``setting_problems`` checks values
against the declarations, in one pass: each ``Option``'s rule, then, for a
setting that holds keys of its own (``sinks``, ``straggler``, ``system``,
``alerts``, ``health``), the check its declaration names (``problems``, or
``parse``, whose result the Config keeps: ``health_spec``), then the ``needs``
between settings. ``Config`` runs it when it is built, so a config
built directly is checked as a loaded one is; the loader points each problem
at its YAML line.

Adding a setting is one field here (and its test): the loader, ``msbridge config``,
the dialect checks and the docs table read the declarations.

Example:
    >>> OPTIONS["flush_steps"].check(0)
    'expected an integer >= 1 and <= 10_000_000, got 0'
    >>> Config(experiment="sweep", flush_steps=50).flush_steps
    50
"""
from __future__ import annotations

from collections import abc
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Callable, Dict, Mapping, Optional, Set, Tuple, Union

from ..alerts.spec import AlertSpec, check_alerts, plain_section
from ..errors import ConfigError
from ..health.spec import HealthSpec, resolve_health
from ..limits import huge_int_problem, int_digits, is_huge_int
from ..options import Option, declare, declared_options, relation_problems
from .keys import Provenance
from .value_checks import (
    DEFAULT_OBJECTIVE_TEXT,
    NO_EVAL_LOSS_TEXT,
    MAX_ROWS,
    MAX_SECONDS,
    MAX_STEPS,
    OBJECTIVE_DEFAULTS,
    RANKS,
    STRAGGLER_DEFAULTS,
    SYSTEM_INTERVAL_S,
    Problems,
    curves_problem,
    group_regex_problem,
    normalise_sinks,
    objective_problems,
    ranks_problem,
    regex_problem,
    sink_problems,
    straggler_problems,
    straggler_settings,
    system_problems,
    tags_problem,
)
from .yaml_lines import format_path

DEFAULT_OUTPUT_DIR = "{experiment_dir}/{run_name}"

_STEPS = dict(low=1, high=MAX_STEPS, high_open=False)
_SECONDS = dict(low=0, low_open=True, high=MAX_SECONDS, high_open=False)
_REGEX = "a regular expression over parameter names"
_GROUP_REGEX = "a regular expression with one capturing group (the layer's name)"


def _section(kind: Any, default: Any, doc: str, problems: Optional[Callable[[Any], Problems]] = None,
             parse: Optional[Callable[[Any], Tuple[Any, Problems]]] = None, **allowed: Any) -> Any:
    """A setting that holds keys of its own: ``problems(value)`` reports each bad one at its own path; or
    ``parse(value)`` does, returning ``(parsed, problems)``, and the Config keeps what it parsed."""
    declared = declare(kind, default, doc, **allowed)
    hooks = {"problems": problems} if problems else {"parse": parse}
    return field(default=declared.default, default_factory=declared.default_factory,
                 metadata={**declared.metadata, **hooks})


class SettingsError(ConfigError):
    """Values a ``Config`` may not hold; ``located`` keeps each problem as ``(path, message)``.

    Example:
        >>> try:
        ...     Config(straggler={"margin": 0})
        ... except SettingsError as exc:
        ...     exc.located
        [(('straggler', 'margin'), 'expected a number > 0 and <= 100, got 0')]
    """

    def __init__(self, located: Problems) -> None:
        self.located = located
        super().__init__([f"{format_path(path)}: {message}" for path, message in located])


def plain(value: Any) -> Any:
    """A plain dict/list copy of nested mappings and sequences (frozen configs included)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class Config:
    """msbridge's settings, validated and immutable. Build it with ``load_config``, or directly.

    Raises:
        SettingsError: (a ``ConfigError``) every value it may not hold, each at its key.

    Example:
        >>> Config(experiment="sweep", flush_steps=50).flush_steps
        50
    """

    monitor_on: bool = declare(bool, True, "master switch; false builds nothing and records nothing")
    experiment: str = declare(str, "default",
        "experiment name (MLflow experiment, `{experiment}` in `experiment_dir` and `output_dir`)")
    run_name: str = declare(str, "run-{timestamp}",
        "run name template: `{dotted.key}` from params or settings (e.g. `tiny-lm-lr{optimizer.learning_rate}`), "
        "`{timestamp}`, `{rank}`")
    output_dir: str = declare(str, DEFAULT_OUTPUT_DIR,
        "run directory template: `{experiment_dir}` (as its start), `{experiment}`, `{run_name}`, `{rank}`, "
        "`{timestamp}`")
    experiment_dir: Optional[str] = declare(str, None,
        "where the stores an experiment's runs share live (`mlflow.db`, `mlartifacts/`, `tensorboard/`, "
        "`summary/`); may use `{experiment}`; null: `./msbridge_runs/{experiment}` when `output_dir` starts with "
        "`{experiment_dir}`, else `output_dir`'s part before its first per-run component (`{run_name}`, `{rank}`, "
        "`{timestamp}`)")
    resume: bool = declare(bool, False,
        "continue a run dir whose log holds steps even when training starts at or before its last recorded step "
        "(steps up to it are kept as recorded, not written again); without it such a training is refused at train "
        "begin")
    step_interval: int = declare(int, 1, "record every N-th step (sampling granularity)", **_STEPS)
    flush_steps: int = declare(int, 100, "steps buffered between device->host copies and writes", **_STEPS)
    flush_seconds: float = declare(float, 10.0,
        "also flush when this many seconds passed (single process; ranks flush by steps)", **_SECONDS)
    print_interval: int = declare(int, 20, "console progress line every N steps (global rank)", **_STEPS)
    local_loss: bool = declare(bool, True, "record each rank's own loss (`train/loss`, `train/loss_ema`)")
    global_loss: bool = declare(bool, True, "record the loss averaged over ranks and its spread (rank 0)")
    grad_norm: bool = declare(bool, True, "record the global gradient norm")
    learning_rate: bool = declare(bool, True, "record the optimizer's learning rate")
    throughput: bool = declare(bool, True, "record step time, samples/s and tokens/s, and `perf/monitor_overhead`")
    memory: bool = declare(bool, False,
        "per flush: `memory/host_rss_mb` and the window's peak `memory/host_rss_peak_mb`, and on Ascend/GPU "
        "`memory/device_allocated_mb` and the window's `memory/device_peak_mb` (MindSpore's runtime memory API; "
        "the CPU backend has no device pool: said once)")
    layer_norms: Optional[str] = declare(str, None,
        "per-parameter norms for parameter names matching the regex (`re.search`): `grad_norm/<param>` every "
        "recorded step (computed in the compiled step: needs `TrainStep`, or `attach_ring` around a mindformers "
        "cell with `local_norm=True`; otherwise said once), `weight_norm/<param>` and "
        "`optimizer/adam_m_norm/<param>`, `optimizer/adam_v_norm/<param>` (Adam family) at each flush; a regex "
        "matching nothing warns with the closest names; off if null", what=_REGEX, valid=regex_problem)
    layer_norms_group: Optional[str] = declare(str, None,
        "one series per layer instead of per parameter: the group names the layer (e.g. `layers\\.(\\d+)\\.`), its "
        "norm is sqrt of the sum of its parameters' squared norms. MLflow rows: one per series per recorded step "
        "(grad) and per flush (weight, moments), e.g. 300 parameters -> 300 rows a step, 24 layers -> 24",
        what=_GROUP_REGEX, valid=group_regex_problem, needs="layer_norms")
    histograms: Optional[str] = declare(str, None,
        "weight and gradient histograms (`histogram` events `weights/<param>`, `grads/<param>`) of the parameters "
        "whose names match the regex (`re.search`; `histogram_regular` and `histogram_settings` map here), read at a "
        "flush, never per step; gradients need `msbridge.TrainStep`, else weights only, said once; what each sink "
        "shows and what it costs: [metrics.md](metrics.md#weight-and-gradient-histograms); a regex matching nothing "
        "warns once with the closest names; off if null",
        what=_REGEX, valid=regex_problem)
    histogram_interval: Optional[int] = declare(int, None,
        "the fewest steps between two histograms: a flush records them when at least this many steps passed since "
        "the last ones (since the start of training for the first); null: at every flush (`flush_steps`). Needs "
        "`histograms`", needs="histograms", **_STEPS)
    system: Union[None, bool, Mapping[str, Any]] = _section((bool, abc.Mapping), None,
        "NPU system metrics of the rank's own chip from `npu-smi info` in a background thread (sleeps between "
        "samples): `system/npu_utilization_pct`, `system/npu_hbm_used_mb`, `system/npu_hbm_total_mb`, "
        "`system/npu_temperature_c`, `system/npu_power_w`; `true` = every 10 s; without `npu-smi` on PATH: off, one"
        " INFO line", system_problems,
        what=f"a switch (true, false) or a mapping like {{interval_s: {SYSTEM_INTERVAL_S:g}}}")
    seq_length: Optional[int] = declare(int, None,
        "tokens per sample, for tokens/s (if unset, a training YAML's `model.model_config.seq_length`, else "
        "`train_dataset.data_loader.config.seq_length` (Megatron dataset), `train_dataset.data_loader.seq_length`, "
        "`train_dataset.seq_length`, else `seq_length` in `pretrained_model_dir`'s `config.json`; none found: one "
        "warning that tokens/s is off)", low=1, high=MAX_ROWS, high_open=False)
    global_batch_size: Optional[int] = declare(int, None,
        "samples one step takes over every data-parallel rank, for `perf/samples_seen`, `perf/tokens_seen` and "
        "`perf/tflops`; null: the dataset's batch x `parallel_config.data_parallel` (a mindformers run YAML's), else "
        "x the `reduce_ranks`, else x the world size; under `parallel.full_batch: true` the dataset's batch "
        "([metrics.md](metrics.md#what-a-step-is-worth))", low=1, high=MAX_ROWS, high_open=False)
    flops_per_sample: Optional[float] = declare(float, None,
        "training FLOPs (forward + backward) of one sample, for `perf/tflops` and `perf/mfu`; null: counted from "
        "the model config in params (`model.model_config` or `model`: 6*N + 12*L*h*s per token, "
        "[metrics.md](metrics.md#what-a-step-is-worth)); neither: both off, one INFO line", low=0, low_open=True, high=1e18)
    peak_tflops: Optional[float] = declare(float, None,
        "the device's peak TFLOP/s that `perf/mfu` divides by; null: the table of public peaks per chip and dtype "
        "(Ascend 910A/910B/910C; a CPU or an unknown chip has none: MFU off, one INFO line)", low=0, low_open=True,
        high=100_000)
    sinks: Mapping[str, Mapping[str, Any]] = _section((abc.Mapping, list, tuple, str, type(None)), {"jsonl": {}},
        "sink names (`[jsonl, tensorboard]`), or name -> options (`{mlflow: {tracking_uri: ...}}`); jsonl is always"
        " on. Options per sink: [sinks.md](sinks.md)",
        sink_problems, what="a list of sink names or a mapping name -> options")
    health: Mapping[str, Any] = _section(abc.Mapping, {},
        "health checks and actions: [health.md](health.md)", parse=resolve_health, what="a mapping")
    overhead_budget: float = declare(float, 0.01,
        "allowed share of step time spent monitoring; past it the flush window widens", low=0, low_open=True, high=1)
    buffer_size: int = declare(int, 0,
        "rows a TrainStep/attach_ring device ring must have at least; 0 = auto (2 x flush_steps); also caps how far"
        " overhead_budget widens the flush window", low=0, high=MAX_ROWS, high_open=False)
    reduce_ranks: Optional[Tuple[int, ...]] = declare((list, tuple), None,
        "ranks whose loss makes `train/global_loss` and `dist/*` (pipeline parallel: the last stage); null: all",
        what=RANKS, valid=ranks_problem)
    collective_timeout_s: float = declare(float, 60.0,
        "seconds the per-flush cross-rank collective may block before the run is closed FAILED", **_SECONDS)
    straggler: Mapping[str, Any] = _section(abc.Mapping, STRAGGLER_DEFAULTS,
        "a rank whose own step time is above the other ranks' median by `margin` (a fraction) in `windows` "
        "consecutive flush windows is named a straggler",
        straggler_problems, what="a mapping such as {margin: 0.15, windows: 3}")
    alerts: Mapping[str, Any] = _section((abc.Mapping, type(None)), {},
        "alerts to chat tools and webhooks: `{targets: [{type, url, secret}], on: [...], stall_seconds}`; the stall"
        " watchdog's threshold; see [alerts.md](alerts.md)", check_alerts, what="a mapping with targets: [...]")
    per_rank_curves: Union[str, Tuple[int, ...]] = declare((str, list, tuple), "auto",
        "ranks whose own loss (`dist/loss/rank_<r>`) and own step time (`dist/step_time_ms/rank_<r>`) rank 0 also "
        "logs; `auto`: every rank up to 16 ranks, none above (rank 0 logs min/max/mean/std/p5/p50/p95 at any size; "
        "each rank's own files always keep its curves): [distributed.md](distributed.md)",
        what=f"'auto', 'none' or {RANKS}", valid=curves_problem)
    objective: Mapping[str, Any] = _section(abc.Mapping, OBJECTIVE_DEFAULTS,
        "the one number a sweep is compared on: `{metric: eval/loss, mode: min}`; each run records "
        "`objective/best`, `objective/best_step`, `objective/final` ([metrics.md](metrics.md#the-objective)); "
        f"`metric` null: {DEFAULT_OBJECTIVE_TEXT}; {NO_EVAL_LOSS_TEXT}",
        objective_problems, what="a mapping such as {metric: eval/loss, mode: min}")
    sweep_id: Optional[str] = declare(str, None,
        "groups the runs of one sweep (MLflow tag `msbridge.sweep_id`, TensorBoard hparams)")
    tags: Mapping[str, str] = declare(abc.Mapping, {},
        "tags for trackers (values become strings)", what="a mapping of tag -> value", valid=tags_problem)
    params: Mapping[str, Any] = declare(abc.Mapping, {},
        "the training job's hyperparameters, logged, not interpreted", what="a mapping")

    def __post_init__(self) -> None:
        parsed: Dict[str, Any] = {}
        problems = setting_problems({f.name: getattr(self, f.name) for f in fields(self)}, type(self), parsed)
        if problems:
            raise SettingsError(problems)
        object.__setattr__(self, "_parsed", parsed)
        object.__setattr__(self, "sinks", _frozen(normalise_sinks(plain(self.sinks))))
        object.__setattr__(self, "tags", _frozen({str(k): str(v) for k, v in self.tags.items()}))
        object.__setattr__(self, "straggler", _frozen(straggler_settings(plain(self.straggler))))
        object.__setattr__(self, "objective", _frozen({**OBJECTIVE_DEFAULTS, **plain(self.objective)}))
        object.__setattr__(self, "alerts", _frozen(plain_section(plain(self.alerts or {}))))
        if not isinstance(self.per_rank_curves, str):
            object.__setattr__(self, "per_rank_curves", tuple(int(r) for r in self.per_rank_curves))
        for name in ("health", "params"):
            object.__setattr__(self, name, _frozen(plain(getattr(self, name))))
        if isinstance(self.system, Mapping):
            object.__setattr__(self, "system", _frozen(plain(self.system)))

    @property
    def health_spec(self) -> HealthSpec:
        """The ``health`` section parsed, once: by the check that ran when the Config was built."""
        return self.__dict__["_parsed"]["health"]

    @property
    def alert_spec(self) -> AlertSpec:
        """The ``alerts`` section parsed (msbridge.alerts.spec)."""
        return AlertSpec.parse(self.alerts)

    @property
    def system_interval_s(self) -> Optional[float]:
        """Seconds between npu-smi samples (``system``), or None when the sampler is off."""
        if not self.system:
            return None
        return float(self.system.get("interval_s", SYSTEM_INTERVAL_S)) if isinstance(self.system, Mapping) \
            else SYSTEM_INTERVAL_S

    @property
    def provenance(self) -> Provenance:
        """Where each value came from (empty for a Config built directly)."""
        return self.__dict__.get("_provenance") or Provenance()

    def to_dict(self) -> Dict[str, Any]:
        """A plain dict of every field (for logging and the resolved YAML)."""
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}

    def with_changes(self, **changes: Any) -> "Config":
        """A copy with some fields changed (validated again; provenance is not kept)."""
        return replace(self, **changes)


#: Every setting's declaration, by name, in the order ``Config`` declares them.
OPTIONS: Dict[str, Option] = declared_options(Config)
FIELD_NAMES = tuple(OPTIONS)


def setting_problems(values: Mapping[str, Any], declared: Any = Config,
                     parsed: Optional[Dict[str, Any]] = None) -> Problems:
    """Every problem of ``values`` against the settings ``declared`` (a ``Config`` class), each at its path.

    Settings absent from ``values`` are not checked. What a ``parse`` check parsed goes into ``parsed``.

    Example:
        >>> setting_problems({"flush_steps": 0, "histogram_interval": 5})[0]
        (('flush_steps',), 'expected an integer >= 1 and <= 10_000_000, got 0')
        >>> setting_problems({"histogram_interval": 5})
        [(('histogram_interval',), 'has no effect without histograms')]
    """
    problems: Problems = []
    broken: Set[str] = set()
    for spec in fields(declared):
        name, option = spec.name, spec.metadata.get("option")
        if name not in values or option is None:
            continue
        value = values[name]
        if is_huge_int(value):  # its repr would fail (Python prints at most 4,300 digits)
            found = [((name,), huge_int_problem(int_digits(value)))]
        else:
            found = _value_problems(spec, value, {} if parsed is None else parsed)
        problems += found
        if found:
            broken.add(name)
    options = declared_options(declared)
    return problems + [((name,), message) for name, message in relation_problems(options, values, broken)]


def _value_problems(spec: Any, value: Any, parsed: Dict[str, Any]) -> Problems:
    """One field's problems: its Option's rule, then the check of its keys that its declaration names."""
    message = spec.metadata["option"].check(value)
    if message:
        return [((spec.name,), message)]
    if "parse" in spec.metadata:
        parsed[spec.name], found = spec.metadata["parse"](value)
        return found
    return spec.metadata["problems"](value) if "problems" in spec.metadata else []

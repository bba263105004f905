"""The validated, immutable msbridge config.

``Config`` holds msbridge's own settings; ``params`` holds the training job's
hyperparameters (model, optimizer, runner ...) that msbridge logs but does not
interpret. ``load_config`` builds one from a YAML file or a dict.

Example:
    >>> cfg = load_config({"experiment": "tiny-lm", "sinks": ["jsonl", "tensorboard"]})
    >>> cfg.flush_steps, sorted(cfg.sinks)
    (100, ['jsonl', 'tensorboard'])
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from .errors import ConfigError

DEFAULT_OUTPUT_DIR = "./msbridge_runs/{experiment}/{run_name}"


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain dict/list copy of a frozen config value."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Config:
    """msbridge's settings. Build it with ``load_config``; every field is in README's reference table.

    Example:
        >>> Config(experiment="sweep", flush_steps=50).flush_steps
        50
    """

    monitor_on: bool = True
    experiment: str = "default"
    run_name: str = "run-{timestamp}"
    output_dir: str = DEFAULT_OUTPUT_DIR
    step_interval: int = 1
    flush_steps: int = 100
    flush_seconds: float = 10.0
    print_interval: int = 20
    local_loss: bool = True
    global_loss: bool = True
    grad_norm: bool = True
    learning_rate: bool = True
    throughput: bool = True
    memory: bool = False
    layer_norms: Optional[str] = None
    histograms: Optional[str] = None
    seq_length: Optional[int] = None
    sinks: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: {"jsonl": {}})
    health: Mapping[str, Any] = field(default_factory=dict)
    overhead_budget: float = 0.01
    buffer_size: int = 0
    sweep_id: Optional[str] = None
    tags: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise ConfigError(problems)
        for name in ("sinks", "health", "tags", "params"):
            object.__setattr__(self, name, _frozen(_normalise_sinks(getattr(self, name)) if name == "sinks" else getattr(self, name)))

    def to_dict(self) -> Dict[str, Any]:
        """A plain dict of every field (for logging and the resolved YAML)."""
        return {f.name: thaw(getattr(self, f.name)) for f in fields(self)}

    def with_changes(self, **changes: Any) -> "Config":
        return replace(self, **changes)


FIELD_NAMES = tuple(f.name for f in fields(Config))

_TYPES = {
    bool: ("monitor_on", "local_loss", "global_loss", "grad_norm", "learning_rate", "throughput", "memory"),
    str: ("experiment", "run_name", "output_dir"),
    int: ("step_interval", "flush_steps", "print_interval", "buffer_size"),
    float: ("flush_seconds", "overhead_budget"),
}


def _normalise_sinks(sinks: Union[Sequence[str], Mapping[str, Any], None]) -> Dict[str, Dict[str, Any]]:
    if sinks is None:
        return {"jsonl": {}}
    if isinstance(sinks, str):
        sinks = [sinks]
    if isinstance(sinks, Mapping):
        out = {str(k): dict(v or {}) for k, v in sinks.items()}
    else:
        out = {str(name): {} for name in sinks}
    # jsonl is the write-ahead log every other sink can be rebuilt from: always on.
    out.setdefault("jsonl", {})
    return out


def _validate(cfg: Config) -> List[str]:
    problems: List[str] = []
    for typ, names in _TYPES.items():
        for name in names:
            value = getattr(cfg, name)
            ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
            if typ is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                problems.append(f"{name}: expected {typ.__name__}, got {value!r}")
    for name in ("step_interval", "flush_steps", "print_interval"):
        value = getattr(cfg, name)
        if isinstance(value, int) and value < 1:
            problems.append(f"{name}: must be >= 1, got {value!r}")
    if isinstance(cfg.flush_seconds, (int, float)) and cfg.flush_seconds <= 0:
        problems.append(f"flush_seconds: must be > 0, got {cfg.flush_seconds!r}")
    if isinstance(cfg.overhead_budget, (int, float)) and not 0 < cfg.overhead_budget < 1:
        problems.append(f"overhead_budget: must be between 0 and 1, got {cfg.overhead_budget!r}")
    if cfg.seq_length is not None and (not isinstance(cfg.seq_length, int) or cfg.seq_length < 1):
        problems.append(f"seq_length: expected a positive int, got {cfg.seq_length!r}")
    if not isinstance(cfg.sinks, (Mapping, list, tuple, str)):
        problems.append(f"sinks: expected a list of names or a mapping name -> options, got {cfg.sinks!r}")
    else:
        from .registry import available, check_available

        for name in _normalise_sinks(cfg.sinks):
            try:
                check_available(name)
            except ConfigError:
                hint = did_you_mean(name, available())
                problems.append(f"sinks.{name}: unknown sink{hint}; registered sinks: {', '.join(available())}")
            except ImportError as exc:
                problems.append(f"sinks.{name}: {exc}")
    return problems


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""``."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def load_config(source: Union[str, Mapping[str, Any], Config, None] = None, overrides: Sequence[str] = ()) -> Config:
    """A validated ``Config`` from a dict (or an existing Config)."""
    if isinstance(source, Config) and not overrides:
        return source
    data: Dict[str, Any] = thaw(source.to_dict()) if isinstance(source, Config) else dict(source or {})
    unknown = [k for k in data if k not in FIELD_NAMES]
    if unknown:
        raise ConfigError([f"{k}: unknown key{did_you_mean(k, FIELD_NAMES)}" for k in unknown])
    return Config(**data)

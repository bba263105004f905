"""The ``alerts:`` section: where alerts go, which events alert, and the stall threshold.

Checked before training with the rest of the config (``check_alerts`` returns
``(path, message)`` problems, which the loader points at the YAML line), and
parsed into an ``AlertSpec`` that the alert sink and the stall watchdog read.

YAML 1.1 reads a bare ``on:`` key as ``true``; the section takes that key as
``on`` (what the user wrote), so ``on: [nonfinite, stall]`` works unquoted.

Example:
    >>> spec = AlertSpec.parse({"targets": [{"type": "slack", "url": "https://hooks.slack.com/services/T/B/X"}],
    ...                         "on": ["nonfinite", "stall"]})
    >>> spec.targets[0].type, sorted(spec.on), spec.stall_seconds
    ('slack', ['nonfinite', 'stall'], None)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple

from ..errors import ConfigError
from ..addresses import address_problem
from ..masking import mask_secrets
from ..options import Option, check_options, did_you_mean

Path = Tuple[Any, ...]

#: Target types, each in its vendor's documented message format (``msbridge.alerts.formats``).
TARGET_TYPES = ("webhook", "slack", "lark", "dingtalk", "wecom")
#: Types whose bot can require a signature (``secret``).
SIGNED_TYPES = ("lark", "dingtalk")

#: What alerts when ``on`` is not given: non-finite values, a stop (``action`` stop, ``job_stop``), a stall,
#: a run that ended FAILED or KILLED, a sink that gave up (a ``gap``, or undelivered at close).
DEFAULT_ON = ("nonfinite", "stop", "stall", "failed", "undelivered")
#: Opt-in: loss / grad-norm spikes, stragglers, plateaus, throughput drops, and every run end (any status).
OPT_IN = ("spike", "straggler", "plateau", "throughput_drop", "end")
ON_VALUES = DEFAULT_ON + OPT_IN

TARGET_OPTIONS: Dict[str, Option] = {
    "type": Option(str, "webhook", "the chat tool", choices=TARGET_TYPES),
    "url": Option(str, "", "the webhook URL (it holds the token: masked everywhere msbridge writes)"),
    "secret": Option(str, None, "lark / dingtalk signing secret (masked everywhere)"),
}

SECTION_OPTIONS: Dict[str, Option] = {
    "stall_seconds": Option(float, None, "no step ended for this long is a stall; null: 10 x the median step "
                                         "time, at least 300 s", low=0, low_open=True, high=10_000_000),
    "window_s": Option(float, 300.0, "at most one message per kind per window (the rest: 'and N more')",
                       low=0, high=10_000_000),
    "retries": Option(int, 3, "retries of a failed request (backoff 1, 2, 4 ... s)", low=0, high=20),
    "timeout_s": Option(float, 10.0, "seconds one request may take", low=0, low_open=True, high=600),
    "close_wait_s": Option(float, 10.0, "seconds the close waits for alerts still being sent", low=0, high=600),
}
SECTION_KEYS = ("targets", "on") + tuple(SECTION_OPTIONS)


@dataclass(frozen=True)
class Target:
    """One place alerts go; ``index`` is its position in ``targets`` (the outbox names it so, never by URL).

    Example:
        >>> Target(0, "lark", "https://open.feishu.cn/open-apis/bot/v2/hook/xxx", "s3cret").label
        'target 1 (lark)'
    """

    index: int
    type: str
    url: str
    secret: Optional[str] = None

    @property
    def label(self) -> str:
        """How logs and the console name the target: never with its URL."""
        return f"target {self.index + 1} ({self.type})"



def _shown(value: Any) -> str:
    """``value`` as a problem shows it: a target's url (the bot's token) and every secret masked."""
    return repr(mask_secrets(value, "alerts"))

def plain_section(value: Any) -> Any:
    """The section with a YAML-1.1 ``on`` key (read as ``True``) named ``on`` again."""
    if isinstance(value, Mapping) and True in value:
        return {("on" if key is True else key): v for key, v in value.items()}
    return value


def _check_target(i: int, target: Any) -> List[Tuple[Path, str]]:
    where: Path = ("alerts", "targets", i)
    if not isinstance(target, Mapping):
        return [(where, f"expected a mapping like {{type: webhook, url: 'https://...'}}, got {_shown(target)}")]
    problems = [(where + (key,), f"expected {TARGET_OPTIONS[key].kind} (the value is not shown: it is a secret)"
                 if key in ("url", "secret") and not message.startswith("unknown") else message)
                for key, message in check_options(TARGET_OPTIONS, target)]
    kind = target.get("type", "webhook")
    url = target.get("url")
    if "url" not in target:
        problems.append((where, "needs url: the webhook URL of the bot or endpoint"))
    elif isinstance(url, str) and url and not url.startswith(("https://", "http://")):
        problems.append((where + ("url",), "expected an http:// or https:// URL"))
    elif isinstance(url, str) and url and address_problem(url):
        problems.append((where + ("url",), f"the URL {address_problem(url)} (the URL is not shown: it holds a token)"))
    if target.get("secret") is not None and kind not in SIGNED_TYPES:
        problems.append((where + ("secret",), f"only {' and '.join(SIGNED_TYPES)} bots sign requests; "
                                              f"a {kind} target takes no secret"))
    return problems


def _check_on(value: Any, key: Any) -> List[Tuple[Path, str]]:
    """``key``: how the YAML holds ``on`` (YAML 1.1 reads a bare ``on`` as ``True``), so the line is found."""
    if not isinstance(value, (list, tuple)):
        return [(("alerts", key), f"expected a list of event names ({', '.join(ON_VALUES)}), got {value!r}")]
    return [(("alerts", key, i), f"unknown event {name!r}{did_you_mean(str(name), ON_VALUES)} "
                                  f"(valid: {', '.join(ON_VALUES)})")
            for i, name in enumerate(value) if name not in ON_VALUES]


def check_alerts(value: Any) -> List[Tuple[Path, str]]:
    """Every problem of the ``alerts`` section, as ``(path, message)``; ``[]`` when it is valid (or absent)."""
    if value is None:
        return []
    on_key = True if isinstance(value, Mapping) and True in value else "on"
    value = plain_section(value)
    if not isinstance(value, Mapping):
        return [(("alerts",), f"expected a mapping with targets: [...], got {_shown(value)}")]
    problems: List[Tuple[Path, str]] = []
    for key in value:
        if key not in SECTION_KEYS:
            problems.append((("alerts", key), f"unknown key{did_you_mean(str(key), SECTION_KEYS)} "
                                              f"(valid: {', '.join(SECTION_KEYS)})"))
    targets = value.get("targets", [])
    if not isinstance(targets, (list, tuple)):
        problems.append((("alerts", "targets"), f"expected a list of targets, got {_shown(targets)}"))
    else:
        for i, target in enumerate(targets):
            problems += _check_target(i, target)
    if "on" in value:
        problems += _check_on(value["on"], on_key)
    problems += [(("alerts", key), message) for key, message in
                 check_options(SECTION_OPTIONS, {k: v for k, v in value.items() if k in SECTION_OPTIONS})]
    return problems


@dataclass(frozen=True)
class AlertSpec:
    """The parsed ``alerts`` section.

    Example:
        >>> AlertSpec.parse({}).enabled, AlertSpec.parse({}).on == frozenset(DEFAULT_ON)
        (False, True)
    """

    targets: Tuple[Target, ...] = ()
    on: FrozenSet[str] = frozenset(DEFAULT_ON)
    stall_seconds: Optional[float] = None
    window_s: float = 300.0
    retries: int = 3
    timeout_s: float = 10.0
    close_wait_s: float = 10.0

    @property
    def enabled(self) -> bool:
        """True when there is somewhere to send alerts."""
        return bool(self.targets)

    @classmethod
    def parse(cls, value: Optional[Mapping[str, Any]]) -> "AlertSpec":
        """Raises ConfigError for an invalid section (``load_config`` reports it first, with file:line)."""
        problems = check_alerts(value)
        if problems:
            raise ConfigError([f"{'.'.join(map(str, path))}: {message}" for path, message in problems])
        value = plain_section(value or {})
        targets = tuple(Target(i, t.get("type", "webhook"), t["url"], t.get("secret"))
                        for i, t in enumerate(value.get("targets", [])))
        settings = {key: value.get(key, option.default) for key, option in SECTION_OPTIONS.items()}
        on = frozenset(value["on"]) if "on" in value else frozenset(DEFAULT_ON)
        return cls(targets=targets, on=on, **settings)

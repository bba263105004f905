"""The typed ``Option`` that sinks and health checks declare their options with, and the check of a sink's.

One rule decides what is valid, for a sink's ``options`` (checked by ``Sink.__init__`` and by
``load_config`` / ``msbridge config check`` through ``check_options``, before training) and for
a detector's ``options`` and ``HealthSpec``'s settings (checked by ``msbridge.health.spec``).
The two word a problem as they always have: ``Option.check`` says the whole expectation in one
phrase (as the sink and setting checks do), ``Option.problem`` names the broken rule (as the
``health`` section does).

Types: ``bool``; ``int`` (never a bool); ``float``, meaning any number (an int or a float, never a
bool); ``str``, a non-empty string. ``None`` is allowed exactly when the default is ``None``.

Example:
    >>> OPTIONS = {"logdir": Option(str, None, "the directory to point tensorboard --logdir at")}
    >>> check_options(OPTIONS, {"logdri": "/tmp/tb"})
    [('logdri', "unknown option; did you mean 'logdir'?")]
    >>> window = Option(int, 50, "recent losses the median is taken over", low=1)
    >>> window.check(0), window.problem(0)
    ('expected an integer >= 1, got 0', 'must be >= 1, got 0')
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .errors import did_you_mean

#: What a valid value of each type is, in the words of ``check`` and of ``problem``.
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a non-empty string"}
_WORDS = {bool: "true or false", int: "an int", float: "a number", str: "a string"}


@dataclass(frozen=True)
class Option:
    """One option: its type (bool, int, float or str), default, meaning and allowed values.

    ``low``/``high`` bound a number (``low`` included unless ``low_open``; ``high`` excluded); a float is
    always finite. ``choices`` lists the allowed values. ``at_most`` names another option of the same
    declaration this one may not exceed (``check_options`` checks the pair, defaults included);
    ``valid`` is a further check of a well-typed value, returning the problem or None.

    Example:
        >>> Option(float, 10.0, "seconds close keeps retrying", 0).check(-1)
        'expected a number >= 0, got -1'
        >>> Option(float, 0.98, "EMA decay of the loss", low=0, low_open=True, high=1).problem(1.0)
        'must be < 1, got 1.0'
    """

    type: type
    default: Any
    doc: str
    low: Optional[float] = None
    low_open: bool = False
    high: Optional[float] = None
    choices: Tuple[Any, ...] = ()
    at_most: Optional[str] = None
    valid: Optional[Callable[[Any], Optional[str]]] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.type not in _KINDS:
            raise TypeError(f"Option type must be one of {', '.join(t.__name__ for t in _KINDS)}, got {self.type!r}")
        if self.type not in (int, float) and (self.low, self.high) != (None, None):
            raise TypeError(f"only an int or float Option has bounds, not a {self.type.__name__} one")

    @property
    def kind(self) -> str:
        """What a valid value is, in one phrase: ``"null or a number >= 0"``."""
        if self.choices:
            text = "one of " + ", ".join(map(str, self.choices))
        else:
            bounds = ([] if self.low is None else [f"{'>' if self.low_open else '>='} {self.low:g}"]) + \
                     ([] if self.high is None else [f"< {self.high:g}"])
            text = " ".join([_KINDS[self.type], " and ".join(bounds)]).strip()
        return ("null or " if self.default is None else "") + text

    def _typed(self, value: Any) -> bool:
        if isinstance(value, bool) or self.type is bool:  # a bool is never a number
            return isinstance(value, bool) and self.type is bool
        if self.type is float:
            return isinstance(value, (int, float))
        return isinstance(value, self.type)

    def _fault(self, value: Any) -> Optional[str]:
        """The rule ``value`` breaks (type, choices, empty, low, high), or None if it is valid."""
        if value is None and self.default is None:
            return None
        if not self._typed(value):
            return "type"
        if isinstance(value, float) and not math.isfinite(value):
            return "finite"
        if self.choices and value not in self.choices:
            return "choices"
        if self.type is str and not value:
            return "empty"
        if self.low is not None and not (value > self.low or (value == self.low and not self.low_open)):
            return "low"
        if self.high is not None and not value < self.high:
            return "high"
        if self.valid is not None and value is not None and self.valid(value):
            return "valid"
        return None

    def check(self, value: Any) -> Optional[str]:
        """``None`` if ``value`` is valid, else the whole expectation: ``"expected an integer >= 1, got 0"``."""
        fault = self._fault(value)
        if fault == "valid":
            return self.valid(value)  # type: ignore[misc]
        kind = self.kind.replace("a number", "a finite number", 1) if fault == "finite" else self.kind
        return None if fault is None else f"expected {kind}, got {value!r}"

    def problem(self, value: Any) -> Optional[str]:
        """``None`` if ``value`` is valid, else the rule it breaks: ``"must be >= 1, got 0"``."""
        fault = self._fault(value)
        null = " or null" if self.default is None else ""
        if fault == "type":
            return f"expected {_WORDS[self.type]}{null}, got {value!r}"
        if fault == "empty":
            return f"expected a non-empty string{null}, got {value!r}"
        if fault == "choices":
            return f"must be one of {', '.join(map(str, self.choices))}, got {value!r}" \
                   f"{did_you_mean(str(value), [str(c) for c in self.choices])}"
        if fault == "low":
            return f"must be {'>' if self.low_open else '>='} {self.low}, got {value!r}"
        if fault == "high":
            return f"must be < {self.high}, got {value!r}"
        if fault == "finite":
            return f"must be a finite number, got {value!r}"
        if fault == "valid":
            return self.valid(value)  # type: ignore[misc]
        return None


def check_options(declared: Mapping[str, Option], given: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """Every problem with ``given`` options as ``(option, message)`` pairs; ``[]`` when all are valid."""
    problems: List[Tuple[str, str]] = []
    for key, value in given.items():
        option = declared.get(key)
        if option is None:
            known = f" (valid: {', '.join(declared)})" if declared else " (this sink takes no options)"
            hint = did_you_mean(key, list(declared))
            problems.append((str(key), f"unknown option{hint or known}"))
            continue
        message = option.check(value)
        if message:
            problems.append((str(key), message))
    return problems + _relation_problems(declared, given, {key for key, _ in problems})


def _relation_problems(declared: Mapping[str, Option], given: Mapping[str, Any],
                       broken: "set[str]") -> List[Tuple[str, str]]:
    """Each ``at_most`` pair whose values (given or default, both valid) are the wrong way round."""
    problems: List[Tuple[str, str]] = []
    for key, option in declared.items():
        other = option.at_most
        if other is None or key in broken or other in broken or (key not in given and other not in given):
            continue
        value, limit = given.get(key, option.default), given.get(other, declared[other].default)
        if value is not None and limit is not None and value > limit:
            said = "" if other in given else " (its default)"
            problems.append((str(key), f"must be <= {other}, which is {limit!r}{said}; got {value!r}"))
    return problems


def with_defaults(declared: Mapping[str, Option], given: Mapping[str, Any]) -> Dict[str, Any]:
    """Every declared option's value: the given one, else its default."""
    return {key: given.get(key, option.default) for key, option in declared.items()}

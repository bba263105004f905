"""The typed ``Option`` every setting and option is declared with, and the one wording of a bad value.

One rule decides what is valid, for msbridge's own settings (``Config``'s fields),
a sink's ``options`` (checked by ``Sink.__init__`` and, before training, by
``load_config`` / ``msbridge config check`` through ``check_options``), a health
check's ``options`` and ``HealthSpec``'s settings, and the ``alerts`` section.
A bad value is worded one way everywhere, by ``expected``: what a valid value
is, then the value given (``expected an integer >= 1, got 0``).

Types: ``bool``; ``int`` (never a bool); ``float``, meaning any number (an int or a float, never a
bool); ``str``, a non-empty string; or any other class, or tuple of classes (a list, a mapping),
whose valid values ``what`` names. ``None`` is allowed exactly when the default is ``None``.

A dataclass declares its settings as fields with ``declare``; ``declared_options`` reads them back.
``did_you_mean`` gives the nearest valid name, for every unknown key and option; within
``suggestion_budget`` (one config check) only the first ``SUGGESTED`` unknown names get one, so
a file of 100,000 misspelt keys is checked in linear time (difflib costs about 0.3 ms a name here).

Example:
    >>> OPTIONS = {"logdir": Option(str, None, "the directory to point tensorboard --logdir at")}
    >>> check_options(OPTIONS, {"logdri": "/tmp/tb"})
    [('logdri', "unknown option; did you mean 'logdir'?")]
    >>> Option(int, 50, "recent losses the median is taken over", low=1).check(0)
    'expected an integer >= 1, got 0'
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import difflib
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

#: What a valid value of each plain type is.
_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a non-empty string"}


def expected(kind: str, value: Any) -> str:
    """The one wording of a bad value: ``expected <what a valid one is>, got <value>``.

    A number where a string is expected gets a hint (YAML reads ``experiment: 42`` as a number).

    Example:
        >>> expected("a non-empty string", 42)
        "expected a non-empty string, got 42 (quote it: '42')"
    """
    quote = isinstance(value, (int, float)) and not isinstance(value, bool) and kind.endswith("a non-empty string")
    return f"expected {kind}, got {_masked(value)!r}" + (f" (quote it: '{value}')" if quote else "")


def _masked(value: Any) -> Any:
    """A bad value as an error shows it: secrets masked, and a ``url`` inside a list or mapping (an alert
    target's holds the bot's token)."""
    from .masking import mask_secrets, mask_text

    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, (Mapping, list, tuple)):
        masked = mask_secrets(value, within=frozenset({"url"}))
        return tuple(masked) if isinstance(value, tuple) else masked
    return value


def _bound(number: float) -> str:
    """A bound as people read it: ``0.15``, ``3600``, ``10_000_000``."""
    return f"{int(number):_}" if float(number).is_integer() and abs(number) >= 10_000 else f"{number:g}"


#: Unknown names one config check suggests a nearest valid name for; the rest are listed without one.
SUGGESTED = 200
#: Characters of an unknown name compared (no valid name is near a longer one; difflib is quadratic in it).
_COMPARED = 100
_BUDGET: contextvars.ContextVar[Optional[List[int]]] = contextvars.ContextVar("suggestion_budget", default=None)


@contextlib.contextmanager
def suggestion_budget(count: int = SUGGESTED):
    """Within the block, ``did_you_mean`` suggests for at most ``count`` names (then answers ``""``)."""
    token = _BUDGET.set([count])
    try:
        yield
    finally:
        _BUDGET.reset(token)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice, or ``""`` (also once ``suggestion_budget`` is spent).

    Example:
        >>> did_you_mean("intreval", ["interval", "flush_steps"])
        "; did you mean 'interval'?"
    """
    budget = _BUDGET.get()
    if budget is not None:
        if budget[0] <= 0:
            return ""
        budget[0] -= 1
    word = str(word)
    if len(word) > _COMPARED:
        return ""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


@dataclass(frozen=True)
class Option:
    """One option: its type, default, meaning and allowed values.

    ``low``/``high`` bound a number (``low`` included unless ``low_open``; ``high`` excluded unless
    ``high_open`` is False); a float is always finite. ``choices`` lists the allowed values. ``what``
    names a valid value where the type alone does not (a regex, a list of ranks; required for a type
    other than bool, int, float and str). ``at_most`` names another option of the same declaration this
    one may not exceed, ``needs`` one without which this one has no effect (``check_options`` checks
    both, defaults included); ``valid`` is a further check of a well-typed value, returning None, the
    problem, or ``""`` when the value is not what ``what`` names (then worded as any bad value is).

    Example:
        >>> Option(float, 10.0, "seconds close keeps retrying", 0).check(-1)
        'expected a number >= 0, got -1'
        >>> Option(float, 0.98, "EMA decay of the loss", low=0, low_open=True, high=1).check(1.0)
        'expected a number > 0 and < 1, got 1.0'
        >>> Option(int, 100, "steps between writes", low=1, high=10_000_000, high_open=False).kind
        'an integer >= 1 and <= 10_000_000'
    """

    type: Any
    default: Any
    doc: str
    low: Optional[float] = None
    low_open: bool = False
    high: Optional[float] = None
    choices: Tuple[Any, ...] = ()
    at_most: Optional[str] = None
    valid: Optional[Callable[[Any], Optional[str]]] = field(default=None, compare=False)
    high_open: bool = True
    needs: Optional[str] = None
    what: Optional[str] = None

    def __post_init__(self) -> None:
        if self.type not in _KINDS and not self.what:
            raise TypeError(f"an Option of type {self.type!r} needs what= (what a valid value is); the plain "
                            f"types are {', '.join(t.__name__ for t in _KINDS)}")
        if self.type not in (int, float) and (self.low, self.high) != (None, None):
            raise TypeError(f"only an int or float Option has bounds, not a {self.type!r} one")

    @property
    def kind(self) -> str:
        """What a valid value is, in one phrase: ``"null or a number >= 0"``."""
        if self.choices:
            text = "one of " + ", ".join(map(str, self.choices))
        else:
            bounds = ([] if self.low is None else [f"{'>' if self.low_open else '>='} {_bound(self.low)}"]) + \
                     ([] if self.high is None else [f"{'<' if self.high_open else '<='} {_bound(self.high)}"])
            text = " ".join([self.what or _KINDS[self.type], " and ".join(bounds)]).strip()
        return ("null or " if self.default is None else "") + text

    def _typed(self, value: Any) -> bool:
        if self.type not in _KINDS:
            return isinstance(value, self.type)
        if isinstance(value, bool) or self.type is bool:  # a bool is never a number
            return isinstance(value, bool) and self.type is bool
        if self.type is float:
            return isinstance(value, (int, float))
        return isinstance(value, self.type)

    def _fault(self, value: Any) -> Optional[str]:
        """The rule ``value`` breaks (type, finite, choices, empty, low, high), or None: ``valid`` comes after."""
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
        if self.high is not None and not (value < self.high or (value == self.high and not self.high_open)):
            return "high"
        return None

    def check(self, value: Any) -> Optional[str]:
        """``None`` if ``value`` is valid, else the whole expectation: ``"expected an integer >= 1, got 0"``."""
        if value is None and self.default is None:
            return None
        fault = self._fault(value)
        if fault is None:
            said = self.valid(value) if self.valid is not None else None
            return expected(self.kind, value) if said == "" else said
        if fault == "finite":
            return expected(self.kind.replace("a number", "a finite number", 1), value)
        hint = did_you_mean(str(value), [str(c) for c in self.choices]) if fault == "choices" else ""
        return expected(self.kind, value) + hint


def declare(kind: Any, default: Any, doc: str, **allowed: Any) -> Any:
    """A dataclass field that declares itself: its default, and its ``Option`` in the field's metadata.

    A mutable default (a list, a mapping) is copied for each instance.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Knobs:
        ...     window: int = declare(int, 50, "recent losses the median is taken over", low=1)
        >>> declared_options(Knobs)["window"].check(0), Knobs().window
        ('expected an integer >= 1, got 0', 50)
    """
    metadata = {"option": Option(kind, default, doc, **allowed)}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def declared_options(cls: Any) -> Dict[str, Option]:
    """The ``Option`` of every field of the dataclass ``cls`` (or instance) that ``declare`` made, in field order."""
    return {f.name: f.metadata["option"] for f in fields(cls) if "option" in f.metadata}


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
    return problems + relation_problems(declared, given, {key for key, _ in problems})


def relation_problems(declared: Mapping[str, Option], given: Mapping[str, Any],
                      broken: "set[str]") -> List[Tuple[str, str]]:
    """Each ``at_most`` pair whose values (given or default, both valid) are the wrong way round, and each
    ``needs`` whose option is unset; options in ``broken`` (already reported) are skipped."""
    problems: List[Tuple[str, str]] = []
    for key, option in declared.items():
        if key in broken:
            continue
        if option.needs is not None and given.get(key) and not given.get(option.needs, declared[option.needs].default):
            problems.append((str(key), f"has no effect without {option.needs}"))
        other = option.at_most
        if other is None or other in broken or (key not in given and other not in given):
            continue
        value, limit = given.get(key, option.default), given.get(other, declared[other].default)
        if value is not None and limit is not None and value > limit:
            said = "" if other in given else " (its default)"
            problems.append((str(key), f"must be <= {other}, which is {limit!r}{said}; got {value!r}"))
    return problems


def with_defaults(declared: Mapping[str, Option], given: Mapping[str, Any]) -> Dict[str, Any]:
    """Every declared option's value: the given one, else its default."""
    return {key: given.get(key, option.default) for key, option in declared.items()}

"""A sink's options, declared with their types in the sink itself.

``load_config`` / ``msbridge config check`` check ``sinks.<name>`` against the
declaration before training, and ``Sink.__init__`` checks the same again for a
sink built by hand or by ``msbridge replay``: one declaration, one check.

Example:
    >>> OPTIONS = {"logdir": Option(str, None, "the directory to point tensorboard --logdir at")}
    >>> check_options(OPTIONS, {"logdri": "/tmp/tb"})
    [('logdri', "unknown option; did you mean 'logdir'?")]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import did_you_mean

_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a non-empty string"}


@dataclass(frozen=True)
class Option:
    """One option of a sink: its type (bool, int, float or str), default, lowest value and meaning.

    ``None`` is allowed exactly when the default is ``None`` (the sink then picks
    a value from the run, e.g. a directory beside the run dirs).

    Example:
        >>> Option(float, 10.0, "seconds close keeps retrying", minimum=0).check(-1)
        'expected a number >= 0, got -1'
    """

    type: type
    default: Any
    doc: str
    minimum: Optional[float] = None

    def __post_init__(self) -> None:
        if self.type not in _KINDS:
            raise TypeError(f"Option type must be one of {', '.join(t.__name__ for t in _KINDS)}, got {self.type!r}")

    @property
    def kind(self) -> str:
        """What a valid value is, in words: ``"null or a number >= 0"``."""
        text = _KINDS[self.type] + ("" if self.minimum is None else f" >= {self.minimum:g}")
        return ("null or " if self.default is None else "") + text

    def check(self, value: Any) -> Optional[str]:
        """``None`` if ``value`` is valid, else what is wrong with it."""
        if value is None and self.default is None:
            return None
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is str:
            ok = isinstance(value, str) and bool(value)
        else:
            kinds = (int,) if self.type is int else (int, float)
            ok = isinstance(value, kinds) and not isinstance(value, bool) and \
                (self.minimum is None or value >= self.minimum)
        return None if ok else f"expected {self.kind}, got {value!r}"


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
    return problems


def with_defaults(declared: Mapping[str, Option], given: Mapping[str, Any]) -> Dict[str, Any]:
    """Every declared option's value: the given one, else its default."""
    return {key: given.get(key, option.default) for key, option in declared.items()}

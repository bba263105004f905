"""Limits on what a config value may be, checked before the value is used: integer size and user regexes.

A hostile or mistyped value is a problem with its key, never a traceback or a hang:
an integer longer than ``MAX_INT_DIGITS`` digits (Python refuses to print one of
4,300 digits, and no setting or hyperparameter needs 40), and a regex longer than
``MAX_REGEX_CHARS`` or nested deeper than ``MAX_REGEX_DEPTH`` groups (Python's
``re`` recurses once per level and overflows on a repeat count above 2**32 - 1).
``compile_user_regex`` is the one way a regex from a config is compiled.

Example:
    >>> compile_user_regex(r"layers\\.(\\d+)\\.").groups
    1
    >>> compile_user_regex("a{4294967296}")
    Traceback (most recent call last):
    ...
    ValueError: 'a{4294967296}' is not a valid regular expression: a repeat count above 65535
"""
from __future__ import annotations

import re
from typing import Any


#: Digits an integer setting or hyperparameter may have (a seed or a count needs about 20).
MAX_INT_DIGITS = 40
#: Characters and nested groups a user regex may have (a regex over parameter names is a line).
MAX_REGEX_CHARS = 1000
MAX_REGEX_DEPTH = 50
#: The largest ``{n}`` / ``{n,m}`` repeat count of a user regex.
MAX_REGEX_REPEAT = 65535

_REPEAT = re.compile(r"(?<!\\)\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")
_LOG10_2 = 0.30103


def int_digits(value: int) -> int:
    """Decimal digits of ``value`` (an estimate within one, without printing it).

    Example:
        >>> int_digits(10 ** 50)
        51
    """
    return int(abs(value).bit_length() * _LOG10_2) + 1


def is_huge_int(value: Any) -> bool:
    """Whether ``value`` is an int (not a bool) of more than ``MAX_INT_DIGITS`` digits."""
    return isinstance(value, int) and not isinstance(value, bool) and int_digits(value) > MAX_INT_DIGITS


def huge_int_problem(digits: int) -> str:
    """The message for an integer of ``digits`` digits."""
    return f"an integer of about {digits:_} digits; at most {MAX_INT_DIGITS} are allowed (a typo, or a pasted blob?)"


def regex_problem(pattern: str) -> str:
    """What makes ``pattern`` too big to compile safely, or ``""``.

    Example:
        >>> regex_problem("(" * 60 + ")" * 60)
        'nested deeper than 50 groups'
    """
    if len(pattern) > MAX_REGEX_CHARS:
        return f"longer than {MAX_REGEX_CHARS} characters ({len(pattern):_})"
    depth = deepest = 0
    escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":  # one inside a class [(] counts too: it only makes the bound stricter
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")" and depth:
            depth -= 1
    if deepest > MAX_REGEX_DEPTH:
        return f"nested deeper than {MAX_REGEX_DEPTH} groups"
    for match in _REPEAT.finditer(pattern):
        counts = [int(text) for text in match.groups() if text]
        if any(count > MAX_REGEX_REPEAT for count in counts):
            return f"a repeat count above {MAX_REGEX_REPEAT}"
    return ""


def compile_user_regex(pattern: str) -> "re.Pattern[str]":
    """``re.compile(pattern)`` for a regex a user wrote, within the limits above.

    Raises:
        ValueError: one line: the pattern is over a limit or is not a valid regex.
    """
    shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
    problem = regex_problem(pattern)
    if not problem:
        try:
            return re.compile(pattern)
        except (re.error, OverflowError, RecursionError, MemoryError) as exc:
            problem = str(exc)
    raise ValueError(f"{shown!r} is not a valid regular expression: {problem}")

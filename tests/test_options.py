"""``msbridge.options``: one ``Option`` rule and one wording of a bad value, for settings, sinks, health and alerts;
a dataclass field that declares itself (``declare``) and the relations between options."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from msbridge.options import Option, check_options, declare, declared_options


@pytest.mark.parametrize("option, value, message", [
    (Option(float, 0.98, "d", low=0, low_open=True, high=1), 1.0, "expected a number > 0 and < 1, got 1.0"),
    (Option(float, 0.98, "d", low=0, low_open=True, high=1), 0, "expected a number > 0 and < 1, got 0"),
    (Option(float, 1.0, "f", 0), math.nan, "expected a finite number >= 0, got nan"),
    (Option(float, 1.0, "f", 0), math.inf, "expected a finite number >= 0, got inf"),
    (Option(float, None, "f", 0, low_open=True), -math.inf, "expected null or a finite number > 0, got -inf"),
    (Option(int, None, "r", 0, high=100), 10 ** 12, "expected null or an integer >= 0 and < 100, got 1000000000000"),
    (Option(int, 5, "s", 1, high=10_000_000, high_open=False), 10_000_001,
     "expected an integer >= 1 and <= 10_000_000, got 10000001"),
    (Option(str, None, "u", valid=lambda v: None if v.startswith("http") else "not http"), "ftp://x", "not http"),
    (Option(int, 5, "i", 1), True, "expected an integer >= 1, got True"),
    (Option(str, "debug", "p", choices=("debug", "production")), "debugg",
     "expected one of debug, production, got 'debugg'; did you mean 'debug'?"),
    (Option(str, None, "s"), "", "expected null or a non-empty string, got ''"),
    (Option(str, "x", "s"), 42, "expected a non-empty string, got 42 (quote it: '42')"),
    (Option((list, tuple), None, "r", what="a list of ranks", valid=lambda v: "" if not v else None), [],
     "expected null or a list of ranks, got []"),
    (Option(Mapping, {}, "m", what="a mapping"), [1], "expected a mapping, got [1]"),
])
def test_one_rule_one_wording(option, value, message):
    """The broken rule is said as the whole expectation, in ``expected``'s words, for every type."""
    assert option.check(value) == message


def test_a_bound_may_be_included_and_reads_as_people_write_it():
    inclusive = Option(float, 0.15, "m", low=0, low_open=True, high=100, high_open=False)
    assert inclusive.check(100) is None and inclusive.check(100.5) == "expected a number > 0 and <= 100, got 100.5"
    assert Option(float, 1.0, "t", 0, high=3600).kind == "a number >= 0 and < 3600"


def test_an_empty_answer_of_valid_is_worded_as_what_a_valid_value_is():
    ranks = Option((list, tuple), None, "r", what="a non-empty list of ranks", valid=lambda v: None if v else "")
    assert ranks.check([0, 1]) is None and ranks.check(None) is None
    assert ranks.check(()) == "expected null or a non-empty list of ranks, got ()"
    assert ranks.check("0") == "expected null or a non-empty list of ranks, got '0'"


def test_needs_is_checked_with_the_other_options_value_or_default():
    declared = {"regex": Option(str, None, "r"), "group": Option(str, None, "g", needs="regex")}
    assert check_options(declared, {"group": "x"}) == [("group", "has no effect without regex")]
    assert check_options(declared, {"group": "x", "regex": "y"}) == []
    assert check_options(declared, {"group": 5}) == [("group", "expected null or a non-empty string, got 5 "
                                                              "(quote it: '5')")]  # said once, as a bad value


def test_a_dataclass_declares_its_options_on_its_fields():
    @dataclass(frozen=True)
    class Knobs:
        window: int = declare(int, 50, "recent losses the median is taken over", low=1)
        names: Mapping = declare(Mapping, {"a": 1}, "a mapping", what="a mapping of names")

    first, second = Knobs(), Knobs()
    assert list(declared_options(Knobs)) == ["window", "names"] and declared_options(first) == declared_options(Knobs)
    assert first.window == 50 and first.names == {"a": 1} and first.names is not second.names  # copied per instance
    assert declared_options(Knobs)["window"].check(0) == "expected an integer >= 1, got 0"

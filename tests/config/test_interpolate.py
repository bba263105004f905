"""``${a.b.c}`` references: types, strings, chains, cycles, and their properties."""
from __future__ import annotations

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msbridge.config.interpolate import interpolate
from msbridge.config.load import ConfigError, load_config
from msbridge.config.yaml_lines import Origin, Tree


def resolve(data):
    tree, problems, failed, _ = interpolate(Tree(data, {}))
    return tree.data, problems, failed


def test_whole_value_keeps_type_and_embedded_becomes_string():
    data, problems, _ = resolve({"m": {"n": 10, "on": True, "lr": 1e-4, "sub": {"k": [1, 2]}},
                                 "a": "${m.n}", "b": "${m.on}", "c": "${m.sub}", "d": "lr=${m.lr} on=${m.on}",
                                 "e": "${m.sub.k.1}"})
    assert problems == []
    assert (data["a"], data["b"], data["c"], data["e"]) == (10, True, {"k": [1, 2]}, 2)
    assert data["d"] == "lr=0.0001 on=true"


def test_references_follow_chains_and_escape_writes_a_literal():
    data, problems, _ = resolve({"a": "${b}", "b": "${c.d}", "c": {"d": 7}, "lit": "cost: $${not.a.ref}"})
    assert problems == [] and data["a"] == 7 and data["lit"] == "cost: ${not.a.ref}"


def test_cycle_shows_the_chain():
    _, problems, failed = resolve({"a": {"b": "${c.d}"}, "c": {"d": "${a.b}"}})
    assert problems[0] == "a.b: reference cycle: a.b -> c.d -> a.b"
    assert failed == {("a", "b"), ("c", "d")}


def test_self_and_parent_cycles():
    _, problems, _ = resolve({"x": "${x}"})
    assert problems == ["x: reference cycle: x -> x"]
    _, problems, _ = resolve({"a": {"b": "${a}"}})
    assert problems == ["a.b: reference cycle: a.b -> a -> a.b"]


def test_missing_reference_names_the_chain_and_suggests():
    tree = Tree({"monitor_config": {"per_print_times": 10}, "cb": "${monitor_config.per_print_time}"},
                {("cb",): Origin("run.yaml", 9)})
    _, problems, _, _ = interpolate(tree)
    assert problems == ["run.yaml:9: cb: ${monitor_config.per_print_time}: 'monitor_config.per_print_time' is "
                        "not defined; did you mean 'per_print_times'? (cb -> monitor_config.per_print_time)"]


def test_a_mapping_cannot_be_embedded_in_a_string():
    _, problems, _ = resolve({"m": {"a": 1}, "s": "x${m}"})
    assert problems == ["s: ${m} is a mapping and cannot be part of a string; refer to it as the whole value"]


def test_references_cross_sections_after_set_and_errors_reach_config_error(tmp_path):
    (tmp_path / "train.yaml").write_text(textwrap.dedent("""\
        monitor_config:
          per_print_times: 10
        callbacks:
          - type: LossMonitor
            per_print_times: ${monitor_config.per_print_times}
        runner_config:
          note: "every ${monitor_config.per_print_times} steps"
    """))
    cfg = load_config(str(tmp_path / "train.yaml"), overrides=["monitor_config.per_print_times=25"])
    assert cfg.params["callbacks"][0]["per_print_times"] == 25
    assert cfg.params["runner_config"]["note"] == "every 25 steps"
    assert cfg.print_interval == 25
    (tmp_path / "bad.yaml").write_text("monitor_config:\n  interval: ${runner_config.steps}\n"
                                       "runner_config: {}\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path / "bad.yaml"))
    # one problem: the unresolved value is not reported again as a wrong type
    assert err.value.problems == ["bad.yaml:2: monitor_config.interval: ${runner_config.steps}: "
                                  "'runner_config.steps' is not defined (monitor_config.interval -> "
                                  "runner_config.steps)"]


# -- properties -------------------------------------------------------------------------------
names = st.sampled_from(["a", "b", "c", "d", "e"])
values = st.one_of(st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False),
                   st.text(alphabet="xyz ", max_size=4), st.lists(st.integers(), max_size=3))
trees = st.recursive(values, lambda inner: st.dictionaries(names, inner, min_size=1, max_size=3), max_leaves=10)
roots = st.dictionaries(names, trees, min_size=1, max_size=4)


def leaf_paths(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaf_paths(v, path + (k,))
    elif path:
        yield path, value


@settings(max_examples=100, deadline=None)
@given(roots, st.data())
def test_whole_references_return_the_value_with_its_type(root, data):
    path, value = data.draw(st.sampled_from(list(leaf_paths(root))))
    ref = "${src." + ".".join(path) + "}"
    embeddable = not isinstance(value, list)
    resolved, problems, _ = resolve({"src": root, "whole": ref, **({"text": f"<{ref}>"} if embeddable else {})})
    assert problems == [] and resolved["src"] == root
    assert resolved["whole"] == value and type(resolved["whole"]) is type(value)
    if embeddable:
        shown = {True: "true", False: "false"}[value] if isinstance(value, bool) else (
            "null" if value is None else str(value))
        assert resolved["text"] == f"<{shown}>"


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=8), values)
def test_reference_chains_of_any_length_resolve_to_the_end(length, value):
    data = {f"k{i}": "${k" + str(i + 1) + "}" for i in range(length)}
    data[f"k{length}"] = value
    resolved, problems, _ = resolve(data)
    assert problems == [] and all(resolved[f"k{i}"] == value for i in range(length + 1))


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=7))
def test_every_cycle_is_found_and_shown_closed(length, start):
    data = {f"k{i}": "${k" + str((i + 1) % length) + "}" for i in range(length)}
    _, problems, failed = resolve(data)
    assert len(problems) == length and failed == {(f"k{i}",) for i in range(length)}
    for problem in problems:
        chain = problem.split("reference cycle: ")[1].split(" -> ")
        assert chain[0] == chain[-1] and len(chain) == length + 1

"""YAML loading with line numbers: what plain ``yaml.safe_load`` forgets or hides."""
from __future__ import annotations

import pytest

from msbridge.config.yaml_lines import Origin, Tree, format_path, parse_yaml, yaml_value


def test_every_key_and_list_item_has_its_line():
    text = "monitor_config:\n  interval: 20\n  sinks:\n    - jsonl\n    - tensorboard\n"
    (doc,), problems = parse_yaml(text, "run.yaml")
    assert problems == []
    assert str(doc.origins[("monitor_config",)]) == "run.yaml:1"
    assert str(doc.origins[("monitor_config", "interval")]) == "run.yaml:2"
    assert str(doc.origins[("monitor_config", "sinks", 1)]) == "run.yaml:5"


def test_exponent_floats_load_as_floats_not_strings():
    (doc,), _ = parse_yaml("lr: 1e-4\neps: 1.e-8\nname: 1e\n", "x.yaml")
    assert doc.data == {"lr": 1e-4, "eps": 1e-8, "name": "1e"}


def test_a_key_written_twice_is_a_problem_not_a_silent_overwrite():
    _, problems = parse_yaml("a: 1\nb: 2\na: 3\n", "x.yaml")
    assert problems == ["x.yaml:3: a: key written twice (first at line 1); YAML would silently keep only the last"]


def test_merge_keys_are_not_duplicates_and_explicit_keys_win():
    text = "base: &b\n  x: 1\n  y: 2\nchild:\n  <<: *b\n  y: 3\n"
    (doc,), problems = parse_yaml(text, "x.yaml")
    assert problems == []
    assert doc.data["child"] == {"x": 1, "y": 3}


def test_syntax_error_names_the_line():
    _, problems = parse_yaml("a: 1\nb: [1, 2\nc: 3\n", "bad.yaml")
    assert len(problems) == 1 and problems[0].startswith("bad.yaml:") and "YAML syntax error" in problems[0]


def test_documents_are_split_and_a_non_mapping_top_level_is_a_problem():
    docs, problems = parse_yaml("a: 1\n---\n- x\n---\nb: 2\n", "x.yaml")
    assert [d.data for d in docs] == [{"a": 1}, {"b": 2}]
    assert problems == ["x.yaml:3: the top level must be a mapping of keys, got a list of 1 item (not shown: is this "
                        "the right file?)"]


def test_empty_file_is_no_documents_and_no_problem():
    assert parse_yaml("", "x.yaml") == ([], [])


def test_document_end_marker_ends_the_document():
    (doc,), problems = parse_yaml("a:\n  b: 1\n...\n", "x.yaml")
    assert problems == [] and doc.data == {"a": {"b": 1}}


@pytest.mark.parametrize("text, value", [("5", 5), ("true", True), ("[a, b]", ["a", "b"]), ("0.5", 0.5),
                                         ("hello", "hello"), ("'5'", "5"), ("", None), ("1e-3", 1e-3)])
def test_set_values_are_typed_as_yaml(text, value):
    assert yaml_value(text) == value and type(yaml_value(text)) is type(value)


def test_invalid_set_value_raises_value_error():
    with pytest.raises(ValueError):
        yaml_value("[1, 2")


def test_format_path_and_nearest_origin():
    tree = Tree({"a": [{"b": 1}]}, {("a",): Origin("f.yaml", 3)})
    assert format_path(("a", 0, "b")) == "a[0].b"
    assert tree.origin_of(("a", 0, "b")) == Origin("f.yaml", 3)
    assert tree.origin_of(("z",)) is None

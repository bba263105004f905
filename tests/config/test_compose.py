"""Composition: base files, ``---`` documents, ``--set`` overrides; deep-merge properties."""
from __future__ import annotations

import copy
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msbridge.config.compose import compose, deep_merge, set_path
from msbridge.config.load import ConfigError, load_config


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_base_config_deep_merges_mappings_and_replaces_lists(tmp_path):
    write(tmp_path / "base.yaml", """\
        experiment: base-exp
        tags: {team: nlp, owner: ann}
        sinks: [jsonl, tensorboard]
    """)
    run = write(tmp_path / "run.yaml", """\
        base_config: base.yaml
        tags: {owner: bob}
        sinks: [mlflow]
    """)
    cfg = load_config(str(run))
    assert cfg.experiment == "base-exp"
    assert dict(cfg.tags) == {"team": "nlp", "owner": "bob"}
    assert sorted(cfg.sinks) == ["jsonl", "mlflow"]  # the list was replaced; jsonl is always on


def test_base_list_applies_in_order_and_nested_bases_first(tmp_path):
    write(tmp_path / "common" / "root.yaml", "flush_steps: 1\nprint_interval: 1\n")
    write(tmp_path / "common" / "a.yaml", "base: root.yaml\nflush_steps: 2\n")
    write(tmp_path / "b.yaml", "flush_steps: 3\nstep_interval: 3\n")
    run = write(tmp_path / "run.yaml", "base: [common/a.yaml, b.yaml]\nstep_interval: 4\n")
    cfg = load_config(str(run))
    assert (cfg.flush_steps, cfg.print_interval, cfg.step_interval) == (3, 1, 4)


def test_base_paths_written_from_a_repo_root_resolve_through_parent_dirs(tmp_path):
    write(tmp_path / "configs" / "llama2" / "base.yaml", "experiment: from-root\n")
    run = write(tmp_path / "configs" / "llama2" / "run.yaml", "base: [configs/llama2/base.yaml]\n")
    assert load_config(str(run)).experiment == "from-root"


def test_later_documents_override_in_order(tmp_path):
    run = write(tmp_path / "run.yaml", """\
        flush_steps: 10
        print_interval: 5
        ---
        flush_steps: 20
        ---
        flush_steps: 30
    """)
    cfg = load_config(str(run))
    assert (cfg.flush_steps, cfg.print_interval) == (30, 5)
    assert cfg.provenance.origin(("flush_steps",)) == ("run.yaml:6", "flush_steps")


def test_include_cycle_shows_the_chain(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(tmp_path / "a.yaml"))
    assert err.value.problems == ["b.yaml:1: base: base files include each other: a.yaml -> b.yaml -> a.yaml"]


def test_missing_base_and_bad_base_value_are_reported_together(tmp_path):
    run = write(tmp_path / "run.yaml", "base: [nope.yaml]\nflush_steps: 0\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(run))
    assert err.value.problems[0].startswith("run.yaml:1: base: cannot find 'nope.yaml'")
    assert err.value.problems[1] == "run.yaml:2: flush_steps: expected an integer >= 1 and <= 10_000_000, got 0"
    run = write(tmp_path / "run2.yaml", "base_config: 5\n")
    with pytest.raises(ConfigError, match=r"run2.yaml:1: base_config: expected a file path or a list"):
        load_config(str(run))


def test_base_only_in_the_first_document(tmp_path):
    run = write(tmp_path / "run.yaml", "flush_steps: 2\n---\nbase: other.yaml\n")
    with pytest.raises(ConfigError, match=r"run.yaml:3: base: only the first document may name base files"):
        load_config(str(run))


def test_set_overrides_are_yaml_typed_and_marked(tmp_path):
    run = write(tmp_path / "run.yaml", "flush_steps: 10\n")
    cfg = load_config(str(run), overrides=["flush_steps=50", "memory=true", "sinks=[jsonl, tensorboard]",
                                           "tags.owner=ann", "experiment='007'"])
    assert (cfg.flush_steps, cfg.memory, cfg.experiment) == (50, True, "007")
    assert sorted(cfg.sinks) == ["jsonl", "tensorboard"] and dict(cfg.tags) == {"owner": "ann"}
    assert cfg.provenance.origin(("flush_steps",)) == ("--set", "flush_steps")


def test_set_in_a_training_yaml_goes_into_the_monitor_section(tmp_path):
    run = write(tmp_path / "train.yaml", """\
        optimizer: {learning_rate: 0.1}
        monitor_config:
          interval: 10
    """)
    cfg = load_config(str(run), overrides=["flush_steps=7", "params.optimizer.learning_rate=0.5",
                                           "optimizer.weight_decay=0.01"])
    assert cfg.flush_steps == 7  # --set beats the file's interval: a later layer
    assert dict(cfg.params["optimizer"]) == {"learning_rate": 0.5, "weight_decay": 0.01}
    notes = [n.text for n in cfg.provenance.notes]
    assert "flush_steps -> monitor_config.flush_steps" in notes
    assert any(t.startswith("monitor_config.flush_steps overrides monitor_config.interval") for t in notes)


@pytest.mark.parametrize("sinks", [["jsonl", "tensorboard", "mlflow"], "mlflow", {"jsonl": {}, "mlflow": None}])
def test_set_reaches_a_sink_written_as_a_list_a_name_or_a_mapping(tmp_path, sinks):
    cfg = load_config({"sinks": sinks}, overrides=["sinks.mlflow.tracking_uri=http://127.0.0.1:5000",
                                                   "sinks.mlflow.close_timeout=2"])
    assert dict(cfg.sinks["mlflow"]) == {"tracking_uri": "http://127.0.0.1:5000", "close_timeout": 2}
    names = sinks if isinstance(sinks, list) else [sinks] if isinstance(sinks, str) else list(sinks)
    assert sorted(cfg.sinks) == sorted(set(names) | {"jsonl"})  # the same sinks, now with options
    assert cfg.provenance.origin(("sinks", "mlflow", "tracking_uri")) == ("--set", "sinks.mlflow.tracking_uri")


def test_set_reaches_a_sink_listed_in_a_training_yamls_section_and_keeps_its_line(tmp_path):
    run = write(tmp_path / "train.yaml", """\
        model: {}
        monitor_config:
          sinks:
            - jsonl
            - tensorboard
    """)
    cfg = load_config(str(run), overrides=["sinks.tensorboard.logdir=./tb"])
    assert dict(cfg.sinks) == {"jsonl": {}, "tensorboard": {"logdir": "./tb"}}
    assert cfg.provenance.origin(("sinks", "jsonl"))[0].endswith("train.yaml:4")


def test_bad_set_arguments_are_problems(tmp_path):
    run = write(tmp_path / "train.yaml", "model: {}\nmonitor_config: {}\ncallbacks: [{type: A}]\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(run), overrides=["flush_steps", "flush_stesp=3", "model=1", "model.x.y=2",
                                         "callbacks.3.type=B", "interval=[1"])
    assert err.value.problems[:4] == [
        "--set 'flush_steps': expected KEY=VALUE, e.g. monitor_config.interval=50",
        "--set flush_stesp: unknown key; did you mean 'flush_steps'?",
        "--set model.x.y: model is 1, not a mapping",
        "--set callbacks.3.type: callbacks is a list of 1 items; 3 is not one of its indexes",
    ]
    assert err.value.problems[4].startswith("--set interval: the value '[1' is not valid YAML")


def test_dict_source_composes_like_a_file(tmp_path):
    write(tmp_path / "base.yaml", "experiment: e1\n")
    tree, notes, problems = compose({"base": str(tmp_path / "base.yaml"), "flush_steps": 3}, ["print_interval=2"])
    assert problems == [] and notes == []
    assert tree.data == {"experiment": "e1", "flush_steps": 3, "print_interval": 2}


# -- properties -------------------------------------------------------------------------------
keys = st.sampled_from(["a", "b", "c", "d"])
scalars = st.one_of(st.integers(), st.booleans(), st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2))
trees = st.recursive(scalars, lambda inner: st.dictionaries(keys, inner, max_size=4), max_leaves=12)
mappings = st.dictionaries(keys, trees, max_size=4)


def leaves(value, path=()):
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from leaves(v, path + (k,))
    else:
        yield path, value


def get(value, path):
    for part in path:
        value = value[part]
    return value


@settings(max_examples=100, deadline=None)
@given(mappings, mappings)
def test_merge_keeps_every_leaf_of_the_override_and_untouched_base_leaves(base, over):
    merged = deep_merge(base, over)
    for path, value in leaves(over):
        if path and value == {}:
            assert isinstance(get(merged, path), dict)  # an empty mapping merges into what was there
        elif path:
            assert get(merged, path) == value
    for path, value in leaves(base):
        if path and not _overridden(over, path):
            assert get(merged, path) == value


def _overridden(over, path):
    """Whether ``over`` reaches ``path`` (replaces it or a parent of it)."""
    node = over
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        if not isinstance(node[part], dict):
            return True
        node = node[part]
    return True


@settings(max_examples=100, deadline=None)
@given(mappings, mappings)
def test_merge_is_idempotent_has_identity_and_does_not_mutate(base, over):
    before = (copy.deepcopy(base), copy.deepcopy(over))
    merged = deep_merge(base, over)
    assert (base, over) == before
    assert deep_merge(merged, over) == merged
    assert deep_merge(base, {}) == base and deep_merge({}, base) == base
    assert set(merged) == set(base) | set(over)


@settings(max_examples=100, deadline=None)
@given(mappings, st.lists(keys, min_size=1, max_size=3), scalars)
def test_set_path_sets_exactly_that_path(data, path, value):
    original = copy.deepcopy(data)
    problem = set_path(data, tuple(path), value)
    if problem is None:
        assert get(data, path) == value
        for leaf, old in leaves(original):
            if leaf and leaf[:len(path)] != tuple(path) and tuple(path)[:len(leaf)] != leaf:
                assert get(data, leaf) == old
    else:
        assert data == original and ("not a mapping" in problem or "is a list" in problem)


SPELLINGS = {"flush_steps": ["flush_steps", "interval", "collect_freq"], "print_interval": ["per_print_times"],
             "step_interval": ["step_interval"]}


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(SPELLINGS)), st.data(), st.integers(1, 10**6), st.integers(1, 10**6))
def test_set_beats_any_spelling_in_the_file(setting, data, in_file, on_cli):
    spelling = data.draw(st.sampled_from(SPELLINGS[setting]))
    source = {"model": {}, "monitor_config": {spelling: in_file}}
    assert getattr(load_config(source), setting) == in_file
    cfg = load_config(source, [f"{setting}={on_cli}"])
    assert getattr(cfg, setting) == on_cli and cfg.provenance.origin((setting,))[0] == "--set"

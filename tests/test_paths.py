"""Where a run and its experiment's stores go, and names as directories: readable, never escaping, never two in one."""
from __future__ import annotations

import os

import pytest

from msbridge.errors import ConfigError
from msbridge.paths import (
    DEFAULT_EXPERIMENT_DIR,
    MAX_COMPONENT_BYTES,
    experiment_dir_template,
    recorded_experiment_dir,
    render_experiment_dir,
    render_output_dir,
    safe_component,
)

HOSTILE = [
    "run-ü", "run-é", "run-e\u0301", "run-е",  # ü, é precomposed and decomposed, Cyrillic е
    "run-e", "Run-e", "RUN-E",  # case-only differences
    "../escape", "../../etc/passwd", "..", ".", "", "/abs/path", "a/b", "a\\b", "~/home",
    "nul\x00byte", "new\nline", "tab\tname", "space name", "zero\u200bwidth", "rtl\u202eoverride",
    "x" * 300, "实验" * 100, "実験-1", "ｒｕｎ", "run_", "run", "run.", ".hidden", "-dash", "$HOME", "a:b", "a*b?",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_name_is_one_safe_component(tmp_path, name):
    component = safe_component(name)
    assert component and component not in (".", "..") and not component.startswith(".")
    assert "/" not in component and "\x00" not in component and "\\" not in component
    assert len(component.encode("utf-8")) <= MAX_COMPONENT_BYTES + 9
    assert all(ch.isprintable() and not ch.isspace() for ch in component)
    path = tmp_path / component
    path.mkdir()  # the file system takes it
    assert os.path.dirname(str(path)) == str(tmp_path)


def test_distinct_names_never_share_a_directory(tmp_path):
    components = [safe_component(name) for name in HOSTILE]
    assert len(set(components)) == len(HOSTILE)
    for component in components:
        (tmp_path / component).mkdir()
    assert len(os.listdir(tmp_path)) == len(HOSTILE), "distinct on disk too (this file system keeps case)"


def test_a_plain_name_is_kept_and_a_changed_one_says_so_with_a_stable_hash():
    assert safe_component("tiny-lm-lr0.003-20261130-141309") == "tiny-lm-lr0.003-20261130-141309"
    assert safe_component("run-ü") == "run-ü" and safe_component("实验一") == "实验一"
    changed = safe_component("my run/1")
    assert changed.startswith("my_run_1-") and len(changed) == len("my_run_1-") + 8
    assert safe_component("my run/1") == changed and safe_component("my run_1") != changed


def test_the_output_dir_stays_under_its_template(tmp_path):
    template = str(tmp_path / "{experiment}" / "{run_name}")
    for experiment, run_name in [("../..", "../../etc"), ("/abs", "/abs"), ("exp", "a\x00b"), ("", "")]:
        path = render_output_dir(template, experiment, run_name, 0, "t")
        assert os.path.commonpath([path, str(tmp_path)]) == str(tmp_path) and path.count(os.sep) == \
            str(tmp_path).count(os.sep) + 2


@pytest.mark.parametrize("experiment_dir, output_dir, expected", [
    (None, "{experiment_dir}/{run_name}", DEFAULT_EXPERIMENT_DIR),      # the defaults
    ("/data/exp", "{experiment_dir}/{run_name}", "/data/exp"),          # set: used as it is
    ("/data/exp", "/elsewhere/{run_name}", "/data/exp"),
    (None, "./msbridge_runs/{experiment}/{run_name}", "./msbridge_runs/{experiment}"),
    (None, "/some/dir/x", "/some/dir/x"),                               # no per-run part: the output dir itself
    (None, "./out", "./out"),
    (None, "/data/{experiment}/{timestamp}/{run_name}", "/data/{experiment}"),
    (None, "./monitor/rank_{rank}/{experiment}/{run_name}", "./monitor"),
    (None, "./runs/{experiment}-{run_name}", "./runs"),
    (None, "{run_name}", "."),
    (None, "/{run_name}", "/"),
])
def test_experiment_dir_is_set_or_a_leading_part_of_output_dir(experiment_dir, output_dir, expected):
    assert experiment_dir_template(experiment_dir, output_dir) == expected


def test_rendered_dirs_are_absolute_and_names_stay_one_component(tmp_path):
    exp = render_experiment_dir(str(tmp_path / "{experiment}"), "../evil/exp")
    assert exp == str(tmp_path / safe_component("../evil/exp")) and "/" not in safe_component("../evil/exp")
    run = render_output_dir("{experiment_dir}/{run_name}", "e", "r/1", 0, "t", experiment_dir=exp + "/")
    assert run == str(tmp_path / safe_component("../evil/exp") / safe_component("r/1"))
    with pytest.raises(ConfigError, match="only placeholder is {experiment}"):
        render_experiment_dir("/x/{run_name}", "e")
    with pytest.raises(ConfigError, match=r"unknown placeholder 'experiment_dir'"):
        render_output_dir("{experiment_dir}/{run_name}", "e", "r", 0, "t")  # dump_dir has no experiment dir


def test_recorded_experiment_dir_follows_a_moved_run_dir():
    meta = {"run_dir": "/cluster/runs/exp/r1", "experiment_dir": "/cluster/runs/exp"}
    assert recorded_experiment_dir(meta, "/cluster/runs/exp/r1") == "/cluster/runs/exp"
    assert recorded_experiment_dir(meta, "/laptop/copy/exp/r1") == "/laptop/copy/exp"  # moved with it
    apart = {"run_dir": "/scratch/x", "experiment_dir": "/data/exp"}  # a named output_dir outside it
    assert recorded_experiment_dir(apart, "/elsewhere/x") == "/data/exp"
    assert recorded_experiment_dir({}, "/old/exp/r1/") == "/old/exp"  # a run from before: the parent

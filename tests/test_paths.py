"""Where a run and its experiment's stores go: msbridge.paths."""
from __future__ import annotations

import pytest

from msbridge.errors import ConfigError
from msbridge.paths import (
    DEFAULT_EXPERIMENT_DIR,
    experiment_dir_template,
    recorded_experiment_dir,
    render_experiment_dir,
    render_output_dir,
    store_defaults,
    with_store_defaults,
)


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
    assert exp == str(tmp_path / "evil_exp")
    run = render_output_dir("{experiment_dir}/{run_name}", "e", "r/1", 0, "t", experiment_dir=exp + "/")
    assert run == str(tmp_path / "evil_exp" / "r_1")
    with pytest.raises(ConfigError, match="only placeholder is {experiment}"):
        render_experiment_dir("/x/{run_name}", "e")
    with pytest.raises(ConfigError, match=r"unknown placeholder 'experiment_dir'"):
        render_output_dir("{experiment_dir}/{run_name}", "e", "r", 0, "t")  # dump_dir has no experiment dir


def test_store_defaults_fill_only_what_the_options_do_not_place():
    stores = store_defaults("/e")
    assert stores == {"mlflow": {"tracking_uri": "sqlite:////e/mlflow.db"}, "tensorboard": {"logdir": "/e/tensorboard"},
                      "mindinsight": {"summary_base_dir": "/e/summary"}}
    assert with_store_defaults("mlflow", {"close_timeout": 1}, "/e") == {"close_timeout": 1,
                                                                          "tracking_uri": "sqlite:////e/mlflow.db"}
    assert with_store_defaults("mlflow", {"tracking_uri": "http://h:5000"}, "/e") == {"tracking_uri": "http://h:5000"}
    assert with_store_defaults("tensorboard", {"logdir": None}, "/e") == {"logdir": "/e/tensorboard"}
    assert with_store_defaults("jsonl", {}, "/e") == {}


def test_recorded_experiment_dir_follows_a_moved_run_dir():
    meta = {"run_dir": "/cluster/runs/exp/r1", "experiment_dir": "/cluster/runs/exp"}
    assert recorded_experiment_dir(meta, "/cluster/runs/exp/r1") == "/cluster/runs/exp"
    assert recorded_experiment_dir(meta, "/laptop/copy/exp/r1") == "/laptop/copy/exp"  # moved with it
    apart = {"run_dir": "/scratch/x", "experiment_dir": "/data/exp"}  # a named output_dir outside it
    assert recorded_experiment_dir(apart, "/elsewhere/x") == "/data/exp"
    assert recorded_experiment_dir({}, "/old/exp/r1/") == "/old/exp"  # a run from before: the parent

"""Secrets in the shapes that got past masking by key, in real training runs with every sink (MLflow on a
real sqlite store): a YAML alias of an anchored secret (``note: *k``, a tag), a Kubernetes-style env list,
the key names ``signing_key`` / ``ssh_key`` / ``session_key``, ``-p`` / ``--password`` / ``--wandb-key`` /
``--*-token`` / ``--*-key`` on the script's command line, and ``Bearer ...`` in an exception's text. A grep of
every output file, every directory name, the MLflow store and the console finds none of them; a name setting
that holds a secret by alias is refused before anything is written."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
from helpers.training import train_regression
from mindspore.train import Callback
from mlflow.tracking import MlflowClient
from test_secret_faults import MARK, grep

from msbridge import BridgeMonitor
from msbridge.cli.main import main
from msbridge.errors import ConfigError
from msbridge.masking import mask_command, mask_text
from msbridge.sinks.runlog import read_run

RUN_YAML = f"""
experiment: hostile
run_name: planted
flush_steps: 5
print_interval: 5
params:
  hub:
    api_key: &k hf_{MARK}_alias_0001
  note: *k
  said: "the hub key is hf_{MARK}_alias_0001"
  signing_key: {MARK}-signing
  ssh_key: {MARK}-ssh
  session_key: {MARK}-session
  env:
  - name: WANDB_API_KEY
    value: {MARK}-k8s-wandb
  - name: HF_TOKEN
    value: {MARK}-k8s-hf
  - name: WORLD
    value: kept-1
tags:
  copied: *k
"""

ARGV = ["train.py", "-p", f"{MARK}-p", "--password", f"{MARK}-pw", "--wandb-key", f"{MARK}-wandb",
        "--hub-token", f"{MARK}-tok", "--signing-key", f"{MARK}-sk", f"--x-key={MARK}-eq", f"-p{MARK}-glued",
        "--lr", "0.01"]


def configured(tmp_path, text: str = RUN_YAML) -> str:
    (tmp_path / "cfg").mkdir(exist_ok=True)
    path = tmp_path / "cfg" / "run.yaml"  # the one file that holds the secrets: not grepped
    out = tmp_path / "out"
    path.write_text(f"output_dir: {out}/{{experiment}}/{{run_name}}\nsinks:\n  jsonl: {{}}\n  tensorboard: {{}}\n"
                    f"  mindinsight: {{}}\n  mlflow: {{tracking_uri: 'sqlite:///{tmp_path / 'mlflow.db'}'}}\n" + text)
    return str(path)


def everything_written(tmp_path, captured) -> list:
    """The grep of every file and directory name under tmp_path but the config (the run dirs, the MLflow store and
    artifacts), and of the console."""
    (tmp_path / "console.log").write_text(captured.out + captured.err, encoding="utf-8")
    names = [name for _, dirs, files in os.walk(tmp_path) for name in dirs + files if MARK in name]
    places = [p for p in tmp_path.iterdir() if p.name != "cfg"]
    assert {"out", "mlflow.db", "console.log"} <= {p.name for p in places}
    lines = grep(*places)
    return names + [line for line in lines.splitlines() if line]


@pytest.mark.slow
def test_secrets_copied_by_alias_env_lists_key_names_and_argv_are_written_nowhere(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(sys, "argv", ARGV)
    monitor = BridgeMonitor(configured(tmp_path))  # progress on: the console is checked too
    train_regression([monitor], steps=12)
    assert monitor.outcome.status == "FINISHED" and monitor.outcome.undelivered == {}
    run_json = open(os.path.join(monitor.run.run_dir, "run.json"), encoding="utf-8").read()
    assert '"note": "***"' in run_json and '"said": "the hub key is ***"' in run_json and "kept-1" in run_json
    assert "--lr 0.01" in run_json and "-p ***" in run_json and "--wandb-key ***" in run_json
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name == "hostile"])
    assert run.data.params["note"] == "***" and run.data.tags["copied"] == "***"
    assert len(run.data.metrics) > 0
    assert everything_written(tmp_path, capfd.readouterr()) == []
    assert (RUN_YAML + " ".join(ARGV)).count(MARK) == 14, "14 secrets were planted: the grep is not vacuous"


class Unauthorized(Callback):
    """Raises what an HTTP client raises on a 401, quoting the request's header, at step 7."""

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == 7:
            raise RuntimeError(f"401 Unauthorized: Authorization: Bearer eyJ{MARK}.payload9.sig "
                               f"(retry with token hf_{MARK}_alias_0001)")


@pytest.mark.slow
def test_bearer_and_a_known_secret_in_an_exception_are_written_nowhere(tmp_path, capfd):
    monitor = BridgeMonitor(configured(tmp_path))
    with pytest.raises(RuntimeError):
        train_regression([monitor, Unauthorized()], steps=12)
    assert monitor.outcome.status == "FAILED"
    [event] = [e for e in read_run(monitor.run.run_dir).ranks[0].events if e.kind == "exception"]
    assert event.detail["message"] == "401 Unauthorized: Authorization: Bearer *** (retry with token ***)"
    out = capfd.readouterr().out  # stderr holds Python's own traceback of the raise, which msbridge does not write
    assert everything_written(tmp_path, SimpleNamespace(out=out, err="")) == []


NAMED = f"""params:
  hub:
    api_key: &k hf_{MARK}_alias_0001
  note: *k
experiment: hostile
run_name: planted
"""


@pytest.mark.parametrize("setting", ["run_name: *k", "experiment: *k", "run_name: r-{params.hub.api_key}",
                                     "run_name: r-{params.note}"])
def test_a_name_holding_a_secret_is_refused_before_anything_is_written(tmp_path, setting):
    key = setting.split(":")[0]
    text = "\n".join(setting if line.startswith(key + ":") else line for line in NAMED.splitlines())
    with pytest.raises(ConfigError) as err:
        BridgeMonitor(configured(tmp_path, text), progress=False)
    said = str(err.value)
    assert f"{key}: " in said and "a secret" in said and MARK not in said
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlflow.db").exists()


def test_the_command_line_and_text_shapes_are_masked():
    assert mask_command(ARGV) == ("train.py -p *** --password *** --wandb-key *** --hub-token *** --signing-key *** "
                                  "--x-key=*** -p*** --lr 0.01")
    assert mask_text("HTTPError: 401 (Authorization: Bearer ghp_abc123XYZ)") == \
        "HTTPError: 401 (Authorization: Bearer ***)"
    assert mask_text("Bearer authentication failed") == "Bearer authentication failed", "prose stays"


def test_a_value_a_secret_refers_to_is_masked_where_it_stands_too(tmp_path, capsys):
    """``hub: {token: ${params.raw}}``: the token's source, under a key that does not look secret, is the secret."""
    (tmp_path / "run.yaml").write_text(f"params:\n  raw: {MARK}-source-1\n  hub:\n    token: ${{params.raw}}\n"
                                       f"  env:\n  - name: HF_TOKEN\n    value: {MARK}-env-2\n"
                                       f"  copy: {MARK}-env-2\n")
    assert main(["config", "show", str(tmp_path / "run.yaml")]) == 0
    shown = capsys.readouterr().out
    assert "raw: '***'" in shown and "copy: '***'" in shown and MARK not in shown

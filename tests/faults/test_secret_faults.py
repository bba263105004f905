"""Secrets planted in a nested param, a mapping, a list, URLs and a tag; a real training run with every sink
(MLflow through a real ``mlflow server`` whose URI carries a password). ``grep -r`` then finds none of them
under the output dir, in the MLflow server's store and artifacts, or in the console output, and
``msbridge config show`` prints none of them."""
from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from helpers.training import train_regression

from msbridge import BridgeMonitor
from msbridge.bench.servers import MlflowServer
from msbridge.cli.main import main

pytestmark = pytest.mark.slow

MARK = "s3cr3t"  # every planted secret contains it; nothing else does


def grep(*places) -> str:
    """``grep -r -a`` for MARK: the matching lines, or "" when there are none."""
    found = subprocess.run(["grep", "-r", "-a", "-o", f".{{0,40}}{MARK}.{{0,20}}", *map(str, places)],
                           capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr
    return found.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server")) as srv:
        yield srv


def secret_config(out, port):
    return {
        "experiment": "secrets",
        "run_name": "planted",
        "output_dir": str(out / "{experiment}" / "{run_name}"),
        "flush_steps": 10,
        "print_interval": 5,
        "sinks": {"jsonl": {}, "tensorboard": {}, "mindinsight": {},
                  "mlflow": {"tracking_uri": f"http://mluser:{MARK}-mlflow-uri@127.0.0.1:{port}"}},
        "tags": {"data": f"s3://key:{MARK}-tag@bucket/x"},
        "params": {
            "db": {"host": "db.local", "credentials": {"user": "bob", "password": f"{MARK}-nested"}},
            "service": {"auth": {"user": "bob", "token": f"{MARK}-mapping", "scopes": [f"{MARK}-deep-list"]}},
            "db_password_list": [f"{MARK}-list-1", f"{MARK}-list-2"],
            "data_url": f"https://reader:{MARK}-url@data.example/shards",
            "download": f"https://hub.example/model?api_key={MARK}-query&rev=main",
            "optimizer": {"learning_rate": 0.01},
        },
    }


def test_no_planted_secret_reaches_disk_mlflow_or_the_console(tmp_path, server, capfd, caplog):
    out = tmp_path / "out"
    config = secret_config(out, server.port)
    monitor = BridgeMonitor(config)  # progress lines on: the console is part of what is checked
    train_regression([monitor], steps=30)
    assert monitor.outcome.status == "FINISHED" and monitor.outcome.undelivered == {}

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["config", "show", str(path)]) == 0
    assert main(["config", "check", str(path), "--set", f"params.extra_token={MARK}-set"]) == 0

    captured = capfd.readouterr()
    console = tmp_path / "console.log"
    console.write_text(captured.out + captured.err + caplog.text, encoding="utf-8")
    assert f"View run planted at: http://mluser:***@127.0.0.1:{server.port}/" in captured.err, \
        "MLflow's own line is there, masked"
    assert "[msbridge] step 30/30" in captured.out and "password: '***'" in captured.out

    stores = [os.path.join(server.root, name) for name in ("mlflow.db", "artifacts")]
    assert os.path.getsize(stores[0]) > 0 and os.listdir(stores[1])
    assert grep(out, *stores, console) == ""
    assert yaml.safe_dump(config).count(MARK) == 9, "nine secrets were planted: the grep above is not vacuous"

"""Alerts from real MindSpore training on CPU to a real HTTP server on 127.0.0.1.

A NaN batch at step 20, a callback that hangs the step loop at step 30 (bounded, so the test ends), a
healthy run's one-off 2 s pause, and webhooks that are down (connection refused, HTTP 500, an answer that
never comes in time): what arrives, when, how often, and what the training thread pays for it.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml
from helpers.training import regression_data
from helpers.webhook_server import WebhookServer, refused_url
from mindspore.train import Callback

from msbridge import BridgeMonitor
from msbridge.cli.main import main
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')


class StepClock(Callback):
    """Records when each step's end was seen (after the monitor's, which comes first in the list)."""

    def __init__(self, sleep_at=None, sleep_s=0.0, pace_s=0.0):
        super().__init__()
        self.ended = {}
        self.sleep_at, self.sleep_s, self.pace_s = sleep_at, sleep_s, pace_s

    def on_train_step_end(self, run_context):
        step = int(run_context.original_args().cur_step_num)
        self.ended[step] = time.time()
        if step == self.sleep_at:
            time.sleep(self.sleep_s)  # the step loop hangs here (bounded)
        elif self.pace_s:
            time.sleep(self.pace_s)  # a step as long as a small real model's


def write_config(tmp_path, targets, sinks=("jsonl",), settings=None, **alerts):
    path = tmp_path / "monitor.yaml"
    config = {"experiment": "alerts", "run_name": "r", "output_dir": str(tmp_path / "runs" / "{run_name}"),
              "flush_steps": 10, "sinks": list(sinks), "alerts": {"targets": targets, **alerts}, **(settings or {})}
    path.write_text(yaml.safe_dump(config))
    return str(path)


def run(config, steps=30, poison_step=0, clock=None, progress=False):
    monitor = BridgeMonitor(config, progress=progress)
    callbacks = [monitor] + ([clock] if clock else [])
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    model.train(1, regression_data(steps, poison_step=poison_step), callbacks=callbacks, dataset_sink_mode=False)
    return monitor


def events(monitor, kind):
    return [e for e in read_run(monitor.run_dir).ranks[0].events if e.kind == kind]


def alerts_of(server, category):
    return [r for r in server.received if r.body.get("category") == category]


def test_a_nan_at_step_20_reaches_the_webhook_within_5_s_of_its_flush_once(tmp_path):
    with WebhookServer() as server:
        # overhead_budget 0.9: the flush window stays 10 steps (1 ms CPU steps would widen it), so step 20 flushes
        config = write_config(tmp_path, [{"type": "webhook", "url": server.url("webhook/hook/T")}],
                              settings={"overhead_budget": 0.9})
        clock = StepClock()
        monitor = run(config, steps=40, poison_step=20, clock=clock)
        assert server.wait_for(1, 10)
        time.sleep(0.5)  # anything more would have arrived by now: the close waited for the sender
    [nan] = [r.body for r in server.received]  # once: the episode of NaN steps after 20 is one finding
    assert nan["category"] == "nonfinite" and nan["step"] == 20 and nan["kind"] == "anomaly"
    assert nan["values"]["nonfinite"] == "train/loss" and nan["run"] == "r"
    readme = open(os.path.join(monitor.run_dir, "README.md")).read()
    assert nan["links"]["diagnose"].endswith(f"msbridge diagnose {monitor.run_dir}")
    assert nan["links"]["diagnose"] in readme and "view" not in nan["links"]  # as the README says; jsonl only
    flushed = clock.ended[20]  # flush_steps 10: step 20's end flushed steps 11-20, then this callback ran
    assert server.received[0].time - flushed < 5.0
    assert [e.step for e in events(monitor, "anomaly")] == [20]


def test_a_hung_step_loop_records_a_stall_and_alerts_once(tmp_path):
    with WebhookServer() as server:
        config = write_config(tmp_path, [{"type": "webhook", "url": server.url("webhook/hook/T")}],
                              stall_seconds=3)
        clock = StepClock(sleep_at=30, sleep_s=8.0)
        monitor = run(config, steps=40, clock=clock)
        server.wait_for(2, 10)
    [stall] = events(monitor, "stall")
    assert stall.step == 30 and stall.detail["doing"] == "in a step" and stall.detail["seconds_since_step"] >= 3
    [resumed] = events(monitor, "resumed")
    assert resumed.step == 31 and resumed.detail["stalled_s"] >= 7
    stalls = [r for r in server.received if r.body["kind"] == "stall"]
    assert len(stalls) == 1 and stalls[0].body["step"] == 30
    assert stalls[0].time - clock.ended[30] < 3 + 10
    assert [r.body["kind"] for r in server.received] == ["stall", "resumed"]


def test_a_healthy_runs_one_off_2_s_pause_is_not_a_stall(tmp_path):
    with WebhookServer() as server:
        config = write_config(tmp_path, [{"type": "webhook", "url": server.url("webhook/hook/T")}],
                              stall_seconds=6)
        monitor = run(config, steps=30, clock=StepClock(sleep_at=15, sleep_s=2.0))
        (tmp_path / "derived").mkdir()  # no stall_seconds: derived from the step times, at least 300 s
        derived = run(write_config(tmp_path / "derived", [{"type": "webhook", "url": server.url("webhook/hook/T")}]),
                      steps=30, clock=StepClock(sleep_at=15, sleep_s=2.0))
    assert events(monitor, "stall") == [] and events(derived, "stall") == []
    assert server.received == []


def _kept(monitor):
    path = os.path.join(monitor.run_dir, "alerts", "outbox_rank_0.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


@pytest.mark.parametrize("down", ["refused", "error", "hang"])
def test_a_webhook_that_is_down_costs_training_nothing_and_loses_no_alert(tmp_path, down, capsys):
    """The training thread never waits for a webhook: with the server holding the request for 30 s, every
    step after the NaN ends while that request is still unanswered. What was not sent is kept (target by
    index, no URL) and the next ``msbridge replay RUN --to alerts`` sends it."""
    server = WebhookServer(mode="hang" if down == "hang" else "error")
    url = refused_url() if down == "refused" else server.url("webhook/hook/T")
    if down != "refused":
        server.__enter__()
    try:
        config = write_config(tmp_path, [{"type": "webhook", "url": url}], timeout_s=20 if down == "hang" else 1,
                              retries=1, close_wait_s=1)
        clock = StepClock(pace_s=0.02)
        monitor = run(config, steps=150, poison_step=20, clock=clock)
        last_step_end = clock.ended[150]
        if down == "hang":
            assert server.started and server.started[0] < last_step_end, "the request was sent during training"
            assert not server.received, "and was still unanswered when the last step ended"
        [kept] = _kept(monitor)
        assert kept["target"] == 0 and kept["type"] == "webhook" and kept["alert"]["step"] == 20
        assert url not in open(os.path.join(monitor.run_dir, "alerts", "outbox_rank_0.jsonl")).read()
        outcome = json.load(open(os.path.join(monitor.run_dir, "run.json")))["outcome"]
        assert f"msbridge replay {monitor.run_dir} --to alerts" in outcome["not delivered"]["alerts"]
    finally:
        if down != "refused":
            server.__exit__(None, None, None)
    port = int(url.split(":")[2].split("/")[0])
    with WebhookServer(port=port) as fixed:  # the webhook is back, at the same URL
        assert main(["replay", monitor.run_dir, "--to", "alerts"]) == 0
    assert [r.body["step"] for r in fixed.received] == [20] and fixed.received[0].verdict == "ok"
    assert _kept(monitor) == []
    outcome = json.load(open(os.path.join(monitor.run_dir, "run.json")))["outcome"]
    assert outcome["not delivered"] == "none"


def test_a_planted_webhook_token_is_nowhere_in_the_run_the_stores_or_the_console(tmp_path, capfd, caplog):
    token, secret = "PLANTEDtoken8c1d2e", "PLANTEDsecret77f0"
    with WebhookServer(mode="error") as server:  # failures: warnings are logged, the outbox is written
        config = write_config(tmp_path, [{"type": "lark", "url": server.url(f"lark/open-apis/bot/v2/hook/{token}"),
                                          "secret": secret},
                                         {"type": "webhook", "url": server.url(f"webhook/{token}")}],
                              sinks=("jsonl", "tensorboard", "mlflow"), retries=0, close_wait_s=2)
        monitor = run(config, steps=30, poison_step=20, progress=True)
        assert server.received, "the alerts were sent (and refused)"
    captured = capfd.readouterr()
    console = captured.out + captured.err + caplog.text  # progress lines, and every msbridge log line
    assert "step 20" in console and token not in console and secret not in console
    assert "target 1 (lark) did not take the nonfinite alert of step 20" in caplog.text  # said, by index
    runs = os.path.dirname(monitor.run_dir)  # the run dir and the experiment's stores (tensorboard/) beside it
    assert os.path.isdir(os.path.join(runs, "tensorboard")) and os.listdir(os.path.join(runs, "tensorboard"))
    seen = subprocess.run(["grep", "-r", "-l", "nonfinite", runs], capture_output=True, text=True).stdout
    assert os.path.join(runs, "mlflow.db") in seen.split()  # grep reads MLflow's sqlite store: it is searched too
    found = subprocess.run(["grep", "-r", "-l", "-e", token, "-e", secret, runs], capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout == "", found.stdout  # 1: no match anywhere
    assert subprocess.run(["grep", "-r", "-q", token, str(tmp_path / "monitor.yaml")]).returncode == 0  # can match
    assert os.path.exists(os.path.join(monitor.run_dir, "alerts", "outbox_rank_0.jsonl"))

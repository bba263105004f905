"""Each target's request against a real HTTP server on 127.0.0.1 that checks it as the vendor documents it.

The server (tests/helpers/webhook_server.py) computes the Lark and DingTalk signatures from the vendors'
documentation, independently of msbridge:
- Feishu/Lark custom bot: https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot
  (timestamp + "\\n" + secret as the HMAC-SHA256 key over an empty message, base64);
- DingTalk custom robot: https://open.dingtalk.com/document/orgapp/customize-robot-security-settings
  (HMAC-SHA256 keyed by secret over timestamp_ms + "\\n" + secret, base64, URL-encoded, in the query);
- WeCom group robot: https://developer.work.weixin.qq.com/document/path/91770 (markdown message);
- Slack incoming webhook: https://api.slack.com/messaging/webhooks.
"""
from __future__ import annotations

import time

from helpers.webhook_server import GENERIC_KEYS, WebhookServer, refused_url
import pytest

from msbridge.alerts.delivery import deliver
from msbridge.alerts.message import alert_for
from msbridge.alerts.spec import Target
from msbridge.sinks.base import Event, RunInfo

RUN = RunInfo(run_id="id", run_name="tiny-run", experiment="tiny-lm", rank=0, world_size=1, is_global=True,
              run_dir="/runs/tiny-lm/tiny-run", config={"sinks": {"jsonl": {}, "tensorboard": {}}})
NAN = Event("anomaly", 20, 0, 1.7e9, {"check": "nonfinite", "action": "dump", "nonfinite": ["train/loss"],
                                       "loss": float("nan"), "grad_norm": 1.5})


def _alert():
    return alert_for(NAN, "nonfinite", RUN)


@pytest.mark.parametrize("kind,secret", [("webhook", None), ("slack", None), ("lark", None), ("lark", "SECr3t"),
                                         ("dingtalk", None), ("dingtalk", "SECd1ng"), ("wecom", None)])
def test_each_target_sends_its_documented_request_and_it_is_accepted(kind, secret):
    secrets = {kind: secret} if secret else {}
    with WebhookServer(secrets=secrets) as server:
        suffix = "?access_token=TOK" if kind == "dingtalk" else ("?key=KEY" if kind == "wecom" else "")
        target = Target(0, kind, server.url(f"{kind}/hook/TOK") + suffix, secret)
        assert deliver(target, _alert(), retries=0, timeout_s=5) is None
        assert server.wait_for(1, 5)
    got = server.received[0]
    assert got.verdict == "ok", got
    text = str(got.body)
    assert "tiny-run" in text and "step 20" in text and "train/loss" in text
    assert "msbridge diagnose /runs/tiny-lm/tiny-run" in text and "msbridge view /runs/tiny-lm/tiny-run" in text
    if kind == "webhook":
        assert GENERIC_KEYS <= set(got.body) and got.body["step"] == 20 and got.body["kind"] == "anomaly"
        assert got.body["values"]["loss"] == "nan" and got.body["values"]["grad_norm"] == 1.5
    if kind == "dingtalk":
        assert got.query["access_token"] == "TOK"  # the robot's own parameter is kept
        if secret:
            assert abs(int(got.query["timestamp"]) / 1000 - time.time()) < 60  # milliseconds, as documented
    if kind == "lark" and secret:
        assert abs(int(got.body["timestamp"]) - time.time()) < 60  # seconds, as documented


@pytest.mark.parametrize("kind", ["lark", "dingtalk"])
def test_a_wrong_secret_is_refused_by_the_bot_and_reported_as_not_delivered(kind):
    with WebhookServer(secrets={kind: "the-right-one"}) as server:
        target = Target(0, kind, server.url(f"{kind}/hook/TOK") + ("?access_token=T" if kind == "dingtalk" else ""),
                        "a-wrong-one")
        error = deliver(target, _alert(), retries=0, timeout_s=5)
    assert server.received[0].verdict != "ok"
    assert error is not None and "answered error" in error


@pytest.mark.slow
def test_refused_500_and_timeout_are_errors_after_bounded_retries():
    alert = _alert()
    start = time.monotonic()
    assert "not reachable" in deliver(Target(0, "webhook", refused_url()), alert, retries=2, timeout_s=1,
                                      backoff_s=0.05)
    with WebhookServer(mode="error") as server:
        assert deliver(Target(0, "webhook", server.url("webhook/x")), alert, retries=2, timeout_s=2,
                       backoff_s=0.05) == "HTTP 500 Internal Server Error"
        assert server.wait_for(3, 5) and len(server.received) == 3  # one try and two retries
    with WebhookServer(mode="hang", hang_s=5) as server:
        error = deliver(Target(0, "webhook", server.url("webhook/x")), alert, retries=0, timeout_s=0.5)
    assert error is not None and "timed out" in error
    assert time.monotonic() - start < 20

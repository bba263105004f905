"""Each target's request, in the format its vendor documents, and how to read its answer.

- ``webhook``: the ``Alert`` as JSON (``Alert.payload``; schema in docs/alerts.md).
- ``slack``: an incoming webhook: ``{"text": ..., "blocks": [...]}`` (api.slack.com/messaging/webhooks);
  Slack answers ``ok``.
- ``lark``: a Feishu/Lark custom bot: ``{"msg_type": "interactive", "card": ...}``; with a ``secret``, also
  ``timestamp`` (seconds) and ``sign`` = base64(HMAC-SHA256 keyed by ``timestamp + "\\n" + secret`` over an
  empty message) (open.feishu.cn/document/client-docs/bot-v3/add-custom-bot); it answers ``{"code": 0}``.
- ``dingtalk``: a DingTalk custom robot: ``{"msgtype": "markdown", "markdown": {"title", "text"}}``; with a
  ``secret``, ``&timestamp=<ms>&sign=<urlencoded base64(HMAC-SHA256 keyed by secret over timestamp + "\\n" +
  secret)>`` on the URL (open.dingtalk.com/document/orgapp/customize-robot-security-settings); it answers
  ``{"errcode": 0}``.
- ``wecom``: a WeCom group robot: ``{"msgtype": "markdown", "markdown": {"content": ...}}``
  (developer.work.weixin.qq.com/document/path/91770); it answers ``{"errcode": 0}``.

The three chat-bot vendors answer HTTP 200 with an error code in the body (a bad signature, a keyword
missing): ``refusal`` reads it, so such an answer counts as not delivered.

Example:
    >>> alert = Alert("run-1", "tiny-lm", 0, 20, "anomaly", "nonfinite", "NaN", "non-finite loss", {"loss": "nan"})
    >>> url, body, headers = build_request(Target(0, "wecom", "https://qyapi.weixin.qq.com/...?key=K"), alert)
    >>> json.loads(body)["msgtype"]
    'markdown'
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Tuple

from .message import Alert
from .spec import Target

Request = Tuple[str, bytes, Dict[str, str]]
_JSON = {"Content-Type": "application/json; charset=utf-8"}


def lark_sign(timestamp: int, secret: str) -> str:
    """Feishu/Lark: base64 of HMAC-SHA256 with ``f"{timestamp}\\n{secret}"`` as the key, over an empty message."""
    key = f"{timestamp}\n{secret}".encode("utf-8")
    return base64.b64encode(hmac.new(key, b"", digestmod=hashlib.sha256).digest()).decode("ascii")


def dingtalk_sign(timestamp_ms: int, secret: str) -> str:
    """DingTalk: base64 of HMAC-SHA256 keyed by ``secret`` over ``f"{timestamp_ms}\\n{secret}"``, URL-encoded."""
    digest = hmac.new(secret.encode("utf-8"), f"{timestamp_ms}\n{secret}".encode("utf-8"), hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(digest))


def _markdown(alert: Alert, bold: Callable[[str], str] = lambda s: f"**{s}**") -> str:
    lines = alert.text_lines()
    head, rest = lines[0], lines[1:]
    body = [f"- {line}" for line in rest]
    return "\n".join([bold(alert.title), "", head, "", *body])


def _webhook(target: Target, alert: Alert, now: float) -> Request:
    return target.url, _dump(alert.payload()), dict(_JSON)


def _slack(target: Target, alert: Alert, now: float) -> Request:
    lines = alert.text_lines()
    fields = [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, _, v in (line.partition(": ") for line in lines[1:])]
    blocks: List[Dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": alert.title[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": lines[0]}},
    ]
    for start in range(0, len(fields), 10):  # Block Kit: at most 10 fields per section
        blocks.append({"type": "section", "fields": fields[start:start + 10]})
    return target.url, _dump({"text": f"{alert.title}: {lines[0]}", "blocks": blocks}), dict(_JSON)


def _lark(target: Target, alert: Alert, now: float) -> Request:
    card = {"header": {"title": {"tag": "plain_text", "content": alert.title},
                       "template": "green" if alert.category in ("test", "end") else "red"},
            "elements": [{"tag": "div", "text": {"tag": "lark_md", "content": "\n".join(alert.text_lines())}}]}
    body: Dict[str, Any] = {"msg_type": "interactive", "card": card}
    if target.secret:
        stamp = int(now)
        body.update(timestamp=str(stamp), sign=lark_sign(stamp, target.secret))
    return target.url, _dump(body), dict(_JSON)


def _dingtalk(target: Target, alert: Alert, now: float) -> Request:
    body = {"msgtype": "markdown", "markdown": {"title": alert.title, "text": _markdown(alert, lambda s: f"### {s}")}}
    url = target.url
    if target.secret:
        stamp = int(now * 1000)
        url += ("&" if "?" in url else "?") + f"timestamp={stamp}&sign={dingtalk_sign(stamp, target.secret)}"
    return url, _dump(body), dict(_JSON)


def _wecom(target: Target, alert: Alert, now: float) -> Request:
    content = _markdown(alert, lambda s: f'<font color="warning">**{s}**</font>')
    return target.url, _dump({"msgtype": "markdown", "markdown": {"content": content[:4096]}}), dict(_JSON)


_BUILDERS = {"webhook": _webhook, "slack": _slack, "lark": _lark, "dingtalk": _dingtalk, "wecom": _wecom}


def build_request(target: Target, alert: Alert, now: Optional[float] = None) -> Request:
    """``(url, body, headers)`` of ``alert`` for ``target``; signed requests are stamped ``now``."""
    return _BUILDERS[target.type](target, alert, time.time() if now is None else now)


def refusal(target: Target, status: int, body: bytes) -> Optional[str]:
    """Why the target refused an HTTP-2xx answer (a chat bot's error code in the body), or None if accepted."""
    if target.type in ("webhook", "slack"):
        return None
    try:
        answer = json.loads(body.decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError):
        return f"HTTP {status} with a body that is not JSON"
    if not isinstance(answer, dict):
        return None
    code = answer.get("code", answer.get("errcode", answer.get("StatusCode", 0)))
    if code in (0, None):
        return None
    text = answer.get("msg") or answer.get("errmsg") or answer.get("StatusMessage") or ""
    return f"{target.type} answered error {code}: {str(text)[:200]}"


def _dump(body: Dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode("utf-8")

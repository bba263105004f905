"""A real HTTP server on 127.0.0.1 that plays each chat tool's webhook, for the alert tests.

It checks each request the way the vendor documents it and answers as the vendor does (HTTP 200 with an
error code in the body for a bad request or signature); the signatures are computed here from the
vendors' documentation, independently of msbridge's code:

- Feishu/Lark custom bot, "signature verification": https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot
  ``timestamp + "\\n" + secret`` is the HMAC-SHA256 *key*, the message is empty, the digest is base64-encoded;
  ``timestamp`` (seconds) and ``sign`` go in the JSON body; a wrong one answers ``{"code": 19021}``.
- DingTalk custom robot, "加签": https://open.dingtalk.com/document/orgapp/customize-robot-security-settings
  HMAC-SHA256 keyed by the secret over ``timestamp_ms + "\\n" + secret``, base64, then URL-encoded, sent as the
  ``timestamp`` and ``sign`` query parameters; a wrong one answers ``{"errcode": 310000}``.
- WeCom group robot: https://developer.work.weixin.qq.com/document/path/91770
  ``{"msgtype": "markdown", "markdown": {"content": ...}}``, answers ``{"errcode": 0, "errmsg": "ok"}``.
- Slack incoming webhook: https://api.slack.com/messaging/webhooks ``{"text": ...}`` (``blocks`` optional),
  answers ``ok``.
- the generic webhook: msbridge's documented payload (docs/alerts.md).

Modes: ``ok``; ``error`` (HTTP 500); ``hang`` (answers after ``hang_s``, bounded so a test ends).

Example:
    >>> with WebhookServer() as server:
    ...     url = server.url("lark/hook/TOKEN")
    ...     server.wait_for(1, timeout=5)
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

GENERIC_KEYS = {"run", "experiment", "rank", "step", "kind", "message", "values", "links"}


@dataclass
class Received:
    """One request the server took."""

    time: float
    path: str
    query: Dict[str, str]
    body: Any
    verdict: str  # "ok" or why the vendor would refuse it
    raw_path: str = ""
    headers: Dict[str, str] = field(default_factory=dict)


def lark_expected_sign(timestamp: str, secret: str) -> str:
    key = f"{timestamp}\n{secret}".encode("utf-8")
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def dingtalk_expected_sign(timestamp_ms: str, secret: str) -> str:
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp_ms}\n{secret}".encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()  # the query string arrives URL-decoded


class WebhookServer:
    """Threaded server; ``secrets`` maps a vendor (``lark``, ``dingtalk``) to the secret its bot checks."""

    def __init__(self, mode: str = "ok", hang_s: float = 30.0, secrets: Optional[Dict[str, str]] = None,
                 port: int = 0) -> None:
        self.mode, self.hang_s, self.secrets = mode, hang_s, dict(secrets or {})
        self.received: List[Received] = []
        self.started: List[float] = []  # when each request arrived (before a hang)
        self._cond = threading.Condition()
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                server._handle(self)

            def log_message(self, *args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def __enter__(self) -> "WebhookServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait_for(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` requests arrived (True) or ``timeout`` passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.received) >= count, timeout)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length)
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = raw.decode("utf-8", "replace")
        query = dict(urllib.parse.parse_qsl(parsed.query))
        vendor = parsed.path.strip("/").split("/")[0]
        verdict = self._verdict(vendor, body, query, handler.headers.get("Content-Type", ""))
        item = Received(time.time(), parsed.path, query, body, verdict, handler.path, dict(handler.headers))
        self.started.append(item.time)
        if self.mode == "hang":
            self._release.wait(self.hang_s)
        with self._cond:
            self.received.append(item)
            self._cond.notify_all()
        if self.mode == "error":
            return self._answer(handler, 500, b"internal error")
        self._answer(handler, 200, self._vendor_answer(vendor, verdict))

    def _verdict(self, vendor: str, body: Any, query: Dict[str, str], content_type: str) -> str:
        if "application/json" not in content_type or not isinstance(body, dict):
            return "not a JSON object"
        if vendor == "lark":
            if body.get("msg_type") not in ("text", "post", "interactive", "share_chat", "image"):
                return "bad msg_type"
            if body.get("msg_type") == "interactive" and not isinstance(body.get("card"), dict):
                return "interactive without card"
            if "lark" in self.secrets and body.get("sign") != lark_expected_sign(str(body.get("timestamp")),
                                                                                  self.secrets["lark"]):
                return "sign match fail"
        elif vendor == "dingtalk":
            if body.get("msgtype") != "markdown" or not {"title", "text"} <= set(body.get("markdown", {})):
                return "bad markdown"
            if "dingtalk" in self.secrets and query.get("sign") != dingtalk_expected_sign(
                    query.get("timestamp", ""), self.secrets["dingtalk"]):
                return "sign not match"
        elif vendor == "wecom":
            if body.get("msgtype") != "markdown" or not isinstance(body.get("markdown", {}).get("content"), str):
                return "bad markdown"
        elif vendor == "slack":
            if not isinstance(body.get("text"), str) or not body["text"]:
                return "no_text"
        elif not GENERIC_KEYS <= set(body):
            return f"missing {sorted(GENERIC_KEYS - set(body))}"
        return "ok"

    @staticmethod
    def _vendor_answer(vendor: str, verdict: str) -> bytes:
        ok = verdict == "ok"
        if vendor == "lark":
            return json.dumps({"code": 0, "msg": "success"} if ok else {"code": 19021, "msg": verdict}).encode()
        if vendor in ("dingtalk", "wecom"):
            return json.dumps({"errcode": 0, "errmsg": "ok"} if ok else {"errcode": 310000, "errmsg": verdict}).encode()
        return b"ok" if ok else verdict.encode()

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:  # the client gave up (its timeout)
            pass


def refused_url(path: str = "webhook/hook/x") -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/{path}"

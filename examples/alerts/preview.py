"""Render what each alert target receives, as its chat tool shows it, into one HTML page (and a PNG).

The messages are msbridge's real requests (``msbridge.alerts.formats.build_request``) for a NaN at step 20
and a stall on rank 1; each is drawn the way Slack, Feishu/Lark, DingTalk and WeCom lay such a message out
(Block Kit header/section/fields, an interactive card with a red header, markdown), and the generic webhook
as its JSON. docs/alerts.md shows the picture this makes.

    python examples/alerts/preview.py docs/img/alerts.html
    chromium --headless --no-sandbox --hide-scrollbars --window-size=1280,1800 \
        --screenshot=docs/img/alerts.png docs/img/alerts.html
"""
from __future__ import annotations

import html
import json
import re
import sys

from msbridge.alerts.formats import build_request
from msbridge.alerts.message import alert_for
from msbridge.alerts.spec import Target
from msbridge.sinks.base import Event, RunInfo

RUN = RunInfo(run_id="7f3c", run_name="llama-tiny-lr3e-4", experiment="llama-tiny", rank=0, world_size=8,
              is_global=True, run_dir="/data/runs/llama-tiny/llama-tiny-lr3e-4",
              config={"sinks": {"jsonl": {}, "tensorboard": {}, "mlflow": {}}})
NAN = Event("anomaly", 20, 0, 1.7e9, {"check": "nonfinite", "action": "dump", "nonfinite": ["train/loss"],
                                       "loss": float("nan"), "grad_norm": 1843.2})
STALL = Event("stall", 3120, 1, 1.7e9, {"seconds_since_step": 912.4, "stall_seconds": 900.0,
                                         "doing": "in the collective", "step_time_s": 0.42})


def _markdown(text: str) -> str:
    """The little markdown the bots render: ### headings, - lists, **bold**, WeCom's <font color>."""
    out = []
    for line in text.split("\n"):
        safe = html.escape(line)
        safe = re.sub(r"&lt;font color=&quot;warning&quot;&gt;(.*?)&lt;/font&gt;", r"<span class='warn'>\1</span>",
                      safe)
        safe = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", safe)
        if safe.startswith("### "):
            out.append(f"<h3>{safe[4:]}</h3>")
        elif safe.startswith("- "):
            out.append(f"<div class='li'>&bull; {safe[2:]}</div>")
        elif safe:
            out.append(f"<div>{safe}</div>")
    return "\n".join(out)


def _slack(body: dict) -> str:
    parts = []
    for block in body["blocks"]:
        if block["type"] == "header":
            parts.append(f"<h3>{html.escape(block['text']['text'])}</h3>")
        elif "text" in block:
            parts.append(f"<div>{html.escape(block['text']['text'])}</div>")
        else:
            cells = "".join(f"<div class='field'>{_markdown(f['text'].replace('*', '**', 2))}</div>"
                            for f in block["fields"])
            parts.append(f"<div class='fields'>{cells}</div>")
    return "".join(parts)


def _lark(body: dict) -> str:
    card = body["card"]
    return (f"<div class='lark-head'>{html.escape(card['header']['title']['content'])}</div>"
            f"<div class='lark-body'>{_markdown(card['elements'][0]['text']['content'])}</div>")


RENDER = {
    "slack": ("Slack", _slack),
    "lark": ("Feishu / Lark", _lark),
    "dingtalk": ("DingTalk", lambda body: _markdown(body["markdown"]["text"])),
    "wecom": ("WeCom", lambda body: _markdown(body["markdown"]["content"])),
    "webhook": ("generic webhook (JSON body)", lambda body: f"<pre>{html.escape(json.dumps(body, indent=1))}</pre>"),
}

STYLE = """
body { font: 14px -apple-system, 'Segoe UI', 'PingFang SC', sans-serif; background: #eef0f3; margin: 20px; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 18px; }
.chat { background: white; border-radius: 8px; padding: 14px 16px; box-shadow: 0 1px 3px #0002; }
.tool { color: #666; font-size: 12px; margin-bottom: 8px; text-transform: uppercase; letter-spacing: .05em; }
.bot { font-weight: 600; margin-bottom: 6px; } h3 { margin: 4px 0 8px; font-size: 15px; }
.li { margin-left: 8px; } .warn { color: #ff6a00; font-weight: 600; }
.fields { display: grid; grid-template-columns: 1fr 1fr; gap: 6px; margin-top: 8px; } .field { font-size: 13px; }
.lark-head { background: #f54a45; color: white; padding: 8px 10px; border-radius: 6px 6px 0 0; font-weight: 600; }
.lark-body { border: 1px solid #eee; border-top: 0; padding: 8px 10px; }
pre { font-size: 11px; background: #f6f8fa; padding: 8px; overflow: hidden; white-space: pre-wrap; }
"""


def page() -> str:
    cards = []
    for event, cat in ((NAN, "nonfinite"), (STALL, "stall")):
        alert = alert_for(event, cat, RUN)
        for kind, (tool, render) in RENDER.items():
            if event is STALL and kind != "lark":
                continue  # one stall message is enough to show; every target formats it the same way
            _, body, _ = build_request(Target(0, kind, "https://example.invalid/hook"), alert, now=1.7e9)
            cards.append(f"<div class='chat'><div class='tool'>{tool}</div><div class='bot'>msbridge</div>"
                         f"{render(json.loads(body))}</div>")
    return f"<html><head><meta charset='utf-8'><style>{STYLE}</style></head><body><div class='grid'>" \
           f"{''.join(cards)}</div></body></html>"


if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "alerts.html", "w", encoding="utf-8") as fh:
        fh.write(page())

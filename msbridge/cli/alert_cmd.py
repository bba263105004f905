"""``msbridge alert test``: one test message to each alerts target, and which answered;
``msbridge replay RUN_DIR --to alerts``: the alerts a run kept because they could not be sent.

Example:
    $ msbridge alert test --config monitor.yaml
    [msbridge] alert test: target 1 (lark): answered
    [msbridge] alert test: target 2 (slack): FAILED: HTTP 404 Not Found
"""
from __future__ import annotations

import argparse
import os
from typing import Optional, Tuple

from ..config.load import load_config
from ..errors import MsbridgeError

#: Read by ``alert test`` when no --config is given.
DEFAULT_CONFIG = "msbridge.yaml"


def cmd_alert_test(args: argparse.Namespace) -> int:
    """Exit 0 when every target answered, 1 when one did not."""
    from ..alerts.delivery import deliver
    from ..alerts.message import sample_alert

    path = args.config or DEFAULT_CONFIG
    if not os.path.isfile(path):
        raise MsbridgeError(f"{path}: no such config file; pass --config FILE (a YAML with an alerts: section)")
    config = load_config(path, overrides=args.set)
    spec = config.alert_spec
    if not spec.enabled:
        raise MsbridgeError(f"{path}: alerts.targets is empty or absent: there is nothing to test")
    failed = 0
    for target in spec.targets:
        error = deliver(target, sample_alert(f"msbridge alert test ({config.experiment})", config.experiment),
                        retries=min(spec.retries, 1), timeout_s=spec.timeout_s)
        failed += error is not None
        print(f"[msbridge] alert test: {target.label}: {'answered' if error is None else 'FAILED: ' + error}")
    return 1 if failed else 0


def cmd_replay_alerts(run_dir: str, config: str = "") -> int:
    """Send what ``run_dir`` kept; exit 1 while some alert still cannot be sent."""
    from ..offline.replay import mark_delivered

    sent, left = send_kept(os.path.abspath(run_dir), config or None)
    print(f"[msbridge] replayed {sent} kept alert(s) to their targets; {left} still kept")
    if left:
        print("[msbridge] the rest could not be sent either (see the warnings above); replay again later")
        return 1
    mark_delivered(run_dir, "alerts")
    return 0


def send_kept(run_dir: str, config: Optional[str] = None) -> Tuple[int, int]:
    """``msbridge replay RUN_DIR --to alerts``: send every rank's kept alerts; returns ``(sent, still kept)``.

    The targets' URLs are not in the run dir (only masked): they are read from ``config`` or, by default,
    from the config file the run was started with (each outbox line names it).

    Raises:
        MsbridgeError: nothing was kept, or no config file names the targets.
    """
    from ..alerts.delivery import deliver
    from ..alerts.outbox import OUTBOX_DIR, Outbox, outbox_files, resend

    files = outbox_files(run_dir)
    if not files:
        raise MsbridgeError(f"{run_dir}: no alert was kept ({OUTBOX_DIR}/outbox_rank_*.jsonl is absent): "
                            "nothing to send")
    sent = left = 0
    for path in files:
        box = Outbox(run_dir, path=path)
        entries = box.entries()
        source = config or next((e.get("config") for e in entries if e.get("config")), "")
        if not source or not os.path.isfile(source):
            raise MsbridgeError(f"{path}: the run's config file ({source or 'a dict, not a file'}) is not there to "
                                "read alerts.targets from; pass --config FILE")
        spec = load_config(source).alert_spec
        done, kept = resend(box, spec, lambda target, alert: deliver(target, alert, spec.retries, spec.timeout_s))
        sent, left = sent + done, left + kept
    return sent, left


def add_alert_commands(sub: "argparse._SubParsersAction") -> None:
    """``msbridge alert test`` on the ``msbridge`` parser's subcommands ``sub``."""
    alert = sub.add_parser("alert", help="alerts to chat tools: send a test message to each target")
    commands = alert.add_subparsers(dest="alert_command", required=True)
    test = commands.add_parser("test", help="send one test message to each alerts target and say which answered")
    test.add_argument("--config", help=f"the YAML with the alerts: section (default ./{DEFAULT_CONFIG})")
    test.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value (YAML-typed), repeatable")
    test.set_defaults(func=cmd_alert_test)

"""The ``msbridge`` command line.

Example:
    $ msbridge demo --steps 300 --out ./demo_run
    $ msbridge config check monitor.yaml
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from .errors import MsbridgeError


def _quiet_mindspore() -> None:
    os.environ.setdefault("GLOG_v", "3")


def cmd_demo(args: argparse.Namespace) -> int:
    _quiet_mindspore()
    from .callback import BridgeMonitor
    from .config import load_config
    from .demo import demo_config, train

    out = os.path.abspath(args.out)
    config = load_config(args.config if args.config else demo_config(out), overrides=args.set)
    monitor = BridgeMonitor(config)
    print(f"[msbridge] demo: training a tiny causal LM for {args.steps} steps on CPU -> {monitor.run_dir}")
    train(monitor, args.steps, config.params)
    _print_outputs(monitor)
    return 0


def _print_outputs(monitor) -> None:
    from .metadata import view_commands

    run_dir = monitor.run_dir
    print(f"\n[msbridge] done: {monitor.steps_recorded} steps recorded")
    print(f"  run dir : {run_dir}")
    print(f"  README  : {os.path.join(run_dir, 'README.md')}")
    sinks = {s.name: s.describe(monitor.run) for s in monitor.plan.build_sinks()}
    for name, info in sinks.items():
        if info.get("where"):
            print(f"  {name:<8}: {info['where']}")
    print("\n  look at it:")
    for command in view_commands(run_dir, sinks):
        print(f"    {command}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="msbridge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a tiny transformer LM on CPU with every available sink")
    demo.add_argument("--steps", type=int, default=300)
    demo.add_argument("--out", default="./msbridge_runs")
    demo.add_argument("--config", help="a YAML config instead of the embedded demo config")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value (YAML-typed), repeatable")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MsbridgeError as exc:
        print(f"msbridge: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

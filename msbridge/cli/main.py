"""msbridge: train the demo, look at a run, compare a sweep, check a config.

Example:
    $ msbridge demo --steps 300 --out ./demo_runs
    $ msbridge view ./demo_runs/msbridge-demo/<run name>
    $ msbridge config check monitor.yaml
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from typing import List, Optional

from ..errors import MsbridgeError
from ..names import DEFAULT_OBJECTIVES
from ..sinks.base import WAL_NAME
from ..sinks.registry import names as sink_names
from .alert_cmd import add_alert_commands, cmd_replay_alerts
from .analyze import add_analysis_commands, add_strict
from .config_cmd import add_config_commands
from .sweep_cmd import add_sweep_command
from .view import add_view_command

#: Where the demo writes when neither --out nor --config says: the default experiment dirs' root.
DEFAULT_OUT = "./msbridge_runs"


def _quiet_libraries() -> None:
    os.environ.setdefault("GLOG_v", "3")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not its database-migration INFO lines


def cmd_demo(args: argparse.Namespace) -> int:
    """``msbridge demo``: train the demo model (``msbridge.demo``) with msbridge on, print where it all went.

    Returns the run's exit code (``msbridge.run.outcome``): 0 when every sink received everything.
    """
    from ..callback import BridgeMonitor
    from ..demo import demo_config, demo_params, exit_status, train

    if args.config:
        overrides = (out_overrides(args.out) if args.out else []) + list(args.set)
        config = demo_params(_load(args.config, overrides))
    else:
        config = _load(demo_config(os.path.abspath(args.out or DEFAULT_OUT)), args.set)
    monitor = BridgeMonitor(config)
    print(f"[msbridge] demo: training a tiny causal LM for {args.steps} steps on CPU -> {monitor.run_dir}")
    train(monitor, args.steps, config.params)
    _print_outputs(monitor)
    for name, why in monitor.plan.failed_sinks.items():
        print(f"[msbridge] demo: the {name} sink failed in {why}", file=sys.stderr)
    return exit_status(monitor)


def _load(source, overrides):
    from ..config.load import load_config

    return load_config(source, overrides=overrides)


def out_overrides(out: str) -> List[str]:
    """``--out DIR`` as ``--set`` layers: the experiment dir ``DIR/<experiment>``, each run in it.

    Example:
        >>> out_overrides("/runs")
        ['experiment_dir="/runs/{experiment}"', "output_dir='{experiment_dir}/{run_name}'"]
    """
    return [f"experiment_dir={json.dumps(os.path.join(os.path.abspath(out), '{experiment}'))}",
            "output_dir='{experiment_dir}/{run_name}'"]


def _print_outputs(monitor) -> None:
    from ..paths import view_commands

    run_dir = monitor.run_dir
    print(f"\n[msbridge] done: {monitor.steps_recorded} steps recorded")
    print(f"  {'run dir':<11}: {run_dir}")
    print(f"  {'README':<11}: {os.path.join(run_dir, 'README.md')}")
    sinks = monitor.plan.outputs
    for name, info in sinks.items():
        if info.get("where"):
            print(f"  {name:<11}: {info['where']}")
    print("\n  look at it:")
    for command in view_commands(run_dir, sinks):
        print(f"    {command}")


def cmd_replay(args: argparse.Namespace) -> int:
    """``msbridge replay RUN --to SINK``: rebuild one sink (or send the unsent alerts) from the run's jsonl log."""
    from ..masking import mask_text
    from ..offline.replay import replay

    if args.to == "alerts":  # the alerts a run could not send (msbridge.alerts.outbox)
        return cmd_replay_alerts(args.run_dir, args.config)
    options = {"tracking_uri": args.tracking_uri} if args.tracking_uri else {}
    counts = replay(args.run_dir, args.to, options, strict=args.strict)
    target = f" at {mask_text(args.tracking_uri)}" if args.tracking_uri else ""
    print(f"[msbridge] replayed {counts['records']} records and {counts['events']} events "
          f"from {counts['ranks']} rank(s) to {args.to}{target}")
    if counts["truncated"]:
        print(f"[msbridge] {counts['truncated']} cut last line(s) skipped (a killed run); every complete line was used")
    if counts["skipped"]:
        print(f"[msbridge] {counts['skipped']} bad line(s) skipped (see the warning above); every other line was used")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``msbridge compare EXPERIMENT``: the experiment's runs side by side, best first on the objective.

    ``EXPERIMENT`` is what ``msbridge view`` takes (an experiment dir or a run dir) or an experiment name.
    """
    from ..offline.compare import compare, format_table

    experiment, uri = compare_source(args.experiment, args.root, args.tracking_uri)
    print(format_table(compare(experiment, uri, args.objective, args.mode), args.format))
    return 0


def compare_source(given: str, root: str, tracking_uri: Optional[str] = None) -> "tuple[str, str]":
    """``(experiment name, tracking URI)`` for ``msbridge compare GIVEN``.

    A directory is read as ``msbridge view`` reads it: a run dir, or an experiment dir (its ``mlflow.db``,
    else the store of its newest run). Any other ``GIVEN`` is an experiment name in the default store under
    ``root``. ``tracking_uri``, when given, is the store in both cases.
    """
    from ..offline.compare import default_tracking_uri
    from .view import find_target

    if not os.path.isdir(given):
        uri = tracking_uri or default_tracking_uri(given, root)
        experiment = given
    else:
        target = find_target(given)
        stores = dict(target.stores)
        if target.run_id is None and target.run_dir:  # an experiment dir: its own store, else its newest run's
            stores = {**find_target(target.run_dir).stores, **stores}
        experiment = target.experiment or os.path.basename(target.path)
        uri = tracking_uri or stores.get("mlflow")
        if uri is None:
            raise MsbridgeError(f"{target.path} has no MLflow store (no mlflow sink, no mlflow.db); "
                                "pass --tracking-uri")
    if uri.startswith("sqlite:///") and not os.path.exists(uri[len("sqlite:///"):]):
        raise MsbridgeError(f"no MLflow store at {uri[len('sqlite:///'):]}; "
                            "train with the mlflow sink first, or pass --tracking-uri")
    return experiment, uri


def run_bench_program(argv: List[str]) -> int:
    """``msbridge bench ARGS``: the lab's benchmark is a program of its own (``python -m msbridge.bench.suite``);
    the user's command line only starts it, so nothing of the lab is imported here. It waits for the bench
    whatever arrives: a Ctrl-C reaches the bench too (one process group), a SIGTERM or SIGHUP sent here is
    passed on, and the bench stops its servers before it exits."""
    proc = subprocess.Popen([sys.executable, "-m", "msbridge.bench.suite", *argv])
    previous = {sig: signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
                for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sent the bench its own
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def build_parser() -> argparse.ArgumentParser:
    """The ``msbridge`` command line: one subcommand per job, each with its ``func``.

    Example:
        >>> build_parser().parse_args(["replay", "runs/exp/run-1", "--to", "tensorboard"]).to
        'tensorboard'
    """
    parser = argparse.ArgumentParser(prog="msbridge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a tiny transformer LM on CPU with every available sink")
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.add_argument("--out", help=f"write the experiment dir OUT/<experiment> with each run in it (default "
                                    f"{DEFAULT_OUT}; with --config, the config's experiment_dir and output_dir)")
    demo.add_argument("--config", help="a YAML config instead of the embedded demo config (the demo model's "
                                       "params fill in what it does not set)")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value (YAML-typed), repeatable, e.g. sinks.mlflow.tracking_uri=URI")
    demo.set_defaults(func=cmd_demo)

    rep = sub.add_parser("replay", help="rebuild a sink from a run's jsonl write-ahead log (offline mode)")
    rep.add_argument("run_dir", help="the run directory (holds run.json and metrics/rank_*.jsonl)")
    targets = [name for name in sink_names() if name != WAL_NAME] + ["alerts"]
    rep.add_argument("--to", required=True, choices=targets, metavar="SINK",
                     help=f"the sink to rebuild, one of: {', '.join(targets)} (every registered sink, plug-ins "
                          "included; alerts: send the alerts the run could not)")
    rep.add_argument("--config", help="alerts: the config with alerts.targets (default: the run's config file)")
    rep.add_argument("--tracking-uri", help="MLflow tracking URI (default: the one the run was configured with)")
    add_strict(rep)
    rep.set_defaults(func=cmd_replay)

    cmp_ = sub.add_parser("compare", help="a sweep's runs side by side, from MLflow")
    cmp_.add_argument("experiment", metavar="EXPERIMENT",
                      help="an experiment dir or a run dir (what msbridge view takes), or the experiment name the "
                           "runs were logged under")
    cmp_.add_argument("--tracking-uri", help="default: a dir's own store (its mlflow.db, else its newest run's); "
                                             "for a name, sqlite:///<root>/<name>/mlflow.db, the default store")
    cmp_.add_argument("--root", default=DEFAULT_OUT,
                      help=f"the directory holding the experiment dir of the default store (default {DEFAULT_OUT})")
    cmp_.add_argument("--objective", metavar="METRIC",
                      help="rank on this metric (default: the runs' own objective, else the first of "
                           f"{', '.join(DEFAULT_OBJECTIVES)} every run recorded)")
    cmp_.add_argument("--mode", choices=["min", "max"], help="lower or higher is better (default: the runs' own, min)")
    cmp_.add_argument("--format", choices=["text", "csv", "json"], default="text",
                      help="text for people, csv or json for scripts")
    cmp_.set_defaults(func=cmd_compare)

    # listed for --help; ``main`` hands ``msbridge bench ...`` to the bench's own program (its own --help)
    sub.add_parser("bench", help="measure what monitoring costs: throughput vs no monitoring, CPU, RSS")
    add_config_commands(sub)
    add_alert_commands(sub)
    add_analysis_commands(sub)
    add_view_command(sub)
    add_sweep_command(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run one ``msbridge`` command (``argv``: the arguments, default ``sys.argv[1:]``); returns its exit code.

    An ``MsbridgeError`` is printed as one ``msbridge: error:`` line and exits 2, never as a traceback.

    Example:
        >>> main(["compare", "no-such-experiment", "--root", "/nonexistent"])
        2
    """
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    _quiet_libraries()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return run_bench_program(argv[1:])
    try:
        args = build_parser().parse_args(argv)  # --help writes to stdout too
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head`) is met here, not at interpreter exit
        return code
    except MsbridgeError as exc:
        print(f"msbridge: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader of stdout closed it (``msbridge diagnose RUN | head``): stop quietly, as ``head``'s writer
    should. Python's own flush at exit would fail again, so stdout goes to /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1  # what Python's documentation gives a command whose output pipe closed


if __name__ == "__main__":
    sys.exit(main())

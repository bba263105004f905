"""``msbridge sweep SWEEP.yaml [-- COMMAND...]``: run a sweep on Optuna (``msbridge.sweep``).

The sweep file is checked whole before any trial starts (every problem at its file, line and key); then each
trial runs the training command with its values as ``--name=value`` arguments, one line per trial says how it
ended, and the last line is the study's count by state and its best trial. Exit 0 when a trial of this sweep
completed or was pruned (or none was left to run), 1 when every one it ran failed.

Example:
    $ msbridge sweep examples/sweep/sweep.yaml
    $ msbridge sweep sweep.yaml -- python train.py --steps 200
"""
from __future__ import annotations

import argparse
from typing import Any, List, Tuple


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..sweep.runner import run_sweep
    from ..sweep.spec import load_spec
    from ..sweep.study import optuna_module

    join, command = split_command(args.join, list(args.command or []))
    spec = load_spec(args.sweep, command)
    optuna_module()  # the missing extra said before anything is created
    try:
        summary = run_sweep(spec, join=join)
    except KeyboardInterrupt:
        print("[msbridge] sweep: interrupted; rerun the same command to resume the study", flush=True)
        return 130
    print(f"[msbridge] sweep: {summary.line()}", flush=True)
    print(f"[msbridge] sweep: compare the trials: msbridge compare {spec.directory}", flush=True)
    return 1 if summary.ran and not summary.ran.keys() - {"FAIL"} else 0


def split_command(join: bool, words: List[str]) -> Tuple[bool, List[str]]:
    """``(join, command)`` of what follows SWEEP.yaml: argparse leaves ``--join`` written after it in the words.

    Example:
        >>> split_command(False, ["--join", "--", "python", "train.py"])
        (True, ['python', 'train.py'])
    """
    while words[:1] == ["--join"]:
        join, words = True, words[1:]
    return join, words[1:] if words[:1] == ["--"] else words


def add_sweep_command(sub: Any) -> None:
    """Register ``msbridge sweep`` on the subcommands ``sub``."""
    sweep = sub.add_parser("sweep", help="run a hyperparameter sweep on Optuna: trials launched, pruned, compared",
                           description="run a sweep on Optuna: each trial the training command with its values as "
                                       "--name=value, pruned by the monitor, told to the study")
    sweep.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file: study, command, params, trials, jobs, "
                                                           "sampler, pruner, objective, storage (docs/sweeps.md)")
    sweep.add_argument("--join", action="store_true",
                       help="join a study other workers run too (a shared PostgreSQL storage): trials left "
                            "RUNNING are theirs, not a killed sweep's")
    sweep.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                       help="the training command, in place of the file's command key")
    sweep.set_defaults(func=cmd_sweep)

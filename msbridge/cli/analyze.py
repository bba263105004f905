"""The ``msbridge plot`` and ``msbridge diagnose`` subcommands: read a run dir, draw it or judge it.

A directory that is not a run, or a jsonl from a newer schema, is an
``MsbridgeError`` (exit code 2, the message names what is missing or both
schema versions). A last line cut by a killed run is skipped and said; any
other bad line is skipped with one warning naming file:line and the count
(``--strict`` refuses the run instead).

Example:
    $ msbridge plot msbridge_runs/demo/run-1 -o run-1.png
    $ msbridge diagnose msbridge_runs/demo/run-1 --format json
"""
from __future__ import annotations

import argparse
import json
import os

# The readers (numpy: ~0.2 CPU-s a start) are imported by these two commands only, so no other subcommand pays it.


def cmd_plot(args: argparse.Namespace) -> int:
    """``msbridge plot RUN_DIR [-o FILE.png]``: notes first, then the PNG's path (the last line)."""
    from ..offline.diagnose import diagnose
    from ..offline.plot import plot_run
    from ..offline.series import run_notes
    from ..sinks.columns import read_run_columns

    run = read_run_columns(args.run_dir, strict=args.strict)
    output = args.output or os.path.join(args.run_dir, "plot.png")
    for note in run_notes(run):
        print(f"[msbridge] note: {note}")
    print(plot_run(run, output, diagnose(run)))
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    """``msbridge diagnose RUN_DIR [--format text|json]``: exit code 0 whatever it finds."""
    from ..offline.diagnose import diagnose
    from ..sinks.columns import read_run_columns

    report = diagnose(read_run_columns(args.run_dir, strict=args.strict))
    print(json.dumps(report.to_dict(), indent=2) if args.format == "json" else report.to_text())
    return 0


def add_analysis_commands(sub: "argparse._SubParsersAction") -> None:
    """Register ``plot`` and ``diagnose`` on the ``msbridge`` subcommand parser.

    Example:
        >>> sub = argparse.ArgumentParser().add_subparsers()
        >>> add_analysis_commands(sub)
    """
    plot = sub.add_parser("plot", help="draw a run's jsonl into one PNG (needs msbridge[plot])")
    plot.add_argument("run_dir", help="the run directory (holds metrics/rank_*.jsonl)")
    plot.add_argument("-o", "--output", help="PNG path (default: RUN_DIR/plot.png)")
    add_strict(plot)
    plot.set_defaults(func=cmd_plot)
    diag = sub.add_parser("diagnose", help="read a run's jsonl and say what looks wrong, with the evidence")
    diag.add_argument("run_dir", help="the run directory (holds metrics/rank_*.jsonl)")
    diag.add_argument("--format", choices=("text", "json"), default="text", help="text for people, json for scripts")
    add_strict(diag)
    diag.set_defaults(func=cmd_diagnose)


def add_strict(parser: argparse.ArgumentParser) -> None:
    """``--strict``: refuse a run with a bad jsonl line instead of skipping it (one warning) and going on."""
    parser.add_argument("--strict", action="store_true",
                        help="refuse a run whose jsonl has a bad line (default: skip it with a warning)")

"""The settings table of docs/configuration.md, written from the declarations in ``settings.Config``.

Each row is one declaration: the name, what a valid value is (the words a bad
value's error uses), the default as YAML, and the meaning. The table stands
between two marker lines; nothing else of the page is touched. Run from the
repository root:

    $ python -m msbridge.config.reference            # write the table into docs/configuration.md
    $ python -m msbridge.config.reference --check    # exit 1 naming each row to add or remove

Example:
    >>> settings_table().splitlines()[2]
    '| `monitor_on` | true or false | `true` | master switch; false builds nothing and records nothing |'
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, List, Mapping, Optional, Sequence

from ..options import declared_options
from .settings import Config

DOC = "docs/configuration.md"
BEGIN = "<!-- settings table: written by `python -m msbridge.config.reference` from msbridge/config/settings.py -->"
END = "<!-- end of the settings table -->"


def yaml_text(value: Any) -> str:
    """``value`` as YAML's flow style writes it: ``null``, ``true``, ``{margin: 0.15, windows: 3}``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {yaml_text(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_text(item) for item in value) + "]"
    return str(value)


def settings_table(declared: Any = Config) -> str:
    """The markdown table of every setting ``declared`` (a ``Config`` class) declares, in its order."""
    rows = ["| Name | Type | Default | Meaning |", "|---|---|---|---|"]
    for name, option in declared_options(declared).items():
        kind = option.kind.replace("|", "\\|")
        rows.append(f"| `{name}` | {kind} | `{yaml_text(option.default)}` | {option.doc} |")
    return "\n".join(rows)


def table_in(text: str) -> Optional[str]:
    """The table between the markers of ``text``, or None when a marker is missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start + len(BEGIN):end].strip("\n")


def differences(documented: Optional[str], table: str) -> List[str]:
    """What to change so that ``documented`` is ``table``: ``add: ROW`` and ``remove: ROW`` lines."""
    if documented is None:
        return [f"the markers are missing: put the table between {BEGIN!r} and {END!r}"]
    old, new = documented.splitlines(), table.splitlines()
    return [f"add: {row}" for row in new if row not in old] + [f"remove: {row}" for row in old if row not in new]


def with_table(text: str, table: str) -> str:
    """``text`` with the table between its markers replaced by ``table``."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + table + "\n" + text[end:]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write (or with ``--check``, compare) the settings table of ``DOC``; 1 when ``--check`` finds a difference."""
    parser = argparse.ArgumentParser(prog="python -m msbridge.config.reference", description=__doc__.split("\n")[0])
    parser.add_argument("doc", nargs="?", default=DOC, help=f"the page holding the table (default {DOC})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each row that differs")
    args = parser.parse_args(argv)
    with open(args.doc, encoding="utf-8") as fh:
        text = fh.read()
    table = settings_table()
    changes = differences(table_in(text), table)
    if args.check or table_in(text) is None:
        for line in changes:
            print(f"{args.doc}: {line}")
        return 1 if changes else 0
    if changes:
        with open(args.doc, "w", encoding="utf-8") as fh:
            fh.write(with_table(text, table))
        print(f"{args.doc}: the settings table is written ({len(changes)} rows added or removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

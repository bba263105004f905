"""``msbridge config show|check FILE [--set KEY=VALUE ...]``.

``show`` prints the effective config (after base files, ``---`` documents,
``${...}``, ``--set``, dialects and defaults) as YAML, each value commented with
where it came from: ``file:line`` (and the key as written when a dialect
renamed it), ``--set`` or ``default``; the dialect lines and warnings come first,
as comments. Secrets are masked, as everywhere (``msbridge.masking``). ``check``
exits 0 when the config is valid (printing warnings) and 1 with every problem
listed when it is not.

Example:
    $ msbridge config check train.yaml --set monitor_config.interval=50
    $ msbridge config show train.yaml
"""
from __future__ import annotations

import argparse
import logging
from typing import Any, List, Mapping, Optional, Tuple

import yaml

from ..config.compose import plain
from ..config.load import FIELD_NAMES, Config, Provenance, build_config
from ..config.yaml_lines import Path, format_path
from ..errors import ConfigError
from ..masking import mask_secrets, mask_text

Line = Tuple[str, str]


def add_config_commands(subparsers: "argparse._SubParsersAction") -> None:
    """Register ``config show`` and ``config check`` on the ``msbridge`` parser's subparsers.

    Example:
        >>> sub = argparse.ArgumentParser().add_subparsers(dest="command")
        >>> add_config_commands(sub)
    """
    config = subparsers.add_parser("config", help="show the effective config or check a config file")
    commands = config.add_subparsers(dest="config_command", required=True)
    for name, func, text in (("show", cmd_show, "print the effective config and where each value came from"),
                             ("check", cmd_check, "exit 0 if the config is valid, 1 listing every problem")):
        command = commands.add_parser(name, help=text)
        command.add_argument("file", help="a YAML file: pure msbridge, or a training YAML with monitor_config:")
        command.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                             help="override a value (YAML-typed), e.g. monitor_config.interval=50; repeatable")
        command.set_defaults(func=func)


def _load(args: argparse.Namespace) -> Optional[Config]:
    try:
        return build_config(args.file, args.set)
    except ConfigError as exc:
        count = len(exc.problems)
        print(f"{args.file}: {count} problem{'s' if count != 1 else ''}:")
        for problem in exc.problems:
            print(f"  {mask_text(problem)}")
        return None


def cmd_check(args: argparse.Namespace) -> int:
    """``msbridge config check``: 0 if valid (warnings printed), 1 with every problem otherwise."""
    config = _load(args)
    if config is None:
        return 1
    notes = config.provenance.notes
    warnings = config.provenance.warnings
    for warning in warnings:
        print(f"warning: {mask_text(warning)}")
    print(f"{args.file}: ok ({len(notes) - len(warnings)} dialect/precedence notes, {len(warnings)} warnings; "
          "`msbridge config show` prints them)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """``msbridge config show``: the effective config with the origin of every value."""
    config = _load(args)
    if config is None:
        return 1
    print("\n".join(render(config)))
    return 0


def render(config: Config) -> List[str]:
    """The effective config as commented YAML lines."""
    prov = config.provenance
    head = [f"# msbridge config: {prov.source}",
            "# effective values; each comment says where it came from (file:line, --set, or default)"]
    for title, level in (("dialect and precedence", logging.INFO), ("warnings", logging.WARNING)):
        notes = [n for n in prov.notes if n.level == level]
        if notes:
            head += [f"# {title}:"] + [f"#   {mask_text(str(note))}" for note in notes]
    body: List[Line] = []
    _mapping(mask_secrets({name: getattr(config, name) for name in FIELD_NAMES}), (), "", prov, body)
    width = min(max(len(text) for text, _ in body) + 2, 60)
    return head + [f"{text:<{width}}# {origin}" if origin else text for text, origin in body]


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 20).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text


def _origin(prov: Provenance, path: Path, header: bool = False) -> str:
    if path == ("sinks", "jsonl") and path not in prov.origins:
        return "always on"
    if header and path not in prov.origins:
        return ""  # a mapping assembled from several places: its values say where
    where, key = prov.origin(path)
    return where if not key or format_path(path).endswith(key) else f"{where}  ({key})"


def _nested(value: Any) -> bool:
    return isinstance(value, (Mapping, list, tuple)) and bool(value) and (
        isinstance(value, Mapping) or any(isinstance(i, (Mapping, list, tuple)) for i in value))


def _mapping(value: Mapping[Any, Any], path: Path, indent: str, prov: Provenance, out: List[Line]) -> None:
    for key, item in value.items():
        here = path + (key,)
        if _nested(item):
            out.append((f"{indent}{_scalar(key)}:", _origin(prov, here, header=True)))
            _block(item, here, indent + "  ", prov, out)
        else:
            out.append((f"{indent}{_scalar(key)}: {_scalar(plain(item))}", _origin(prov, here)))


def _block(value: Any, path: Path, indent: str, prov: Provenance, out: List[Line]) -> None:
    if isinstance(value, Mapping):
        _mapping(value, path, indent, prov, out)
        return
    for index, item in enumerate(value):
        here = path + (index,)
        if _nested(item):
            sub: List[Line] = []
            _block(item, here, indent + "  ", prov, sub)
            sub[0] = (f"{indent}- {sub[0][0][len(indent) + 2:]}", sub[0][1])
            out.extend(sub)
        else:
            out.append((f"{indent}- {_scalar(plain(item))}", _origin(prov, here)))

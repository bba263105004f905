"""Train the tiny Llama of ``tiny_llama.yaml`` with ``mindformers.Trainer`` on CPU, monitored by msbridge.

    GLOG_v=3 python examples/mindformers/train.py --config examples/mindformers/tiny_llama.yaml \\
        --steps 30 --work /tmp/mfx

What it does, in order (``run_mindformer.py`` is not in the mindformers wheel; this is the
same flow, ``--config`` included):

1. creates ``--work`` and chdirs into it. ``import mindformers`` creates ``./output/log``
   in the current directory, so mindformers is imported only after this step;
2. writes a synthetic MindRecord dataset into ``WORK/data`` (``make_data.py``), with
   enough samples for about ``--steps`` steps: ``ceil(steps / epochs) * batch_size``;
   the YAML's ``dataset_dir`` names it relative to WORK;
3. imports ``cpu_wrapper`` (registers the ``CPUTrainOneStepCell`` WRAPPER) and
   ``msbridge.mindformers`` (registers ``MSBridgeMonitor``), plus each ``--import MODULE``;
4. runs ``Trainer(args=CONFIG, task="text_generation").train()``.

Arguments after the known ones set keys of the run YAML, as ``run_mindformer.py``'s own trailing
arguments do: ``--optimizer.weight_decay=0.1`` (or ``--optimizer.weight_decay 0.1``), each value read
by mindformers' ``parse_value``, before the data is written and the Trainer built. ``msbridge sweep``
appends a trial's values this way. A key that is not in the run YAML is an error naming the file, the
line of its section and the nearest key; nothing trains. In a trial of ``msbridge sweep``, each trial
works in ``WORK/trial-<number>``.

mindformers' logs, MFLossMonitor's per-step lines included, land in
``WORK/output/log/rank_0/info.log``; msbridge's run in ``WORK/msbridge_runs/``.
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

os.environ.setdefault("GLOG_v", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_YAML = os.path.join(HERE, "tiny_llama.yaml")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False,
                                     epilog="--SECTION.KEY=VALUE ...: set keys of the run YAML (run_mindformer.py's "
                                            "convention; msbridge sweep passes a trial's values so)")
    parser.add_argument("--config", default=DEFAULT_YAML, help="mindformers run YAML (default: tiny_llama.yaml)")
    parser.add_argument("--steps", type=int, default=30, help="about this many train steps (default 30)")
    parser.add_argument("--work", required=True, help="work dir: data, output/ and logs go here")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        help="import this module first (e.g. one that registers a callback); repeatable")
    return parser


def dotted_overrides(words: Sequence[str]) -> List[Tuple[str, str]]:
    """``run_mindformer.py``'s trailing arguments as ``(dotted key, value text)`` pairs.

    Example:
        >>> dotted_overrides(["--optimizer.learning_rate=3e-4", "--runner_config.epochs", "2"])
        [('optimizer.learning_rate', '3e-4'), ('runner_config.epochs', '2')]
    """
    pairs, rest = [], list(words)
    while rest:
        word = rest.pop(0)
        key, sep, value = word[2:].partition("=")
        if not word.startswith("--") or not key:
            raise ValueError(f"{word!r}: expected --SECTION.KEY=VALUE (a key of the run YAML)")
        if not sep:
            if not rest:
                raise ValueError(f"{word}: no value (--{key}=VALUE)")
            value = rest.pop(0)
        pairs.append((key, value))
    return pairs


def _dotted_keys(node: Any, prefix: str = "") -> List[str]:
    keys = []
    for key, value in node.items():
        keys.append(prefix + str(key))
        if isinstance(value, dict):
            keys += _dotted_keys(value, f"{prefix}{key}.")
    return keys


def _where(path: str, shown: str, key: str) -> str:
    """``shown:line`` of the deepest section of ``key`` written in ``path`` (``shown`` when none is)."""
    from msbridge.config.yaml_lines import read_yaml

    trees, _ = read_yaml(path, shown)
    origin = next((t.origin_of(tuple(key.split("."))) for t in trees if t.origin_of(tuple(key.split(".")))), None)
    return str(origin) if origin is not None else shown


def _nearest(key: str, config: Any) -> str:
    """The nearest key: among those of the same last name first (``lr_schedule.learning_rate`` for
    ``optimizer.learning_rate``), else among all."""
    from msbridge.options import did_you_mean

    keys = _dotted_keys(config)
    leaf = key.rsplit(".", 1)[-1]
    return did_you_mean(key, [k for k in keys if k.rsplit(".", 1)[-1] == leaf]) or did_you_mean(key, keys)


def apply_overrides(config: Any, pairs: Sequence[Tuple[str, str]], path: str, shown: str) -> None:
    """Set each dotted key of ``config`` (a ``MindFormerConfig``) to its value, read as ``run_mindformer.py``
    reads it (``parse_value``: int, float, bool, JSON, else the text). ``path`` is the run YAML, ``shown`` its name
    as the user gave it.

    Raises:
        ValueError: a key the run YAML does not have, with the file, the line and the nearest key.
    """
    from mindformers.tools.utils import parse_value

    for key, text in pairs:
        *sections, leaf = key.split(".")
        node = config
        for part in sections:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            raise ValueError(f"{_where(path, shown, key)}: --{key}: not a key of the run YAML"
                             f"{_nearest(key, config)}")
        node[leaf] = parse_value(text)


def samples_for(steps: int, batch_size: int, epochs: int) -> int:
    """Rows needed so that ``epochs`` epochs of ``batch_size`` batches make about ``steps`` steps."""
    return max(1, math.ceil(steps / max(1, epochs))) * batch_size


def trial_work(work: str) -> str:
    """``work``, or ``work/trial-<number>`` in a trial of ``msbridge sweep`` (trials never share data or logs)."""
    from msbridge.sweep import ENV_TRIAL, in_trial

    return os.path.join(work, f"trial-{os.environ[ENV_TRIAL]}") if in_trial() else work


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = make_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        pairs = dotted_overrides(rest)
    except ValueError as exc:
        parser.error(str(exc))
    config = os.path.abspath(args.config)
    work = trial_work(os.path.abspath(args.work))
    os.makedirs(work, exist_ok=True)
    os.chdir(work)  # before any mindformers import: it writes ./output/log on import
    if HERE not in sys.path:
        sys.path.insert(0, HERE)

    from make_data import make_mindrecord
    from mindformers import MindFormerConfig, Trainer

    loaded = MindFormerConfig(config)
    try:
        apply_overrides(loaded, pairs, config, args.config)
    except ValueError as exc:
        parser.error(str(exc))
    batch, epochs = loaded.runner_config.batch_size, loaded.runner_config.epochs or 1
    samples = samples_for(args.steps, batch, epochs)
    model = loaded.model.model_config
    make_mindrecord(os.path.join(work, "data"), samples=samples, seq_length=model.seq_length,
                    vocab=model.vocab_size, seed=args.seed)

    import cpu_wrapper  # noqa: F401  (registers CPUTrainOneStepCell)

    import msbridge.mindformers  # noqa: F401  (registers MSBridgeMonitor and MSBridgeRing)
    for name in args.imports:
        importlib.import_module(name)

    print(f"[train.py] {samples} samples, batch {batch}, epochs {epochs}: about {samples // batch * epochs} "
          f"steps; work dir {work}", flush=True)
    start = time.time()
    Trainer(args=loaded if pairs else config, task="text_generation").train()
    log_dir = os.path.join(work, "output", "log", "rank_0")
    print(f"[train.py] done in {time.time() - start:.1f}s. mindformers log: {log_dir}/info.log; "
          f"msbridge runs: {os.path.join(work, 'msbridge_runs')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
from typing import Optional, Sequence

os.environ.setdefault("GLOG_v", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_YAML = os.path.join(HERE, "tiny_llama.yaml")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_YAML, help="mindformers run YAML (default: tiny_llama.yaml)")
    parser.add_argument("--steps", type=int, default=30, help="about this many train steps (default 30)")
    parser.add_argument("--work", required=True, help="work dir: data, output/ and logs go here")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        help="import this module first (e.g. one that registers a callback); repeatable")
    return parser.parse_args(argv)


def samples_for(steps: int, batch_size: int, epochs: int) -> int:
    """Rows needed so that ``epochs`` epochs of ``batch_size`` batches make about ``steps`` steps."""
    return max(1, math.ceil(steps / max(1, epochs))) * batch_size


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    config = os.path.abspath(args.config)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    os.chdir(work)  # before any mindformers import: it writes ./output/log on import
    if HERE not in sys.path:
        sys.path.insert(0, HERE)

    from make_data import make_mindrecord
    from mindformers import MindFormerConfig, Trainer

    loaded = MindFormerConfig(config)
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
    Trainer(args=config, task="text_generation").train()
    log_dir = os.path.join(work, "output", "log", "rank_0")
    print(f"[train.py] done in {time.time() - start:.1f}s. mindformers log: {log_dir}/info.log; "
          f"msbridge runs: {os.path.join(work, 'msbridge_runs')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

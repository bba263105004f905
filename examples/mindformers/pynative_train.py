"""Train a tiny causal LM with mindformers' pynative ``Trainer`` on CPU, monitored by msbridge.

    GLOG_v=3 python examples/mindformers/pynative_train.py --config examples/mindformers/tiny_pynative.yaml \\
        --work /tmp/mfp

mindformers 1.9 ships ``mindformers.pynative.trainer.Trainer`` for a single device. It builds
``- type: MSBridgeMonitor`` from the run YAML's ``callbacks:`` like the graph-mode Trainer and
calls it with its own convention (``on_step_end(args, state, loss=, grad_norm=, ...)``), which
``MSBridgeMonitor`` follows. What this script does, in order:

1. creates ``--work`` and chdirs into it (``import mindformers`` writes ``./output/log``);
2. builds msbridge's demo transformer (``msbridge.demo.build_model``) and synthetic token
   batches. mindformers' own pynative models (``PyNativeQwen3ForCausalLM`` ...) import
   ``hyper_parallel``, which PyPI does not have, so the model is handed to the Trainer. It
   answers ``get_gpt_transformer_config()``, which the Trainer's ``LossCallback`` asks every
   model for (its throughput figure);
3. imports ``msbridge.mindformers`` (registers ``MSBridgeMonitor``) and runs
   ``Trainer(config=CONFIG, model=..., train_dataset=...).train()`` in PYNATIVE mode on CPU.

mindformers' LossCallback lines land in ``WORK/output/log/rank_0/info.log``; msbridge's run in
``WORK/msbridge_runs/``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional, Sequence

os.environ.setdefault("GLOG_v", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = {"vocab_size": 64, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "seq_length": 16}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(HERE, "tiny_pynative.yaml"), help="pynative run YAML")
    parser.add_argument("--work", required=True, help="work dir: output/ and msbridge_runs/ go here")
    return parser.parse_args(argv)


def build(batch_size: int, steps: int, seed: int) -> Any:
    """The model the Trainer trains (``construct(tokens) -> (loss,)``) and its dataset of ``tokens``."""
    import mindspore.dataset as ds
    from mindformers.parallel_core.transformer_config import TransformerConfig
    from mindspore import nn

    from msbridge.demo import build_model, make_tokens

    class TinyLM(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            _, self.loss_net = build_model(**MODEL)
            self.transformer_config = TransformerConfig(
                num_layers=MODEL["num_layers"], hidden_size=MODEL["hidden_size"],
                num_attention_heads=MODEL["num_heads"], ffn_hidden_size=4 * MODEL["hidden_size"],
                vocab_size=MODEL["vocab_size"], seq_length=MODEL["seq_length"])

        def construct(self, tokens):
            return (self.loss_net(tokens),)  # the Trainer takes outputs[0] as the loss

        def get_gpt_transformer_config(self) -> Any:
            return self.transformer_config

    tokens = make_tokens(steps * batch_size, MODEL["seq_length"], MODEL["vocab_size"], seed)
    dataset = ds.NumpySlicesDataset({"tokens": tokens}, shuffle=False).batch(batch_size, drop_remainder=True)
    return TinyLM(), dataset


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    config = os.path.abspath(args.config)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    os.chdir(work)  # before any mindformers import: it writes ./output/log on import

    import mindspore as ms
    import yaml
    from mindformers.pynative.trainer import Trainer

    import msbridge.mindformers  # noqa: F401  (registers MSBridgeMonitor)

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    training = yaml.safe_load(open(config))["training"]
    ms.set_seed(int(training.get("seed", 0)))
    model, dataset = build(int(training["global_batch_size"]), int(training["steps"]), int(training.get("seed", 0)))
    start = time.time()
    Trainer(config=config, model=model, train_dataset=dataset).train()
    print(f"[pynative_train.py] done in {time.time() - start:.1f}s. mindformers log: "
          f"{os.path.join(work, 'output', 'log', 'rank_0', 'info.log')}; msbridge runs: "
          f"{os.path.join(work, 'msbridge_runs')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

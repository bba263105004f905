"""The demo job: a small causal transformer LM on synthetic tokens, trained on CPU with msbridge on.

The data are arithmetic token sequences (``x[t+1] = (x[t] + stride) % vocab``,
a random start and stride per sample): a pattern the model learns within a few
hundred steps, so the loss falls visibly. Every ``eval_every`` steps a callback validates the model on held-out
sequences with ``Model.eval(valid, callbacks=[monitor])``: ``eval/loss`` and ``eval/accuracy`` (next-token
accuracy), recorded at that step.

``msbridge demo`` exits with the run's ``exit_code`` (``exit_status``): 0 when
it finished and every sink received everything, 3 when a sink did not, 4 when
it ended FAILED (a health action stopped it), 5 when KILLED; the table is in
``msbridge.run.outcome``.

Example:
    >>> from msbridge import BridgeMonitor
    >>> from msbridge.demo import demo_config, exit_status, train
    >>> config = demo_config("./demo_runs")
    >>> monitor = train(BridgeMonitor(config), steps=300, params=config["params"])
    >>> exit_status(monitor)
    0
"""
from __future__ import annotations

import copy
import math
import sys
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

DEMO_DEFAULTS: Dict[str, Any] = {
    "model": {"vocab_size": 64, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "seq_length": 32},
    "optimizer": {"learning_rate": 0.003, "warmup_steps": 20, "weight_decay": 0.01, "clip_grad_norm": 1.0},
    "train": {"batch_size": 16, "seed": 7, "mode": "graph", "eval_every": 50, "eval_batches": 4},
}


def make_tokens(num_samples: int, seq_length: int, vocab_size: int, seed: int = 7) -> np.ndarray:
    """``num_samples`` arithmetic sequences of ``seq_length + 1`` tokens (input plus shifted target)."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab_size, size=(num_samples, 1))
    stride = rng.integers(1, 8, size=(num_samples, 1))
    return ((start + stride * np.arange(seq_length + 1)) % vocab_size).astype(np.int32)


def build_model(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, seq_length: int) -> Any:
    """A decoder-only transformer written with MindSpore ``nn``: returns (network, loss_network)."""
    import mindspore as ms
    from mindspore import nn, ops

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm((hidden_size,))
            self.norm2 = nn.LayerNorm((hidden_size,))
            self.qkv = nn.Dense(hidden_size, 3 * hidden_size)
            self.proj = nn.Dense(hidden_size, hidden_size)
            self.mlp = nn.SequentialCell(nn.Dense(hidden_size, 4 * hidden_size), nn.GELU(),
                                         nn.Dense(4 * hidden_size, hidden_size))
            mask = np.triu(np.full((seq_length, seq_length), -1e9, dtype=np.float32), k=1)
            self.mask = ms.Tensor(mask)
            self.heads = num_heads
            self.scale = 1.0 / math.sqrt(hidden_size // num_heads)

        def construct(self, x):
            b, t, d = x.shape
            q, k, v = ops.split(self.qkv(self.norm1(x)), d, axis=-1)
            q = q.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)
            k = k.reshape(b, t, self.heads, -1).transpose(0, 2, 3, 1)
            v = v.reshape(b, t, self.heads, -1).transpose(0, 2, 1, 3)
            attn = ops.softmax(ops.matmul(q, k) * self.scale + self.mask, axis=-1)
            y = ops.matmul(attn, v).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.mlp(self.norm2(x))

    class TinyLM(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, hidden_size)
            self.pos = ms.Parameter(ms.Tensor(np.random.default_rng(0).normal(
                0, 0.02, (1, seq_length, hidden_size)).astype(np.float32)), name="pos")
            self.blocks = nn.CellList([Block() for _ in range(num_layers)])
            self.norm = nn.LayerNorm((hidden_size,))
            self.head = nn.Dense(hidden_size, vocab_size)

        def construct(self, tokens):
            x = self.embed(tokens) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    class LMLoss(nn.Cell):
        def __init__(self, net: nn.Cell) -> None:
            super().__init__()
            self.net = net
            self.ce = nn.CrossEntropyLoss()

        def construct(self, tokens):
            logits = self.net(tokens[:, :-1])
            return self.ce(logits.reshape(-1, vocab_size), tokens[:, 1:].reshape(-1))

    net = TinyLM()
    return net, LMLoss(net)


def build_eval(loss_net: Any) -> Any:
    """The demo's validation: ``(eval_network, metrics)`` for ``Model``; the network returns ``(loss, logits,
    labels)``, the metrics ``loss`` (the mean loss) and ``accuracy`` (next-token accuracy)."""
    from mindspore import nn
    from mindspore.train import Metric

    class LMEval(nn.Cell):
        def __init__(self) -> None:
            super().__init__(auto_prefix=False)
            self.loss_net = loss_net

        def construct(self, tokens):
            logits = self.loss_net.net(tokens[:, :-1])
            return self.loss_net(tokens), logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)

    class Mean(Metric):
        """The mean of what ``pick(loss, logits, labels)`` gives per batch."""

        def __init__(self, pick: Any) -> None:
            super().__init__()
            self.pick = pick
            self.clear()

        def clear(self) -> None:
            self.total, self.count = 0.0, 0

        def update(self, *outputs: Any) -> None:
            self.total += float(self.pick(*(o.asnumpy() for o in outputs)))
            self.count += 1

        def eval(self) -> float:
            return self.total / max(self.count, 1)

    metrics = {"loss": Mean(lambda loss, logits, labels: loss),
               "accuracy": Mean(lambda loss, logits, labels: (logits.argmax(-1) == labels).mean())}
    return LMEval(), metrics


def demo_config(out: str, overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The embedded demo config: every sink whose package is installed, the experiment dir ``out/<experiment>``."""
    from .sinks.registry import builtin_names, check_available

    sinks = []
    for name in builtin_names():
        try:
            check_available(name)
            sinks.append(name)
        except ImportError:
            pass
    cfg: Dict[str, Any] = {
        "experiment": "msbridge-demo",
        "run_name": "tiny-lm-lr{optimizer.learning_rate}-{timestamp}",
        "experiment_dir": f"{out}/{{experiment}}",
        "flush_steps": 50,
        "flush_seconds": 5.0,
        "print_interval": 25,
        "seq_length": DEMO_DEFAULTS["model"]["seq_length"],
        "sinks": sinks,
        "params": copy.deepcopy(DEMO_DEFAULTS),
    }
    cfg.update(overrides or {})
    return cfg


def demo_params(config: Any) -> Any:
    """``config`` (a loaded ``Config``) with the demo model's params filling in what its params do not set."""
    from .config.compose import deep_merge, plain

    return config.with_changes(params=deep_merge(DEMO_DEFAULTS, plain(config.params)))


def train(monitor: Any, steps: int, params: Mapping[str, Any], extra_callbacks: Sequence[Any] = ()) -> Any:
    """Train the demo model for ``steps`` steps with ``monitor``; returns the monitor."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    from .capture.train_step import TrainStep

    model_cfg, opt_cfg, train_cfg = params["model"], params["optimizer"], params["train"]
    ms.set_context(mode=ms.GRAPH_MODE if train_cfg.get("mode", "graph") == "graph" else ms.PYNATIVE_MODE,
                   device_target="CPU")
    ms.set_seed(int(train_cfg["seed"]))
    batch = int(train_cfg["batch_size"])
    tokens = make_tokens(steps * batch, model_cfg["seq_length"], model_cfg["vocab_size"], int(train_cfg["seed"]))
    dataset = ds.NumpySlicesDataset({"tokens": tokens}, shuffle=False).batch(batch, drop_remainder=True)
    _, loss_net = build_model(**model_cfg)
    lr = nn.WarmUpLR(float(opt_cfg["learning_rate"]), int(opt_cfg["warmup_steps"]))
    optimizer = nn.AdamWeightDecay(loss_net.trainable_params(), learning_rate=lr,
                                   weight_decay=float(opt_cfg["weight_decay"]))
    eval_net, metrics = build_eval(loss_net)
    # TrainStep records loss, grad norm, lr and the rest into a device ring buffer inside the compiled step.
    model = Model(TrainStep(loss_net, optimizer, clip_grad_norm=float(opt_cfg.get("clip_grad_norm", 1.0))),
                  eval_network=eval_net, metrics=metrics)
    held_out = make_tokens(int(train_cfg.get("eval_batches", 4)) * batch, model_cfg["seq_length"],
                           model_cfg["vocab_size"], int(train_cfg["seed"]) + 1)
    valid = ds.NumpySlicesDataset({"tokens": held_out}, shuffle=False).batch(batch)
    every = int(train_cfg.get("eval_every", 0) or 0)
    validate = [_Validate(model, valid, monitor, every)] if every else []
    model.train(1, dataset, callbacks=[monitor, *validate, *extra_callbacks], dataset_sink_mode=False)
    return monitor


def _Validate(model: Any, valid: Any, monitor: Any, every: int) -> Any:
    """A callback that runs ``Model.eval(valid, callbacks=[monitor])`` every ``every`` steps and at the end."""
    from mindspore.train import Callback

    class Validate(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            cb = run_context.original_args()
            if cb.cur_step_num % every == 0 or cb.cur_step_num == cb.batch_num:
                model.eval(valid, callbacks=[monitor], dataset_sink_mode=False)

    return Validate()


def exit_status(monitor: Any) -> int:
    """The demo's exit code, ``monitor.outcome.exit_code``; when it is not 0, stderr says why."""
    outcome = monitor.outcome
    if outcome.exit_code:
        short = f"; these sinks did not receive everything: {', '.join(sorted(outcome.undelivered))}" \
            if outcome.undelivered else ""
        print(f"[msbridge] the run ended {outcome.status}{short} (exit code {outcome.exit_code}; "
              f"the outcome is in {monitor.run_dir}/README.md)", file=sys.stderr)
    return outcome.exit_code

"""``MSBridgeMonitor``: msbridge's monitor as one ``callbacks:`` entry of a mindformers run YAML.

What it adds to ``BridgeMonitor``:

- its settings come from the entry (inline, or ``config: file.yaml``) on top of
  the run YAML's ``monitor_config`` (``entry.entry_config``);
- mindformers' train cells return ``(loss, overflow, loss_scale, lr, global_norm[,
  local_norm, ...])``; the lr and global norm are read from there (``global_norm``
  is None without ``use_clip_grad`` and is then left out), and the optimizer,
  when needed, from ``cb_params.train_network.optimizer`` (``cb_params.optimizer``
  is None under mindformers);
- what TrainingStateMonitor and CheckpointMonitor find becomes events
  (``forward.MindformersFindings``);
- with ``do_eval: True``, each evaluation's results become ``eval/*`` metrics at the step it ran
  (``evaluation.watch_evaluations``);
- with ``monitor_config.max_attention_logit_format``, the max attention logits
  mindformers tracks become ``attention/max_logit/*`` metrics at each flush
  (``attention.MaxAttentionLogits``);
- under mindformers' pipeline / gradient-accumulation cell the loss is MFLossMonitor's: from the last
  pipeline stage, divided as it divides it (``pipeline.PipelineLoss``);
- when the run YAML configures mindformers' tensorboard, msbridge's tensorboard
  sink writes through mindformers' writer: one event file per rank, not two.

Under mindformers' pynative Trainer (``mindformers.pynative.trainer.Trainer``, 1.9 on, single
device), which builds the same ``- type: MSBridgeMonitor`` entry and calls it as a
``TrainerCallback``, the loss and grad norm come from ``on_step_end``'s arguments and the lr from
the optimizer's schedule (``pynative.PynativeSteps``): the same stream, the same sinks.

MFLossMonitor and TrainingStateMonitor keep running unchanged beside it.
mindformers sorts them first, so when TrainingStateMonitor stops training at a
step's end (TREError), this monitor has not seen that step yet: it is recorded
from the callback params as the run closes FAILED (``BridgeMonitor``).

The run YAML entry is shown in ``msbridge.mindformers``.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, List, Optional

from ..callback import BridgeMonitor
from ..capture.cb_params import param
from ..capture.ring_cell import find_ring_cell
from ..capture.window import Window
from ..sinks.base import Event
from .attention import MaxAttentionLogits
from .entry import ENTRY_NAME, entry_config
from .evaluation import watch_evaluations
from .forward import MindformersFindings
from .pipeline import PipelineLoss
from .pynative import PynativeSteps, TrainingStopped

log = logging.getLogger("msbridge")


class MSBridgeMonitor(BridgeMonitor):
    """msbridge's monitor, built by mindformers from a ``callbacks:`` entry.

    Args:
        **entry: the entry's keys (``type`` aside): msbridge settings, and
            optionally ``config``, the path of a msbridge YAML they override.

    Raises:
        ConfigError: an unknown or invalid key, named with the run YAML's file and
            line, ``callbacks[i]`` and the nearest valid key, before training starts.

    Example:
        >>> from msbridge.mindformers import MSBridgeMonitor
        >>> monitor = MSBridgeMonitor(experiment="tiny-llama", sinks=["jsonl"], flush_steps=10)
        >>> trainer = Trainer(args="run.yaml", callbacks=[monitor])
        >>> # built in Python it has only these keys; from `- type: MSBridgeMonitor` in the run YAML it also
        >>> # reads that YAML's monitor_config
    """

    def __init__(self, **entry: Any) -> None:
        # mindformers' MFLossMonitor already prints a line per step: msbridge's console lines would repeat it.
        super().__init__(entry_config(entry, ENTRY_NAME), progress=False)
        self._findings: Optional[MindformersFindings] = None
        self._logits: Optional[MaxAttentionLogits] = None
        self._flushing = False  # a flush that writes (not a health check's): the attention logits are read
        self._pynative: Optional[PynativeSteps] = None
        self._loss: Optional[PipelineLoss] = None

    def on_train_begin(self, run_context: Any, state: Any = None, **kwargs: Any) -> None:
        if state is not None:  # mindformers.pynative's Trainer: (args, state, model=, optimizer=, ...)
            self._pynative = PynativeSteps()
            super().on_train_begin(self._pynative.begin(state, **kwargs))
            return
        if self.plan is not None:
            _share_tensorboard_writer(self.plan.sinks)
            self._take_loss_as_mindformers(run_context.original_args())
        super().on_train_begin(run_context)
        if self.run is not None:
            cb = run_context.original_args()
            callbacks = param(cb, "list_callback", None) or []
            self._findings = MindformersFindings.from_callbacks(callbacks, self.run.rank)
            self._logits = MaxAttentionLogits.from_callbacks(callbacks, param(cb, "train_network", None), self)
            watch_evaluations(callbacks, self)  # do_eval's results as eval/* metrics

    # -- mindformers.pynative's TrainerCallback convention (the graph-mode Trainer never calls these) --
    def on_step_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        """The pynative Trainer's step end: ``loss=`` and ``grad_norm=`` (None on an overflow step)."""
        self.on_train_step_end(self._pynative.step_end(state, **kwargs))
        stop = self.health.stop
        if stop is not None:  # the sinks are closed; that Trainer has no stop request, so end its loop here
            raise TrainingStopped(f"msbridge: {stop.reason}; the run closed {stop.status}. mindformers' pynative "
                                  "Trainer has no stop request, so msbridge ends its loop with this error")

    def on_step_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        """Nothing: the step time is measured from one step end to the next."""

    def on_epoch_begin(self, args: Any, state: Any, **kwargs: Any) -> None:
        """Nothing: the epoch of each step is worked out from ``state`` at its end."""

    def on_epoch_end(self, args: Any, state: Any, **kwargs: Any) -> None:
        """Nothing: records are written per step, not per epoch."""

    def on_train_end(self, run_context: Any, state: Any = None, **kwargs: Any) -> None:
        super().on_train_end(run_context)

    def _take(self, dispatch: bool) -> Any:
        """``BridgeMonitor._take``; the attention logits are read only by a flush that writes (``dispatch``)."""
        self._flushing = dispatch
        return super()._take(dispatch)

    def _take_loss_as_mindformers(self, cb: Any) -> None:
        """The loss from the last pipeline stage, scaled as MFLossMonitor's (``pipeline.PipelineLoss``)."""
        network = param(cb, "train_network", None)
        ranks = self.plan.ranks
        self._loss = PipelineLoss.at_train_begin(param(cb, "list_callback", None) or [], network,
                                                 ring=find_ring_cell(network) is not None, rank=ranks.rank,
                                                 world_size=ranks.world_size)
        if self._loss.loss_ranks is not None and self.config.reduce_ranks is None:
            self.config = replace(self.config, reduce_ranks=self._loss.loss_ranks)

    def forwarded_events(self, window: Optional[Window]) -> List[Event]:
        if self._loss is not None:  # first: records, health and the cross-rank loss see MFLossMonitor's loss
            self._loss.adjust(window)
        if self._logits is not None and self._flushing and window is not None and len(window):
            window.at_flush.update(self._logits.read())  # recorded on the window's last step: the one just run
        if self._findings is None:
            return []
        return self._findings.events(window, self._last_step)


def _share_tensorboard_writer(sinks: List[Any]) -> None:
    """Hand mindformers' tensorboard writer (set when the run YAML has ``tensorboard:``) to the sinks that
    can write through it."""
    from mindformers.utils.tensorboard import get_tensorboard_writer

    writer = get_tensorboard_writer()
    if writer is None:
        return
    for sink in sinks:
        share = getattr(sink, "share_writer", None)
        if share is not None:
            share(writer)
            log.info("msbridge: the %s sink writes through mindformers' tensorboard writer (%s)",
                     sink.name, getattr(writer, "logdir", "?"))

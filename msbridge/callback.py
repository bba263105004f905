"""``BridgeMonitor``: the one callback that turns every training step into the metric stream.

Two paces: every step, O(1) host work (one row: the step, its outputs, its timestamps); every flush
(``flush_steps`` steps or ``flush_seconds`` seconds, whichever first, and at train end), one device->host copy
per column (of the whole device ring with ``msbridge.TrainStep`` / ``attach_ring``: ``RingReader``), records
built and handed to the dispatcher: no tracker I/O ever runs on this thread. Where nothing can stop training at a
step (a single process, no stop action, no Optuna trial), the records are built on the converter thread
(``run.converter``) while training goes on. ``OverheadBudget`` widens the flush window when the monitor's own time
goes over ``overhead_budget`` of the step time. Evaluations (``on_eval_*``) are ``EvalHooks``'.

Example:
    >>> from msbridge import BridgeMonitor
    >>> monitor = BridgeMonitor.from_yaml("monitor.yaml")
    >>> model.train(3, dataset, callbacks=[monitor])
"""
from __future__ import annotations

import logging
import time
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import mindspore as ms
from mindspore.train import Callback

from .capture.budget import OverheadBudget
from .capture.cb_params import batch_size_of, expected_steps, first_train_step, param, resume_offset, steps_per_call
from .capture.checkpoints import CheckpointWatch
from .capture.host_buffer import StepBuffer
from .capture.internals import Internals
from .capture.lr import LrReader, find_optimizer
from .capture.ring_cell import find_ring_cell
from .capture.ring_reader import ring_source
from .capture.train_step import TrainStep
from .capture.window import StepSource, Window
from .config.load import Config, load_config
from .health.runner import EXCEPTION, INTERRUPT, Health, Verdict, make_event
from .eval_hooks import EvalHooks
from .masking import mask_text
from .metrics.rank_timing import Stamps, StepTimer, data_wait_values, timing_summary
from .metrics.stream import Stream
from .names import GLOBAL_LOSS, HISTOGRAM, LOSS
from .run.converter import Converter
from .run.cost import KEY as COST_KEY, CostMeter
from .run.outcome import PRUNED, RUN_FILES, RunOutcome, RunTally
from .run.plan import RunPlan, plan_run
from .run.ranks import release_rank_file
from .run.signals import SignalGuard, TrainingInterrupted
from .run.watchdog import AT_FLUSH, IN_COLLECTIVE, IN_STEP, StallWatchdog
from .sinks.base import FAILED, FINISHED, KILLED, Event, Record, RunInfo, Sink
from .sinks.dispatch import Dispatcher
from .sweep.trial import SWEEP_METRIC, TrialLink, join_trial

log = logging.getLogger("msbridge")

#: A step end as its hook saw it: the step (with the resume offset), the epoch, the step's outputs, the last
#: step-begin hook's time (None: never called), the time the hook was entered and when the hook before it returned.
Row = Tuple[int, Any, Any, Optional[float], float, float]


class BridgeMonitor(EvalHooks, Callback):
    """Records every training step to the sinks chosen in the config.

    Args:
        config: a path to a YAML file, a dict, or a ``Config``.
        overrides: ``key=value`` strings applied on top (YAML-typed).
        sinks: extra sink instances (third-party or test sinks), added to the configured ones.
        progress: print progress lines on the global rank.
        trial: an Optuna trial (inside your own ``study.optimize``): its values become the run's params, and
            each value of the objective is reported to it; when Optuna prunes, training stops and the run ends
            PRUNED (``msbridge.sweep.trial``). In a trial of ``msbridge sweep`` the monitor joins it by itself.

    The config, the sink names and extras and the output dir are all checked here, before training.

    Example:
        >>> monitor = BridgeMonitor({"experiment": "tiny-lm", "sinks": ["jsonl", "tensorboard"]})
        >>> model.train(1, ds, callbacks=[monitor], dataset_sink_mode=False)
        >>> monitor.run_dir
        '/abs/msbridge_runs/tiny-lm/run-20261129-101500'
    """

    def __init__(self, config: Union[str, Mapping[str, Any], Config, None] = None,
                 overrides: Sequence[str] = (), sinks: Sequence[Sink] = (), progress: bool = True,
                 trial: Any = None) -> None:
        super().__init__()
        self.trial_link: Optional[TrialLink] = join_trial(trial)  # None outside a sweep
        if self.trial_link is not None:
            overrides = [*overrides, *self.trial_link.overrides()]
        self.config: Config = load_config(config, overrides=overrides)
        self.health = Health(self.config.health_spec)
        self._keeps_batches = self.health.keeps_batches  # read at each step: a dump wants its input batch
        self.plan: Optional[RunPlan] = None
        self.cost = CostMeter()  # what monitoring costs this run, into its outcome (``run.cost``)
        if self.config.monitor_on:
            self.cost.start()  # before the sinks are built: the MLflow child starts with its sink
            self.plan = plan_run(self.config, extra_sinks=sinks)
            self.plan.progress = progress
            if self.trial_link is not None and self.plan.ranks.is_global:
                self.trial_link.attach(self.plan.run_dir)
        self.dispatcher: Optional[Dispatcher] = None
        self.run: Optional[RunInfo] = None
        self._buffer: StepSource = StepBuffer()
        self._budget: Optional[OverheadBudget] = None
        self._every = self.config.step_interval
        self._stream: Optional[Stream] = None
        self._lr: Optional[LrReader] = None
        self._internals: Optional[Internals] = None  # layer_norms, histograms, memory, system
        self._reducer: Optional[Any] = None
        self._converter: Optional[Converter] = None  # builds and checks the records off the training thread
        self._timer = StepTimer()  # host stamps of each step: step, run and data wait times
        self._rows: List[Row] = []  # the step ends not settled yet (``_settle``)
        self._quick = False  # a step end only adds its row (``on_train_step_end``)
        self._later = False  # in ``_quick``, the rows settle and drain on the converter thread (``_rows_later``)
        self._begin_stamp: Optional[float] = None  # the last step-begin hook's time
        self._entered: Optional[float] = None  # when the last settled step's end hook was entered
        self._cb: Any = None  # MindSpore's callback params, kept from train begin
        self._seen_outputs: Any = None  # the last step's outputs this callback saw
        self._offset: Optional[int] = None
        self._last_end = self._last_flush = 0.0
        self._last_step = 0
        self.tally = RunTally()  # steps recorded, losses, events; status and undelivered once closed
        self._signals = SignalGuard()
        self._pending: List[Record] = []  # converted and checked, not yet handed to the sinks
        self._pending_events: List[Event] = []
        self._watchdog = StallWatchdog(self._on_watchdog, 0, self.config.alert_spec.stall_seconds)
        self._checkpoints = CheckpointWatch([], 0)
        self._init_eval()

    @classmethod
    def from_yaml(cls, path: str, overrides: Sequence[str] = (), **kwargs: Any) -> "BridgeMonitor":
        """Build from a YAML file (any dialect ``load_config`` accepts)."""
        return cls(path, overrides=overrides, **kwargs)

    run_dir = property(lambda self: self.plan.run_dir if self.plan else None, doc="The run directory (None: off).")

    steps_recorded = property(lambda self: self.tally.steps_recorded, doc="Records built so far on this rank.")
    final_loss = property(lambda self: self.tally.final_loss, doc="The last recorded step's loss.")
    best_loss = property(lambda self: self.tally.best_loss, doc="The smallest finite loss recorded.")
    events = property(lambda self: self.tally.events, doc="Every event of the run so far (health, stalls, ...).")

    # -- MindSpore hooks ------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if self.plan is None:
            return
        self._signals.install()  # from here a SIGTERM, SIGHUP or SIGINT ends the run KILLED, with its outcome written
        try:
            with self._signals.critical():  # one landing while the sinks open is raised once they are open
                self._begin(run_context)
        except BaseException:
            if self.dispatcher is None:  # refused before the run started: nothing opened, nothing to guard
                self.plan.discard()
                self._signals.restore()
                release_rank_file(self.plan.run_dir, self.plan.ranks.rank)
            raise

    def _begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        cfg = self.config
        first_trained = first_train_step(cb)
        self.plan.check_rerun(first_trained)  # a used run dir and a training from step 1: refused here
        first_step = int(param(cb, "cur_step_num", 0) or 0)
        ring_cell = find_ring_cell(param(cb, "train_network", None))
        if ring_cell is not None:  # checked before any sink opens: a too-small ring never starts a run
            self._buffer, self._every, widest = ring_source(ring_cell, cfg, first_step, steps_per_call(cb))
        else:
            widest = cfg.buffer_size or 8 * cfg.flush_steps
        batch_size = batch_size_of(cb)
        expected = expected_steps(cb)
        # refuses `skip` before any sink opens. Loss-scale cells skip an overflow step; TrainStep only when told to.
        skips = isinstance(ring_cell, TrainStep) and bool(ring_cell.skip_bad_steps)
        self.health.bind(param(cb, "train_network"), skips_nonfinite=skips,
                         skips_overflow=skips or not isinstance(ring_cell, TrainStep), first_step=first_step)
        self.dispatcher, self.run = self.plan.start(expected_steps=expected, batch_size=batch_size)
        self.health.start(self.run)
        optimizer = find_optimizer(cb)
        self._stream = Stream.for_run(cfg, self.run, batch_size, param(cb, "train_network"),
                                      getattr(optimizer, "parameters", None))
        self._lr = LrReader(optimizer) if optimizer is not None and cfg.learning_rate else None
        if self._lr is not None:  # the schedule's first eager call (1-9 ms) in the start-up, not in a training step
            self._lr.prepare(first_step + 1)
        self._internals = Internals(cfg.layer_norms, cfg.layer_norms_group, cfg.memory, cfg.system_interval_s,
                                    int(ms.get_context("device_id")), cfg.histograms, cfg.histogram_interval)
        self._internals.start(param(cb, "train_network"), optimizer, ring_cell, first_step, cb, self)
        self._checkpoints = CheckpointWatch.from_callbacks(param(cb, "list_callback", None), self.run.rank)
        self._checkpoints.plan(cfg.sinks, self.run.run_dir, expected)  # log_checkpoints: best, or a rotation line
        if self.run.world_size > 1:
            from .metrics.cross_rank import make_reducer

            self._reducer = make_reducer(self.run, batch_size, cfg.flush_steps, cfg.reduce_ranks,
                                         cfg.collective_timeout_s, on_timeout=self._on_collective_timeout,
                                         straggler=cfg.straggler, loss_metrics=cfg.global_loss,
                                         per_rank_curves=cfg.per_rank_curves, work=self._stream.work)
            if self.health.every_step:  # ranks meet in one collective per flush, never per step
                log.warning("msbridge: in a %d-rank run, health stop actions act at the flush (every %d steps), "
                            "not at the exact step", self.run.world_size, cfg.flush_steps)
                self.health.every_step = False
        self._timer = self._reducer.timer if self._reducer is not None else StepTimer()
        self._budget = OverheadBudget(cfg.overhead_budget, cfg.flush_steps, cfg.flush_seconds, widest,
                                      adapt=self._reducer is None)
        self._next_flush()
        if self._reducer is None and not self.health.every_step and self.trial_link is None:
            self._converter = Converter()  # nothing it does can stop training at a step: it may convert later
        self._last_step = first_step
        self._offset = self._entered = None
        self._rows, self._quick, self._later = [], False, False
        if self.run.resumed_from_step:  # steps up to here are in the log already and are not written again
            self.dispatcher.submit([], [self._resume_event(first_trained)])
        self._cb = cb
        self._last_end = self._last_flush = self.tally.started = time.perf_counter()
        self._watchdog.rank = self.run.rank
        self._watchdog.start()  # its clock starts when the first step ends (compiling is not a stall)
        self.model_evals.attach(cb)  # a user's model.eval(ds) during training is recorded too

    def _resume_event(self, first_trained: int) -> Event:
        """The ``resume`` event of a run continued from its log's last step. A training that resumes past the next
        step the log would hold (its checkpoint is newer than the log: a kill -9 ended the job before its log
        wrote the last window) names the steps in between as lost: said once, and in the run's outcome."""
        last = self.run.resumed_from_step
        due = (last // self._every + 1) * self._every  # the next step the log would have held
        lost = {"lost_first_step": due, "lost_last_step": first_trained - 1} if first_trained > due else {}
        event = Event("resume", last, self.run.rank, time.time(),
                      {"last_recorded_step": last, "run_id": self.run.run_id, **lost})
        if lost:
            log.warning("msbridge: steps %d-%d are in no log and no sink: the job that trained them ended before its "
                        "log wrote them (a kill -9 keeps no buffer); this training resumes at step %d, after them",
                        due, first_trained - 1, first_trained)
            self.events.append(event)
        return event

    def on_train_step_begin(self, run_context: Any) -> None:
        self._begin_stamp = time.perf_counter()  # the data wait: this stamp minus the last step-end hook's return

    def on_train_step_end(self, run_context: Any) -> None:
        entered = time.perf_counter()
        # Nothing wants this step before the flush: its row, the watchdog's stamp, the flush check. The callback
        # parameters are the ones of train begin, MindSpore's dict, read without its __getattr__.
        if self._quick and run_context is self._train_context:
            cb = self._cb
            step, outputs = cb["cur_step_num"] + self._offset, cb["net_outputs"]
            self._rows.append((step, cb["cur_epoch_num"], outputs, self._begin_stamp, entered, self._last_end))
            self._seen_outputs = outputs  # after the row: a signal raised between them loses no step
            dog = self._watchdog
            dog.last_end, dog.step = entered, step
            if dog.stalled_at is not None:
                dog.resume(step, entered)
            if len(self._rows) >= self._due_rows or entered - self._last_flush >= self._flush_seconds:
                with self._signals.critical():  # a SIGTERM landing in here is raised once the buffers are consistent
                    dog.mark(AT_FLUSH)
                    self._hand_off()
                    dog.mark(IN_STEP)
            self._last_end = time.perf_counter()
            return
        if self.dispatcher is None:
            return
        with self._signals.critical():
            self._step_end(run_context, entered)
        self._last_end = time.perf_counter()

    def _step_end(self, run_context: Any, entered: float) -> None:
        """A step end that is settled at once: the first of a training, or where health, a ``ModelCheckpoint``, the
        device ring or the other ranks want each step as it ends."""
        cb, self._train_context = run_context.original_args(), run_context  # an evaluation's stop goes to it
        step = int(cb.cur_step_num)
        if self._offset is None:
            self._offset = self._checkpoints.offset = resume_offset(cb, step)
        step += self._offset
        self._watchdog.step_ended(step, entered)
        self._seen_outputs = cb.net_outputs
        self._rows.append((step, cb.cur_epoch_num, cb.net_outputs, self._begin_stamp, entered, self._last_end))
        if not self._settle():
            return
        if self._keeps_batches and step % self._every == 0:
            self.health.on_step(step, cb)
        if self._checkpoints.savers:
            self._pending_events.extend(self._checkpoints.poll())  # ModelCheckpoint's files: two attribute reads
        budget = self._budget
        due = len(self._buffer) + len(self._pending) >= budget.flush_steps or (
                # Ranks must flush at the same steps (one collective each), so time triggers single processes only.
                self._reducer is None and entered - self._last_flush >= budget.flush_seconds)
        if due or self.health.every_step:  # a check that can stop training sees each step as it ends
            self._watchdog.mark(AT_FLUSH)
            if due and self._converter is not None:
                self._hand_off()
            else:
                self.flush(dispatch=due)
            self._watchdog.mark(IN_STEP)
        if self.health.stop is not None:
            run_context.request_stop()
            self.close(self.health.stop.status)
        # from the next step on, a row is all a step end adds where nothing here wants each step as it ends
        self._quick = (self._converter is not None and not self._keeps_batches and not self._checkpoints.savers
                       and type(self._buffer) is StepBuffer and self.dispatcher is not None
                       and cb is self._cb and isinstance(cb, dict))
        if self._quick:
            self._next_flush(len(self._buffer))
        # On CPU the outputs are in host memory, read on any thread. A subclass that forwards events reads the window
        # at the flush, on this thread.
        self._later = (self._quick and self._buffer.in_host_memory
                       and type(self).forwarded_events is BridgeMonitor.forwarded_events)

    def _settle(self) -> bool:
        """``_settle_rows`` of the rows on hand, once the converter thread has settled the ones handed to it."""
        if self._later:
            self._converter.wait()
        rows, self._rows = self._rows, []
        return self._settle_rows(rows)

    def _settle_rows(self, rows: List[Row]) -> bool:
        """``rows`` into the buffer, the step timer, the watchdog and the cost, in order (a step that does not come
        after the last one is refused, counted and said once); whether the last row was taken. A row's hook time is
        known at the next row: it is charged to that step."""
        taken, wall_at = False, time.time() - time.perf_counter()  # a perf_counter stamp's wall-clock time
        step_times = []
        for step, epoch, outputs, begin, entered, last_end in rows:
            step = int(step)
            if step <= self._last_step:
                self.tally.refuse(f"step {step}", self._last_step)
                taken = False
                continue
            advanced = max(step - self._last_step, 1)
            first = self._entered is None  # of this training: it only starts the step timer's clock
            hook_s = 0.0 if first else last_end - self._entered  # the step before it: its hook returned at last_end
            # this step's data wait and run go into the window it ends
            self._timer.step(entered, None if first else last_end, begin, advanced, hook_s)
            step_time = (entered - last_end) / advanced
            step_times.append(step_time)
            self.cost.hooks_s += hook_s
            self.cost.steps += advanced
            if step % self._every == 0:
                self._buffer.append(step, int(epoch), outputs, step_time, hook_s, wall_at + entered)
            self._last_step, self._entered, taken = step, entered, True
        self._watchdog.observe(step_times)
        return taken

    def skip_time(self, seconds: float) -> None:
        """Leave ``seconds`` since the last step end out of the next step's time (an evaluation's)."""
        self._last_end += seconds
        if self._entered is not None:
            self._entered += seconds  # the hook time of the step before it stays its own

    def on_train_end(self, run_context: Any) -> None:
        if not self._depth:  # inside Model.train the manager's exit closes, after every callback's train end
            self.close(FINISHED)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # MindSpore's callback manager exits every callback, also when training raised (an evaluation's is nested).
        if self.nested_exit():
            return
        rank = self.run.rank if self.run else 0
        try:
            if exc_type is None:
                self.close(FINISHED)
                return
            self._record_interrupted_step()
            if issubclass(exc_type, KeyboardInterrupt) or self._signals.received is not None:
                detail = self._signals.interrupt_detail() or {"type": exc_type.__name__}
                self.close(KILLED, make_event(INTERRUPT, self._last_step, rank, **detail))
            else:
                self.close(FAILED, make_event(EXCEPTION, self._last_step, rank, type=exc_type.__name__,
                                              message=mask_text(str(exc))))
        except TrainingInterrupted as late:  # arrived during the close, held until it was done
            self._signals.redeliver(late.signum)
            raise
        if isinstance(exc, TrainingInterrupted):
            self._signals.redeliver(exc.signum)  # the default: the process ends as killed by it

    def _record_interrupted_step(self) -> None:
        """Training raised after a step ran but before this callback saw its end (an earlier callback,
        such as mindformers' TrainingStateMonitor on a global-norm spike, raised): record that step."""
        cb = self._cb
        if self.dispatcher is None or cb is None or self._offset is None:
            return
        try:
            self._settle()
        except Exception:  # the converter thread's last job raised: training raised already, that is what ends it
            log.exception("msbridge: converting the steps before the interruption failed")
        step = int(param(cb, "cur_step_num", 0) or 0) + self._offset
        outputs = param(cb, "net_outputs", None)
        if outputs is self._seen_outputs:  # the step itself raised: there are no new outputs
            return
        if step > self._last_step and outputs is not None and step % self._every == 0:
            self._buffer.append(step, int(param(cb, "cur_epoch_num", 0) or 0), outputs,
                                (time.perf_counter() - self._last_end) / (step - self._last_step), 0.0, time.time())
            self._last_step = step

    # -- flush / close -----------------------------------------------------------
    def flush(self, dispatch: bool = True, reduce: bool = True) -> None:
        """Convert and check the buffered steps, then hand everything converted to the sinks (non-blocking).
        ``dispatch=False`` keeps the records for a later flush, unless health emitted an event: that goes out at once,
        with the records before it. ``reduce=False`` skips the cross-rank collective (this rank is ending alone).
        The windows handed to the converter thread before it are converted first."""
        if self._converter is not None:
            self._converter.wait()
        t0 = time.perf_counter()
        taken = self._take(dispatch)
        if taken is None:
            if dispatch or self._pending_events:
                self._dispatch_pending()
            return
        window, stamps = taken
        budget = self._budget
        budget.add("drain", time.perf_counter() - t0)
        verdict = self._check(window, stamps, reduce, budget)
        t3 = time.perf_counter()
        self._pending.extend(verdict.records)
        self._pending_events.extend(verdict.events)
        if dispatch or self._pending_events:
            self._dispatch_pending()
        budget.add("submit", time.perf_counter() - t3)
        budget.observe(window.monitor_s, window.step_time_s)
        self._next_flush()

    def _hand_off(self) -> None:
        """A step end's flush with a converter thread: the steps drain here, or there where their outputs are in host
        memory (``_rows_later``); building the records, checking them and handing them to the sinks is left to it."""
        t0 = time.perf_counter()
        later = self._rows_later()
        taken = None if later is not None else self._take(dispatch=True)
        records, events = self._pending, self._pending_events  # what was waiting goes with this window
        self._pending, self._pending_events = [], []
        self._last_flush = time.perf_counter()
        self._budget.add("drain", self._last_flush - t0)
        if later is not None:
            self._converter.put(lambda: self._convert_rows(*later, records, events))
        elif taken is not None:
            self._converter.put(lambda: self._convert(*taken, records, events))
        elif records or events:
            self._converter.put(lambda: self._dispatch(records, events))
        self._next_flush()  # with the budget as the window before this one left it

    def _rows_later(self) -> Optional[Tuple[List[Row], Window]]:
        """Where the steps drain on the converter thread (``_later``): the rows since the last flush, taken from this
        thread, and a window of what is read here, at this step (the model's internals; the learning rate's
        schedule evaluated up to it). None where they drain here: they record no step, or the schedule is evaluated
        step by step."""
        rows = self._rows
        every = self._every
        if not self._later or not (every == 1 or any(row[0] % every == 0 for row in rows)):
            return None
        step = int(rows[-1][0])
        if self._lr is not None and not self._lr.prepare(step):
            return None
        self._rows, read = [], Window.at_step(step)
        self._internals.fill(read, at_flush=True, step=step)
        return rows, read

    def _convert_rows(self, rows: List[Row], read: Window, records: List[Record], events: List[Event]) -> None:
        """The converter thread's part of ``_rows_later``: ``rows`` settled and drained, with ``read``, then
        ``_convert``."""
        self._settle_rows(rows)
        window = self._buffer.drain(self._lr)
        if window is None or self._stream is None or self.dispatcher is None:
            if records or events:
                self._dispatch(records, events)
            return
        window.absorb(read)
        self._convert(window, self._timer.take(), records, events + self._histogram_events(window))

    def _convert(self, window: Window, stamps: Stamps, records: List[Record], events: List[Event]) -> None:
        """On the converter thread: ``window`` into records, checked, handed to the sinks after ``records`` and
        ``events``, which were waiting."""
        self._budget.observe(window.monitor_s, window.step_time_s)  # read by the next hand-off's _next_flush
        verdict = self._check(window, stamps, reduce=False)
        self._dispatch(records + verdict.records, events + verdict.events)

    def _take(self, dispatch: bool) -> Optional[Tuple[Window, Stamps]]:
        """On the training thread: the buffered steps drained into a window with what is read once per flush (the
        other monitors' events, the model's internals, the step timer's stamps), or None when there is nothing to convert."""
        self._settle()
        budget = self._budget
        window = self._buffer.drain(budget.timed_lr(self._lr) if budget is not None else self._lr)
        forwarded = self.forwarded_events(window)
        self._pending_events.extend(forwarded)
        self.events.extend(forwarded)
        if window is None or self._stream is None or self.dispatcher is None:
            return None
        if self._internals is not None:
            self._internals.fill(window, at_flush=dispatch, step=self._last_step)  # histograms: at the last step
            self._pending_events.extend(self._histogram_events(window))
        return window, self._timer.take()

    def _histogram_events(self, window: Window) -> List[Event]:
        """``window``'s histograms as events at its last step, to the sinks (not into the outcome)."""
        return [Event(HISTOGRAM, self._last_step, self.run.rank, time.time(), d) for d in window.histograms]

    def _check(self, window: Window, stamps: Stamps, reduce: bool,
               budget: Optional[OverheadBudget] = None) -> Verdict:
        """``window``'s records, checked, and with ``reduce`` agreed across ranks (health's stop too); ``stamps``:
        its steps' ``StepTimer.take()``; the phases' time charged to ``budget`` (None: off the training thread,
        which the budget does not count)."""
        t1 = time.perf_counter()
        timing, wait_share = timing_summary(stamps)
        window.at_flush.update(data_wait_values(timing, wait_share))  # on the window's last step
        if self._reducer is None and LOSS in window.scalars:  # a single process: the global loss is the local one
            window.global_scalars[GLOBAL_LOSS] = window.scalars[LOSS]
            if LOSS in window.absent:
                window.absent[GLOBAL_LOSS] = window.absent[LOSS]
        records = self._stream.records(window)
        self.tally.steps_recorded += len(records)
        verdict = self.health.check(window, records)  # adds health/* counters; may set health.stop
        t2 = time.perf_counter()
        if self._reducer is not None and reduce:  # the ranks' stops, findings and timing meet in one collective
            self._watchdog.mark(IN_COLLECTIVE)
            agreement = self._reducer.reduce(window, verdict, self.health.stop, timing)
            self._watchdog.mark(AT_FLUSH)
            verdict, self.health.stop = agreement.verdict, agreement.stop
        if budget is not None:
            budget.add("records", t2 - t1)
            budget.add("reduce", time.perf_counter() - t2)
        self.events.extend(verdict.events)
        self.tally.track_loss(window.given(LOSS))
        return verdict

    def forwarded_events(self, window: Optional[Window]) -> List[Event]:
        """Events other monitors found, sent with each flush (none here; ``msbridge.mindformers``
        forwards mindformers' findings). ``window`` is the steps just drained, or None."""
        return []

    def close(self, status: str = FINISHED, event: Optional[Event] = None) -> None:
        """Final flush, then drain and close every sink with ``status``, then the outcome into run.json and
        README. A SIGTERM, SIGHUP or SIGINT arriving meanwhile is held until all of that is done, then raised."""
        if self.dispatcher is None:
            self._signals.restore()
            return
        self._quick = self._later = False  # a step end after the close is not recorded; the flush waits for the rest
        with self._signals.critical():
            self.cost.closing()
            self._watchdog.stop()
            self._pending_events.extend(self._checkpoints.poll())  # the one ModelCheckpoint saved at train end
            self.model_evals.detach()
            try:
                # Only a normal end meets the other ranks in the collective: after an exception here
                # the others are still training, and a collective would pair with theirs or block.
                self.flush(reduce=status == FINISHED)
            except Exception:  # a failed final copy (device error) must not keep the sinks from closing
                log.exception("msbridge: the final flush failed; closing the sinks with what they have")
            if self._entered is not None and self._last_end > self._entered:  # the last step's hook: no next row
                self.cost.hooks_s += self._last_end - self._entered
            if self._converter is not None:
                self._converter.stop()
                self._converter = None
            self.say_unevaluated()
            if status == FINISHED and self.health.stop is not None:  # the final window's check stopped the run
                status = self.health.stop.status
            if self._internals is not None:
                self._internals.close()
            self._signals.reassert()  # MindSpore's last graph run took SIGINT over; the close needs it
            interrupted = self._signals.interrupt_detail()
            if interrupted is not None and status == FINISHED:  # a chained handler ended training, or the
                status = KILLED                                 # signal came during the final flush
                event = make_event(INTERRUPT, self._last_step, self.run.rank if self.run else 0, **interrupted)
            if event is not None:
                self.events.append(event)
                self.dispatcher.submit([], [event])
            if status == FINISHED and self.trial_link is not None and self.trial_link.pruned_at is not None:
                status = PRUNED
            dispatcher, self.dispatcher = self.dispatcher, None
            dispatcher.close(FINISHED if status == PRUNED else status)  # trackers: FINISHED, its `pruned` event a tag
            late = self._signals.interrupt_detail() if interrupted is None else None
            self._finish(status, dispatcher, late)
            self._signals.restore()

    def _finish(self, status: str, dispatcher: Dispatcher, late: Optional[Mapping[str, Any]] = None) -> None:
        """The closed ``dispatcher``'s outcome into run.json and README (never raising: this runs inside
        MindSpore's hooks). ``late``: a signal that arrived while the sinks were closing."""
        if self.plan is None:
            self.tally.ended(status, dispatcher.undelivered, dispatcher.gaps)
            return
        try:
            self.tally.ended(status, dispatcher.undelivered, dispatcher.gaps)
            objective = self._objective.summary() if self.run is not None and self.run.is_global else None
            summary = self.tally.summary(self._last_step, self.health.summary(), self.plan.run_dir, late, objective)
            cost = self.cost.finish()  # after the sinks closed: their close is counted
            if not self.plan.finish({**summary, COST_KEY: cost} if cost is not None else summary):
                self.tally.undelivered[RUN_FILES] = f"the outcome could not be written to {self.plan.run_dir}"
        except Exception:
            log.exception("msbridge: could not write the outcome into run.json and README.md")
        release_rank_file(self.plan.run_dir, self.plan.ranks.rank)

    def _on_collective_timeout(self, window: Window) -> None:
        """Watchdog thread, while the training thread is stuck in the cross-rank collective: keep the
        window's local records, record the event, close every sink FAILED. If the collective returns
        after all, later flushes still meet the other ranks; the closed dispatcher drops what they submit."""
        dispatcher, stream, run = self.dispatcher, self._stream, self.run
        if dispatcher is None or stream is None or run is None:
            return
        first, last = int(window.steps[0]), int(window.steps[-1])
        event = Event("collective_timeout", last, run.rank, time.time(),
                      {"first_step": first, "last_step": last, "timeout_s": self.config.collective_timeout_s})
        self.events.append(event)
        dispatcher.submit(stream.records(window), [event])
        dispatcher.close(FAILED)
        self._finish(FAILED, dispatcher)

    def _on_watchdog(self, event: Event) -> None:
        """Stall watchdog thread: a ``stall`` or ``resumed`` event to every sink and into the outcome."""
        self.events.append(event)
        dispatcher = self.dispatcher
        if dispatcher is not None:
            dispatcher.submit([], [event])

    def _before_dispatch(self, records: Sequence[Record]) -> None:
        """The objective's values reported to the Optuna trial (``trial_link``); when it says prune, training
        stops after this step (``request_stop``, ``msbridge.track``'s ``should_stop``) and the run ends PRUNED."""
        super()._before_dispatch(records)
        link = self.trial_link
        if link is None or self.run is None or not self.run.is_global:
            return
        metric = self.config.objective["metric"] or SWEEP_METRIC  # one metric a trial: Optuna compares it by step
        if link.report(records, metric, ask=self.run.world_size == 1):  # one rank alone must not stop a job
            event = link.event(self.run.rank, metric)
            self._pending_events.append(event)
            self.events.append(event)
            if self._train_context is not None:
                self._train_context.request_stop()

    def _next_flush(self, held: int = 0) -> None:
        """When a step end in ``_quick`` flushes: once the rows and the ``held`` steps of the buffer make
        ``flush_steps`` recorded steps, or ``flush_seconds`` after the last flush (the budget may have widened both)."""
        self._due_rows = (self._budget.flush_steps - held) * self._every
        self._flush_seconds = self._budget.flush_seconds

    def _dispatch_pending(self) -> None:
        """Hand every converted record and event to the sinks (non-blocking)."""
        self._last_flush = time.perf_counter()
        records, events = self._pending, self._pending_events
        self._pending, self._pending_events = [], []
        self._dispatch(records, events)

    def _dispatch(self, records: List[Record], events: List[Event]) -> None:
        self._before_dispatch(records)
        if self.dispatcher is not None:
            self.dispatcher.submit(records, events)

    @property
    def outcome(self) -> RunOutcome:
        """How the run ended (``RunOutcome``): status (None until it has), the sinks that did not receive
        everything, and ``exit_code``, what ``msbridge demo`` exits with: ``sys.exit(monitor.outcome.exit_code)``."""
        return self.tally.outcome

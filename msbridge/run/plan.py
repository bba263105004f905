"""Plans a run before training (names, paths, ranks, sink classes) and starts it.

Everything that can be wrong with a config is found in ``plan_run``, which the
callback calls in its constructor: an unknown sink, a missing extra, an output
dir that cannot be written. ``RunPlan.start`` then opens the sinks behind one
dispatcher. The rank question is settled here, once: a rank that is not global
never builds a global-only sink (MLflow).

Example:
    >>> plan = plan_run(load_config({"sinks": ["jsonl"]}))
    >>> dispatcher, run = plan.start(expected_steps=300)
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence

from ..config.directories import writable_problem
from ..config.load import Config
from ..errors import ConfigError
from ..masking import mask_secrets, mask_text
from ..paths import (
    experiment_dir_template,
    render_experiment_dir,
    render_output_dir,
    render_template,
)
from ..sinks.base import FAILED, RunInfo, Sink
from ..sinks.console import ConsoleSink
from ..sinks.dispatch import Dispatcher
from ..sinks.host import Driver, SinkFailed
from ..sinks.registry import OFF_FOR_RUN, fault_policy, resolve, with_store_defaults
from ..sinks.runlog import last_step, rank_file
from .metadata import (collect_metadata, release_space, render_readme, reserve_space, run_id_for, stored_run_name,
                       write_run_files)
from .rank_sync import agree_timestamp
from .ranks import Ranks, claim_rank_file, detect_ranks

log = logging.getLogger("msbridge")


def check_same_run(run_dir: str, run_name: str) -> None:
    """A run dir that holds a run of another name is never resumed into: ConfigError naming both names."""
    stored = stored_run_name(run_dir)
    if stored is not None and stored != mask_secrets({"run_name": run_name})["run_name"]:  # stored masked
        raise ConfigError(f"output_dir {run_dir!r} holds the run {stored!r}, not {run_name!r}: a run resumes only "
                          f"a run of the same name; to resume it set run_name: {stored!r}, for a new run put "
                          "{run_name} in output_dir (or choose another one)")


@dataclass
class RunPlan:
    """Everything decided before the first step."""

    config: Config
    ranks: Ranks
    run_name: str
    run_dir: str
    experiment_dir: str
    run_id: str
    sinks: List[Sink]
    progress: bool = True

    def check_rerun(self, first_step: int) -> None:
        """A run dir whose log holds steps is continued only by a training that resumes after them (its first
        step is after the last recorded one) or with ``resume: true``; else ConfigError, before any sink opens
        and before anything in the run dir changes."""
        wal = rank_file(self.run_dir, self.ranks.rank)
        last = last_step(wal) if os.path.exists(wal) else 0
        if last and first_step <= last and not self.config.resume:
            raise ConfigError(
                f"output_dir {self.run_dir!r} already holds the run {self.run_name!r} up to step {last}, and this "
                f"training starts at step {first_step}: its steps up to {last} would not be recorded. For a new run "
                "put {timestamp} in run_name (run_name: " + repr(self.config.run_name + "-{timestamp}") + "); to "
                f"continue this run from its checkpoint set resume: true (steps up to {last} are kept as recorded)")

    def discard(self) -> None:
        """Let go of the sinks of a run refused before it started: nothing is written, and MLflow's sink ends
        the client process it started when it was built. Each is closed on its own thread (``Driver``), all at
        once, each waited for at most its close bound: a plug-in whose close hangs delays the refusal that long."""
        start, drivers = time.monotonic(), [Driver(sink) for sink in self.sinks]
        for driver in drivers:
            driver.host.close(FAILED)  # queued on every sink's thread first: they close in parallel
        for driver in drivers:
            try:
                driver.close(FAILED, since=start)
            except SinkFailed as exc:  # the refusal is what the user must see
                log.debug("msbridge: %s: close of a sink never opened: %s", driver.sink.name, exc)

    def start(self, expected_steps: Optional[int] = None, batch_size: Optional[int] = None) -> "tuple[Dispatcher, RunInfo]":
        cfg = self.config
        sinks = list(self.sinks)
        if self.progress and self.ranks.is_global:
            sinks.append(ConsoleSink(print_interval=cfg.print_interval))
        config_dict = mask_secrets(cfg.to_dict())
        meta = collect_metadata(config_dict, self.ranks.world_size, expected_steps)
        meta["batch_size"] = batch_size
        meta["run_dir"], meta["experiment_dir"] = self.run_dir, self.experiment_dir
        wal = rank_file(self.run_dir, self.ranks.rank)
        run = RunInfo(run_id=self.run_id, run_name=self.run_name, experiment=cfg.experiment,
                      rank=self.ranks.rank, world_size=self.ranks.world_size,
                      is_global=self.ranks.is_global, run_dir=self.run_dir,
                      config=config_dict, metadata=meta, start_time=time.time(), training=True,
                      resumed_from_step=last_step(wal) if os.path.exists(wal) else 0)
        self._dispatcher = Dispatcher(sinks)  # each sink on a host of its own; nothing opened yet
        where = self._dispatcher.describe(run)  # each on its own thread, waited for at most DESCRIBE_BOUND (2 s)
        run = replace(run, readme=render_readme(self.run_name, self.run_id, meta, where, self.run_dir))
        if self.ranks.is_global:  # the outcome's room, before anything else takes the disk
            reserve_space(self.run_dir)
        self._dispatcher.open(run)  # queued on each sink's thread: training does not wait for an open
        self._where = where
        self._meta = dict(meta, run_id=self.run_id, run_name=self.run_name, sinks=self._where)
        self._write()
        return self._dispatcher, run

    @property
    def outputs(self) -> Dict[str, Dict[str, str]]:
        """Where each sink that opened writes (``Sink.describe``)."""
        return dict(getattr(self, "_where", {}))

    @property
    def failed_sinks(self) -> Dict[str, str]:
        """Each sink whose call failed (raised, returned a wrong type, overran its bound), with its first failure."""
        dispatcher = getattr(self, "_dispatcher", None)
        return dict(dispatcher.failures) if dispatcher is not None else {}

    def finish(self, outcome: Dict[str, Any]) -> bool:
        """Add the outcome (status, steps, wall time, losses, anomalies) to README.md and run.json; a sink that
        never opened leaves the list of where the sinks write. False if the run dir could not take them."""
        if not hasattr(self, "_meta"):
            return True
        release_space(self.run_dir)
        unopened, said = self._dispatcher.unopened, self._dispatcher.said_at_close
        self._where = {name: {**info, **said.get(name, {})} for name, info in self._where.items()
                       if name not in unopened}
        self._meta["sinks"] = self._where
        return self._write(outcome)

    def _write(self, outcome: Optional[Dict[str, Any]] = None) -> bool:
        """run.json and README.md (global rank): the sinks that opened, the ones that failed, the outcome; False
        if they could not be written (said once, ``write_run_files``)."""
        if not self.ranks.is_global:
            return True
        failed = self.failed_sinks
        meta = dict(self._meta, failed_sinks=failed, **({"outcome": outcome} if outcome else {}))
        return write_run_files(self.run_dir, meta, render_readme(self.run_name, self.run_id, meta, self._where,
                                                                 self.run_dir, outcome=outcome, failed=failed))


def plan_run(config: Config, extra_sinks: Sequence[Sink] = (), ranks: Optional[Ranks] = None,
             now: Optional[float] = None) -> RunPlan:
    """Validate everything that can be checked before training and fix the run's names and paths."""
    ranks = ranks or detect_ranks()
    stamp = agree_timestamp(ranks, "{timestamp}" in config.run_name + config.output_dir, now)
    own = config.to_dict()
    run_name = render_template(config.run_name, dict(config.params), own, {"timestamp": stamp, "rank": ranks.rank})
    experiment_dir = render_experiment_dir(experiment_dir_template(config.experiment_dir, config.output_dir),
                                           config.experiment)
    run_dir = render_output_dir(config.output_dir, config.experiment, run_name, ranks.rank, stamp, experiment_dir)
    check_same_run(run_dir, run_name)
    problem = writable_problem(run_dir)
    if problem:
        raise ConfigError(f"output_dir: {problem}")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:  # changed since the check (another process, a full disk): said as a config problem
        raise ConfigError(f"output_dir: cannot create {run_dir!r}: {exc.strerror or exc}") from None
    claim_rank_file(run_dir, ranks.rank)
    sinks = build_sinks(config, ranks, experiment_dir) + list(extra_sinks)
    if config.alert_spec.enabled:  # a sink, so it hears every event; an observer, told the others' final undelivered
        from ..alerts.sink import AlertSink

        sinks.append(AlertSink(config.alert_spec, config_file=config.provenance.source))
    return RunPlan(config=config, ranks=ranks, run_name=run_name, run_dir=run_dir, run_id=run_id_for(run_dir),
                   sinks=sinks, experiment_dir=experiment_dir)


def build_sinks(config: Config, ranks: Ranks, experiment_dir: str) -> List[Sink]:
    """The configured sinks of this rank, built now so a bad option fails before training.

    jsonl comes first (the write-ahead log); a global-only sink (MLflow) exists on the global rank only.
    A tracker whose options do not place its store gets it in ``experiment_dir``.
    A sink with ``on_fault: warn`` that the config check found unable to work, or that cannot be built, is left out,
    said in one line.
    """
    sinks = []
    for name in sorted(config.sinks, key=lambda name: name != "jsonl"):
        options = config.sinks[name]
        if _said_off(config, name):
            continue
        try:
            cls = resolve(name)
            if cls.ranks != "global" or ranks.is_global:
                sinks.append(cls(**with_store_defaults(name, options, experiment_dir)))
        except (ConfigError, ImportError) as exc:
            if fault_policy(options) != "warn":
                raise
            log.warning("msbridge: sinks.%s: %s: %s; jsonl records every step", name, OFF_FOR_RUN, mask_text(str(exc)))
    return sinks


def _said_off(config: Config, name: str) -> bool:
    """The config check found sink ``name`` (``on_fault: warn``) unable to work, and said it is off for this run."""
    return any(f"sinks.{name}: {OFF_FOR_RUN}" in str(note) for note in config.provenance.notes)

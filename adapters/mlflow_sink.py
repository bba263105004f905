"""The MLflow sink: one MLflow run per training job, written with ``MlflowClient.log_batch``.

Global rank only. The ``MlflowClient`` runs in a child process (``mlflow_tracker.client.process``), so its pure-Python store never
holds the training process's GIL (a sqlite store gets its metric rows from sqlite itself there: ``mlflow_tracker.store.rows``);
``open`` starts it and does no other I/O, and MLflow is reached on the first flush or write, from the dispatcher
thread. Metrics keep the stream's names, at most 999 per call; a non-finite value is logged as NaN (MLflow keeps NaN
but stores +-inf as +-1.8e308, which flattens a chart; jsonl reads back NaN too). Params are the job's ``params`` with
dot keys plus msbridge's settings under ``msbridge.``; a value over 6000 characters is logged as ``sha256:<hex>``
(``config/resolved.yaml`` has it). Everything is masked. Resume reattaches to the run tagged with the job's ``run_id``
and skips steps up to its ``msbridge.last_step``. The runs of a ``sweep_id`` are child runs of one parent run per
sweep (``mlflow_tracker.run.sweep``), each tagged with its trial's state; as each ends, the sweep's saved view is written to
the experiment for anyone on the server (``mlflow_tracker.run.view``). An unreachable tracker never stops training: one warning,
a bounded backlog, retries with backoff, a last bounded try in ``close``. Its host hands it the batches of
``batch_seconds`` (5 s) in one ``write``: one transaction or round trip, not one a flush. A ``sqlite:///`` store is
made once and whole, however many runs start on it and whenever one is killed (``mlflow_tracker.store.local``). The
``run.json`` artifact is strict JSON (NaN and inf as strings).

The run's start and end times are the training's (``run.progress``, kept by the sink's host), however late MLflow is
reached, and the same when the run is replayed. The run README is the run's description (``mlflow.note.content``, cut to
MLflow's 8000 characters; whole in ``README.md``). An experiment this sink creates is tagged ``mlflow.experimentKind:
custom_model_development`` (MLflow's "Machine learning" kind, which its kind selector writes there); MLflow 3.17's UI
picks its GenAI or ML view from the URL (``?workflowType=machine_learning``) or the browser's last choice.

Example:
    >>> sinks: {jsonl: {}, mlflow: {tracking_uri: "http://127.0.0.1:5000", experiment: tiny-lm}}
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import shlex
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from msbridge.adapters.mlflow_tracker.run.fields import (EXPERIMENT_TAGS, MAX_PARAM_LENGTH, MAX_TAG_LENGTH, NOTE_TAG,
                                              RUN_ID_TAG, clean_key, clean_keys, epoch_ms, fit, run_note, run_params,
                                              run_tags)
from msbridge.adapters.mlflow_tracker.run.events import EVENTS_ARTIFACT, Backlog, EventLog
from msbridge.adapters.mlflow_tracker.run.models import CheckpointModels
from msbridge.adapters.mlflow_tracker.client.process import ALL_RUNS, ClientProcess
from msbridge.adapters.mlflow_tracker.store.rows import full_disk_store
from msbridge.adapters.mlflow_tracker.store.local import STORE_REFUSED, StoreRefused
from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_RUN_TAG, parent_for, settle
from msbridge.adapters.mlflow_tracker.run.view import (MODEL_TRAINING_QUERY, OBJECTIVE_TAG, RUNNING, STATE_TAG,
                                                       mark_best, server_address, share_sweep_view, trial_state)
from msbridge.adapters._tracker_facts import tracking_uri_problem
from msbridge.errors import MissingDependencyError, exception_text
from msbridge.masking import mask_secrets, mask_text
from msbridge.names import objective_metric
from msbridge.options import Option
from msbridge.paths import free_space
from msbridge.sinks.base import (BATCH_SECONDS, EVERY_N_STEPS, FINISHED, MAX_CLOSE_TIMEOUT, Behind, Event, Record,
                                  RunInfo, Series, Sink, json_safe)
from msbridge.sinks.registry import register_sink
from msbridge.sinks.runlog import rank_file, read_event_lines, read_rank_file

log = logging.getLogger("msbridge")

LAST_STEP_TAG = "msbridge.last_step"
#: Metrics per call to the child: one sqlite transaction where its row writer serves, else MLflow's batches of 1000.
METRICS_PER_CALL = 20_000
PARAMS_TAGS_PER_CALL = 100
# MLflow error codes meaning "this request can never succeed"; every other failure is retried.
_PERMANENT = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "INVALID_STATE", "RESOURCE_DOES_NOT_EXIST",
              "PERMISSION_DENIED", "UNAUTHENTICATED", "ENDPOINT_NOT_FOUND", STORE_REFUSED}
_HTML_BODY = re.compile(r"Response body: '\s*<(!doctype html|html)", re.I)
# MLflow reads its HTTP limits from the environment on every request: option -> (variable, default).
_HTTP_ENV = {"http_timeout": ("MLFLOW_HTTP_REQUEST_TIMEOUT", 10),
             "http_retries": ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", 0)}


@register_sink("mlflow")
class MlflowSink(Sink):
    """Logs the metric stream, config, metadata and events of one job to one MLflow run.

    MLflow reads its HTTP limits from ``MLFLOW_HTTP_REQUEST_TIMEOUT`` / ``_MAX_RETRIES``, so
    ``open`` sets those in MLflow's client process from ``http_timeout`` / ``http_retries``:
    an option given wins, else a value already in the environment, else 10 s and 0 retries.

    Example:
        >>> sink = MlflowSink(tracking_uri="http://127.0.0.1:5000", experiment="tiny-lm")
        >>> sink.open(run)
        >>> sink.write([Record(1, 0, time.time(), {"train/loss": 2.3})], [])
        >>> sink.close("FINISHED")
    """

    ranks = "global"
    default_store = ("tracking_uri", "sqlite:///{experiment_dir}/mlflow.db")
    options = {
        "tracking_uri": Option(str, None, f"MLflow tracking URI; default {default_store[1]}",
                               valid=tracking_uri_problem),
        "experiment": Option(str, None, "MLflow experiment name; default the msbridge experiment"),
        "run_name": Option(str, None, "MLflow run name; default the msbridge run name"),
        "artifact_location": Option(str, None, "artifact root of an experiment this sink creates; default "
                                               "mlartifacts/ beside a sqlite file, the server's choice otherwise"),
        "http_timeout": Option(float, None, "seconds one HTTP request may take (MLFLOW_HTTP_REQUEST_TIMEOUT)", 0),
        "http_retries": Option(int, None, "MLflow's own retries of a request (MLFLOW_HTTP_REQUEST_MAX_RETRIES)", 0,
                               high=100),
        "backoff_initial": Option(float, 1.0, "seconds to wait after a failed attempt; doubles on each failure", 0,
                                  at_most="backoff_max"),
        "backoff_max": Option(float, 60.0, "the longest wait between attempts, in seconds", 0),
        "close_timeout": Option(float, 30.0, "seconds close keeps retrying to deliver what is left; the close "
                                             "ends within it plus 5 s", low=0, low_open=True, high=MAX_CLOSE_TIMEOUT),
        "max_pending": Option(int, 50_000, "records kept in memory while MLflow is unreachable; beyond it MLflow "
                                           "takes no more from memory and reads the rest from jsonl once it is "
                                           "back", 1),
        "log_checkpoints": Option(str, "link", "each checkpoint as a LoggedModel of the run, its step's metrics "
                                               "linked (link); with its file uploaded (upload); as link, the best on "
                                               "the objective so far kept under the run dir (best); none (off)",
                                  choices=("link", "upload", "best", "off")),
        "every_n_steps": EVERY_N_STEPS,
        "batch_seconds": BATCH_SECONDS,
    }
    extra = "mlflow"
    requires = ("mlflow",)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        if importlib.util.find_spec("mlflow") is None:  # only its child process imports MLflow
            raise MissingDependencyError("sink 'mlflow'", "mlflow", "mlflow")
        self.uri = ""
        self.run_id: Optional[str] = None  # the MLflow run, once reached
        self._client: Any = ClientProcess()  # MLflow's import runs in the child while the model is built
        self._logged_step = 0  # the highest step MLflow holds (its last-step tag, once reached)
        self._store_step = 0  # the last step the store holds (read back on reattaching, or after a failed call)
        self._pending = Backlog(self.settings["max_pending"])  # what waits for MLflow, and what it may lack
        self._tags: Dict[str, str] = {}
        self._events = EventLog(self._key)  # events.jsonl and each kind's .last tag
        self._caught_up = False
        self._keys: Dict[str, str] = {}
        self._next_try = 0.0
        self._delay = float(self.settings["backoff_initial"])
        self._down = False
        self._why_down = "unreachable"  # or what else kept the last try from MLflow: said in ``undelivered()``
        self._parent: Any = None  # the sweep's parent run (a ``mlflow_tracker.run.sweep.Parent``), with a sweep_id
        self._experiment = ""  # its MLflow experiment id, once reached
        self._page = ""  # on a tracking server, once the run ended: its sweep's view, else the run's page
        self._gave_up = ""  # ``undelivered()``
        mode = self.settings["log_checkpoints"]
        self._models = CheckpointModels(mode) if mode != "off" else None

    def open(self, run: RunInfo) -> None:
        """No I/O: points MLflow's client process at the run's URI and HTTP limits (a variable set wins)."""
        super().open(run)
        self.uri = self.store(run, "tracking_uri")
        env = {}
        for option, (variable, default) in _HTTP_ENV.items():
            value = self.settings[option]
            if value is not None or variable not in os.environ:
                env[variable] = str(int(default if value is None else value))
        self._client.connect(self.uri, env, beside_training=run.training)
        if run.config.get("histograms"):
            self._events.skip_histograms()
        if self._models is not None:
            self._models.open(run.run_dir, dict(run.config.get("objective") or {}), live=run.training)

    def write(self, records: Sequence[Record], events: Sequence[Event]) -> None:
        if self._pending.full(len(records)):
            self.flush()  # one try, once its backoff ran out
            if self._pending.full(len(records)):
                raise Behind(f"MLflow at {mask_text(self.uri)} has {len(self._pending.records):,} records waiting, "
                             f"max_pending={self._pending.limit:,}")
        self._pending.extend(records)  # a batch larger than max_pending on its own waits whole: the next is Behind
        self._tags.update(self._events.add(events))
        if self._models is not None:
            self._models.see(records, events)
        self.flush()

    def flush(self) -> None:
        """Deliver everything waiting, unless the backoff after a failure has not run out yet."""
        if self.run is not None and time.monotonic() >= self._next_try:
            self._deliver()

    def close(self, status: str = FINISHED) -> None:
        """Deliver the rest and the status, retrying for ``close_timeout`` s; what is left then is ``undelivered``
        (the outcome names its replay). A sink never opened (training refused at its start) ends its client too."""
        deadline = time.monotonic() + self.settings["close_timeout"]
        try:
            while self.run is not None and not self._deliver(status):
                if time.monotonic() >= deadline:
                    self._give_up(status)
                    break
                time.sleep(max(0.0, min(self._next_try, deadline) - time.monotonic()))
        except Exception as exc:  # a store refused for good: said at once, with its fix, never waited out
            if getattr(exc, "error_code", None) != STORE_REFUSED:
                raise
            self._gave_up = f"{self._pending.text()} and status {status} not delivered: {mask_text(str(exc))}"
        finally:
            if self._client is not None:
                self._client.close()
            self.run = self._client = None

    def _give_up(self, status: str) -> None:
        """What MLflow lacks once ``close_timeout`` ran out, read back from the store, named with its replay."""
        held = self._held_step() if self._pending.tried else None
        lost = f"{self._pending.text(held)} and status {status} not delivered"
        log.warning("msbridge: gave up on MLflow at %s: %s; once it is back: msbridge replay %s --to mlflow",
                    mask_text(self.uri), lost, shlex.quote(self.run.run_dir))
        read = "" if held is None else f"; read back, the store holds steps up to {held}"
        self._gave_up = (f"{lost} to MLflow at {mask_text(self.uri)} ({self._why_down} until close_timeout "
                         f"ran out{read})")

    def hurry(self) -> None:
        """Training has ended: MLflow's client takes the training's priority (``ClientProcess.hurry``)."""
        client = self._client  # the sink's thread may end it meanwhile
        if client is not None and client.hurry():
            log.info("msbridge: mlflow: training ended; MLflow's starved client runs at the training's priority now")

    def undelivered(self) -> str:
        return self._gave_up

    def _held_step(self) -> Optional[int]:
        """The last step the store holds of the run (its last-step tag, stored with the rows), read back from it;
        None if it does not answer."""
        try:
            found = self._client.search_runs([self._experiment], f"tags.`{RUN_ID_TAG}` = '{self.run.run_id}'",
                                             run_view_type=ALL_RUNS, max_results=1)
        except Exception:
            return None
        return int(found[0].data.tags.get(LAST_STEP_TAG, 0)) if found else 0

    def describe(self, run: RunInfo) -> Dict[str, str]:
        """Where it logs; once the run ended on a tracking server (asked again after the close), ``url``: the page
        that opens its sweep's view (the trials compared, best first), else the run, for anyone on the server."""
        uri = mask_text(self.store(run, "tracking_uri"))
        where = {"where": f"{uri} (experiment {self.settings['experiment'] or run.experiment!r})"}
        return {**where, "url": self._page} if self._page else where

    def read_back(self, run: RunInfo) -> Series:
        """The job's MLflow run's metric histories and events (``events.jsonl``), read with ``MlflowClient``."""
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.store(run, "tracking_uri"))
        experiment = client.get_experiment_by_name(self.settings["experiment"] or run.experiment)
        found = experiment and client.search_runs([experiment.experiment_id], f"tags.`{RUN_ID_TAG}` = '{run.run_id}'",
                                                  run_view_type=ViewType.ALL, max_results=1)
        if not found:
            return {}
        run_id = found[0].info.run_id
        series = {k: sorted(((m.step, m.value) for m in client.get_metric_history(run_id, k)), key=lambda p: p[0])
                  for k in found[0].data.metrics}
        if EVENTS_ARTIFACT in [a.path for a in client.list_artifacts(run_id)]:
            with tempfile.TemporaryDirectory() as tmp:
                series.update(read_event_lines(client.download_artifacts(run_id, EVENTS_ARTIFACT, tmp)).event_series())
        return series

    def _deliver(self, status: Optional[str] = None) -> bool:
        """One attempt to reach the run and send everything waiting. False if MLflow failed."""
        try:
            if self.run_id is None:
                self._connect()
            self._send_metrics()
            self._send_tags()
            if self._events.dirty:
                self._client.log_text(self.run_id, self._events.text(), EVENTS_ARTIFACT)
            if self._models is not None and (self._models.waiting or status is not None):  # the close: files gone
                self._models.deliver(self._client, self._experiment, self.run_id, self.run.run_name,
                                     final=status is not None)
            if status is not None:
                self._end(status)
        except Exception as exc:  # whatever the tracker does, training goes on: retry later
            self._next_try = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, self.settings["backoff_max"])
            code = getattr(exc, "error_code", None)
            wall = sign_in_wall(self.uri, exc)
            if wall:
                raise StoreRefused(wall) from None  # a sign-in page does not go away by waiting
            if code == STORE_REFUSED or (self.run_id is None and code in _PERMANENT):
                raise  # a misconfiguration (a store this MLflow cannot use, bad credentials ...): retrying cannot help
            store = full_disk_store(self.uri, exc)
            if not self._down and store:
                log.warning("msbridge: MLflow's store at %s is on a full disk (%s free); training goes on, %d records "
                            "are held in memory and retried with backoff (jsonl holds every record)",
                            store, free_space(os.path.dirname(os.path.abspath(store))), len(self._pending.records))
            elif not self._down:
                log.warning("msbridge: MLflow at %s is unreachable (%s); training goes on, %d records wait "
                            "in memory and are retried with backoff (jsonl holds every record)",
                            mask_text(self.uri), mask_text(exception_text(exc)), len(self._pending.records))
            self._down, self._why_down = True, "its store's disk full" if store else "unreachable"
            return False
        if self._down:
            log.info("msbridge: MLflow at %s is reachable again; the backlog is delivered", mask_text(self.uri))
        self._down, self._delay, self._next_try = False, float(self.settings["backoff_initial"]), 0.0
        return True

    def _end(self, status: str) -> None:
        """The run's status (a sweep's run: its trial state too), the sweep's parent settled, the best run of its
        sweep (or experiment) marked, and the sweep's saved view written."""
        objective = dict(self.run.config.get("objective") or {})
        metric = objective_metric(objective.get("metric"), set(self._keys))
        if metric is not None:
            self._client.set_tag(self.run_id, OBJECTIVE_TAG, f"{metric} ({objective.get('mode', 'min')})")
        sweep_id = self.run.config.get("sweep_id")
        if sweep_id:
            held = self._client.get_run(self.run_id).data
            self._client.set_tag(self.run_id, STATE_TAG, trial_state(status, held.tags, held.metrics))
        self._client.set_terminated(self.run_id, status, end_time=epoch_ms(self.run.progress.end_time))
        if self._parent is not None:
            settle(self._client, self._experiment, str(sweep_id), self._parent, self.run_id)
        mark_best(self._client, self._experiment, sweep_id, objective.get("mode", "min"))
        page = self._share_view(str(sweep_id)) if sweep_id else None
        server = server_address(self.uri)
        if server:
            run_page = f"/#/experiments/{self._experiment}/runs/{self.run_id}?{MODEL_TRAINING_QUERY}"
            self._page = server + (page or run_page)

    def _share_view(self, sweep_id: str) -> Optional[str]:
        """The sweep's saved view on the experiment, for anyone on the server (``share_sweep_view``), and its page; a
        store that refuses it costs one warning, never the run's close."""
        try:
            return share_sweep_view(self._client, self._experiment, sweep_id)
        except Exception as exc:
            log.warning("msbridge: MLflow at %s did not take the sweep's saved view (%s); msbridge view %s writes it",
                        mask_text(self.uri), mask_text(exception_text(exc)), shlex.quote(self.run.run_dir))

    def _send_metrics(self) -> None:
        while self._pending.records:
            unsure = False  # a call that failed (its reply never came) may have stored its rows: read back first
            if self._pending.tried:
                held = self._held_step()
                self._store_step, unsure = max(self._store_step, held or 0), held is None
            chunk: List[Record] = []
            size = 0
            for rec in self._pending.records:  # whole records, oldest first; a huge record goes alone
                n = len(rec.values) if rec.step > self._store_step else 0  # MLflow has it already: skipped
                if chunk and size + n > METRICS_PER_CALL:
                    break
                chunk.append(rec)
                size += n
            metrics = self._metric_rows(chunk)
            step = max(self._logged_step, max(rec.step for rec in chunk))
            # the tag is set after the rows: read back after a failed call, it says what is stored
            try:
                self._log_batch(f"metrics of steps {chunk[0].step}-{chunk[-1].step}", retry_rejected=unsure,
                                metrics=metrics, tags=[(LAST_STEP_TAG, str(step))])
            except Exception as exc:
                self._pending.failed(len(chunk), exc)
                raise
            self._pending.stored(len(chunk))
            self._logged_step = step

    def _send_tags(self) -> None:
        tags = [(k, fit(v, MAX_TAG_LENGTH)) for k, v in self._tags.items()]
        for i in range(0, len(tags), PARAMS_TAGS_PER_CALL):
            self._log_batch("tags", tags=tags[i:i + PARAMS_TAGS_PER_CALL])
        self._tags.clear()

    def _log_batch(self, what: str, retry_rejected: bool = False, **batch: Any) -> None:
        """``log_batch`` of tuples (``ClientProcess``); a batch MLflow rejects as invalid is skipped, never retried,
        unless ``retry_rejected``: it may hold rows an unconfirmed call stored (a duplicate is refused), so it is
        tried again once the store says what it holds."""
        try:
            self._client.log_batch(self.run_id, **batch)
        except Exception as exc:
            if getattr(exc, "error_code", None) not in _PERMANENT or retry_rejected:
                raise
            log.error("msbridge: MLflow rejected %s, skipped (jsonl holds every record): %s",
                      what, mask_text(exception_text(exc)))

    def _metric_rows(self, records: Sequence[Record]) -> List[Tuple[str, float, int, int]]:
        """``(key, value, timestamp ms, step)`` of each metric of the records after the store's last step; a
        non-finite value as NaN."""
        rows: List[Tuple[str, float, int, int]] = []
        keys, isfinite = self._keys, math.isfinite
        for rec in records:
            if rec.step > self._store_step:
                ms, step = int(rec.time * 1000), rec.step
                rows += [(keys.get(k) or self._key(k), v if isfinite(v) else math.nan, ms, step)
                         for k, v in rec.values.items()]
        return rows

    def _key(self, name: str) -> str:
        """A valid MLflow name for a metric or an event tag, with one warning per renamed name."""
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = clean_key(name)
            if key != name:
                log.warning("msbridge: MLflow rejects the name %r; logged as %r", name, key)
        return key

    def _connect(self) -> None:
        """Find or create the job's run, then log params, tags, artifacts; a failed attempt is redone."""
        run, client = self.run, self._client
        experiment_id = self._experiment = self._experiment_id(client, self.settings["experiment"] or run.experiment)
        if run.config.get("sweep_id") and self._parent is None:  # a sweep's runs are children of one parent run
            self._parent = parent_for(client, experiment_id, str(run.config["sweep_id"]))
        found = client.search_runs([experiment_id], f"tags.`{RUN_ID_TAG}` = '{run.run_id}'",
                                   run_view_type=ALL_RUNS, max_results=1)
        logged: Mapping[str, str] = {}
        if found:
            run_id, logged = found[0].info.run_id, found[0].data.params
            if found[0].info.lifecycle_stage == "deleted":
                client.restore_run(run_id)
            client.update_run(run_id, status="RUNNING")
            self._logged_step = max(self._logged_step, int(found[0].data.tags.get(LAST_STEP_TAG, 0)))
            self._store_step = self._logged_step
            log.info("msbridge: reattached to MLflow run %s; it holds steps up to %d", run_id, self._logged_step)
        else:
            parent = {PARENT_RUN_TAG: self._parent.run_id} if self._parent else {}
            run_id = client.create_run(experiment_id, start_time=epoch_ms(self.run.progress.start_time),
                                       tags={RUN_ID_TAG: run.run_id, **parent},
                                       run_name=self.settings["run_name"] or run.run_name).info.run_id
        if found or run.resumed_from_step:
            self._catch_up(run)
        self.run_id = run_id
        if run.config.get("sweep_id"):
            self._tags[STATE_TAG] = RUNNING
        try:
            renamed: Dict[str, str] = {}
            params = clean_keys({k: fit(v, MAX_PARAM_LENGTH) for k, v in run_params(run).items()}, renamed)
            self._tags.update(clean_keys(run_tags(run), renamed))
            if run.readme:
                self._tags[NOTE_TAG] = run_note(run.readme)
            if renamed:
                log.warning("msbridge: MLflow rejects %d param/tag name(s); logged them as: %s", len(renamed),
                            ", ".join(f"{k!r} -> {v!r}" for k, v in renamed.items()))
            changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
            if changed:
                log.warning("msbridge: MLflow keeps a param's first value; changed since the run began "
                            "(the new values are in config/resolved.yaml): %s", ", ".join(changed))
            new = [(k, v) for k, v in params.items() if k not in logged]
            for i in range(0, len(new), PARAMS_TAGS_PER_CALL):
                self._log_batch("params", params=new[i:i + PARAMS_TAGS_PER_CALL])
            self._send_tags()
            config = json.loads(json.dumps(mask_secrets(dict(run.config)), default=str))  # YAML keeps .inf/.nan
            client.log_text(run_id, yaml.safe_dump(config, sort_keys=False, allow_unicode=True), "config/resolved.yaml")
            client.log_text(run_id, mask_text(run.readme), "README.md")
            meta = json_safe(mask_secrets(dict(run.metadata, run_id=run.run_id, run_name=run.run_name)))
            client.log_text(run_id, json.dumps(meta, indent=2, default=str, allow_nan=False), "run.json")  # strict JSON
        except Exception:
            self.run_id = None  # set up again on the next attempt
            raise

    def _experiment_id(self, client: Any, name: str) -> str:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            location = self.settings["artifact_location"]
            if not location and self.uri.startswith("sqlite:///"):  # MLflow's default: ./mlruns of the cwd
                location = os.path.join(os.path.dirname(os.path.abspath(self.uri[len("sqlite:///"):])), "mlartifacts")
            try:
                return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)
            except Exception:
                experiment = client.get_experiment_by_name(name)  # another run of a sweep made it first
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id

    def _catch_up(self, run: RunInfo) -> None:
        """MLflow may lag jsonl (a crash lost its backlog): queue the steps it misses up to ``resumed_from_step``
        and rebuild the events from this rank's jsonl, once."""
        path = rank_file(run.run_dir, run.rank)
        if self._caught_up or not os.path.exists(path):
            return
        self._caught_up = True
        wal = read_rank_file(path)
        missed = [r for r in wal.records if self._logged_step < r.step <= run.resumed_from_step]
        self._pending.records.extendleft(reversed(missed))
        self._events = EventLog(self._key)
        self._tags.update(self._events.add(wal.events))  # jsonl is written first: it holds the events so far


def sign_in_wall(uri: str, exc: BaseException) -> str:
    """What to say when MLflow's server (or a proxy before it) asks for authentication: a 401/403, or a web page
    where MLflow's JSON should be (a sign-in form); "" for any other failure.

    Example:
        >>> sign_in_wall("http://mlflow.corp", Exception("... not in a valid JSON format. Response body: '<html>"))[:60]
        'MLflow at http://mlflow.corp asks for authentication: it ans'
    """
    code = getattr(exc, "error_code", None)
    if code not in ("UNAUTHENTICATED", "PERMISSION_DENIED") and not _HTML_BODY.search(str(exc)):
        return ""
    answer = {"UNAUTHENTICATED": "401", "PERMISSION_DENIED": "403"}.get(code, "a web page (a sign-in form)")
    return (f"MLflow at {mask_text(uri)} asks for authentication: it answered {answer} where MLflow's API answers "
            "JSON. Give the credentials in the training's environment: MLFLOW_TRACKING_TOKEN (a bearer token), or "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (msbridge masks them as every secret); jsonl "
            "records every step meanwhile")

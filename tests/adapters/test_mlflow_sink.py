"""MlflowSink against real MLflow (embedded sqlite and a real ``mlflow server``), read back with
``MlflowClient`` and compared with the jsonl log of the same records (``JsonlSink`` alongside)."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
import uuid
from dataclasses import replace

import numpy as np
import pytest
import yaml
from helpers.mlflow_reads import artifact_text, assert_same_series, mlflow_series, only_run, steps
from helpers.runs import Handed, make_records, make_run
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import _validate_param_name

from msbridge.adapters.mlflow_tracker.run.fields import MAX_KEY_LENGTH, clean_key
from msbridge.adapters.mlflow_tracker.client.process import ClientProcess
from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.adapters.mlflow_sink import MlflowSink
from msbridge.bench.servers import MlflowServer
from msbridge.errors import ConfigError, MissingDependencyError
from msbridge.process_group import free_port
from msbridge.sinks.base import FAILED, FINISHED, KILLED, Behind, Event, Record
from msbridge.sinks.dispatch import Dispatcher
from msbridge.sinks.runlog import last_step

SECRET = "hunter2"
LONG = "long prompt " * 600  # 7200 characters: over MLflow's 6000
README = "# r1\n\nA *tiny* run."


@pytest.fixture(autouse=True)
def _http_env(monkeypatch):
    """Start each test without MLflow's HTTP limits in the environment (a set one wins over the sink's)."""
    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory, shared_sqlite):
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server"), seed=shared_sqlite[len("sqlite:///"):]) as srv:
        yield srv


@pytest.fixture(params=["sqlite", pytest.param("server", marks=pytest.mark.slow)])
def uri(request, shared_sqlite):
    return shared_sqlite if request.param == "sqlite" else request.getfixturevalue("server").uri


def mlflow_run(tmp_path, run_id=None, params=None, flush_steps=50, **config):
    """A run in an experiment of its own (the module shares stores) whose config and metadata carry a secret,
    as an unmasked config would."""
    experiment = f"exp-{uuid.uuid4().hex[:8]}"
    config = {"experiment": experiment, "flush_steps": flush_steps, "params": params or {},
              "sinks": {"jsonl": {}, "mlflow": {"tracking_uri": f"http://bob:{SECRET}@tracker:5000"}},
              "tags": {"team": "nlp", "api_token": SECRET}, **config}
    metadata = {"command": f"train.py --tracker http://bob:{SECRET}@tracker:5000", "host": "node-7",
                "world_size": 1, "git": {"commit": "0123abcd", "dirty": False},
                "versions": {"msbridge": "0.1.0", "mindspore": "2.9.0", "mindformers": None, "python": "3.11.9"}}
    return make_run(tmp_path, experiment=experiment, run_id=run_id or uuid.uuid4().hex, config=config,
                    metadata=metadata, readme=README)


def open_pair(run, **options):
    """jsonl and MLflow opened with ``run``, each behind the hand-off of its host (held and handed steps skipped)."""
    pair = Handed(JsonlSink()), Handed(MlflowSink(**options))
    for sink in pair:
        sink.open(run)
    return pair


def write(sinks, recs, events=()):
    for sink in sinks:
        sink.write(recs, list(events))


def close(sinks, status=FINISHED):
    for sink in sinks:
        sink.close(status)


class Requests:
    """When each request of each MlflowSink to MLflow started: its real calls into MLflow's client process,
    counted (``_connect`` only hands the child the URI). Counts and spacings hold on a loaded machine too,
    where a wall-clock limit on a sink call would not.

    Example:
        >>> requests = Requests(monkeypatch)
        >>> len(requests.during(sink, sink.flush))  # 0 within the backoff, else 1 attempt
    """

    def __init__(self, monkeypatch):
        self.started = {}  # ClientProcess -> monotonic start of each request
        original = ClientProcess._call

        def counted(client, name, args, kwargs):
            if not name.startswith("_"):
                self.started.setdefault(client, []).append(time.monotonic())
            return original(client, name, args, kwargs)
        monkeypatch.setattr(ClientProcess, "_call", counted)

    def during(self, sink, call, *args):
        """The start times of the requests ``call(*args)`` sent for ``sink``."""
        client = sink._client  # close() lets go of it
        before = len(self.started.get(client, []))
        call(*args)
        return self.started.get(client, [])[before:]


def backoff(initial, maximum):
    """The sink's waits after each failed attempt: ``initial``, doubling, at most ``maximum``."""
    delay = initial
    while True:
        yield delay
        delay = min(2 * delay, maximum)


def assert_backs_off(started, initial, maximum):
    """Each request began at least the backoff after the one before had begun (and failed)."""
    gaps = np.diff(started)
    assert all(gap >= delay for gap, delay in zip(gaps, backoff(initial, maximum))), (gaps, initial)


@pytest.mark.slow
def test_metrics_params_tags_artifacts(uri, tmp_path, monkeypatch):
    params = {"optimizer": {"learning_rate": 3e-4, "betas": [0.9, 0.95], "api_key": SECRET},
              "model": {f"layer_{i}": {"hidden": 64 + i} for i in range(150)}, "data": {"prompt": LONG}}
    run = mlflow_run(tmp_path, params=params, sweep_id="sweep-7")
    calls = []
    original = ClientProcess._call
    monkeypatch.setattr(ClientProcess, "_call",  # the real call to MLflow's client process, counted
                        lambda self, name, args, kwargs: (name == "log_batch" and calls.append(
                            len(kwargs.get("metrics", ())))) or original(self, name, args, kwargs))
    jsonl, sink = open_pair(run, tracking_uri=uri)
    recs = make_records(range(1, 301))
    recs[6] = Record(7, 0, recs[6].time, dict(recs[6].values, **{"train/loss": math.nan}))
    recs[7] = Record(8, 0, recs[7].time, dict(recs[7].values, **{"train/grad_norm": math.inf}))
    events = {0: [Event("anomaly", 7, 0, 1.7e9, {"check": "nonfinite_loss", "value": math.nan})],
              2: [Event("checkpoint", 300, 0, 1.7e9, {"path": "ckpt/step_300.ckpt", "epoch": np.int64(3)})]}
    for i, start in enumerate(range(0, 300, 100)):
        write([jsonl, sink], recs[start:start + 100], events.get(i, ()))
    close([jsonl, sink])

    client = MlflowClient(uri)
    mlrun = only_run(client, run.experiment)
    run_id = mlrun.info.run_id
    assert mlrun.info.status == FINISHED
    # metrics: the jsonl series exactly, NaN and inf both NaN, one call to the child a batch, never one per metric
    # (the child writes them in one transaction, or in MLflow's batches of 1000: the server case takes no more)
    assert_same_series(client, run_id, run.run_dir)
    assert mlflow_series(client, run_id, "train/loss")[6] == (7, "nan")
    assert mlflow_series(client, run_id, "train/grad_norm")[7] == (8, "nan")
    assert [n for n in calls if n] == [100 * len(recs[0].values)] * 3 and len(recs[0].values) == 14
    # params: >100 of them (MLflow takes 100 a call), dot keys, msbridge's own settings, a hashed long value
    logged = mlrun.data.params
    assert logged["optimizer.learning_rate"] == "0.0003" and logged["optimizer.betas"] == "[0.9, 0.95]"
    assert all(logged[f"model.layer_{i}.hidden"] == str(64 + i) for i in range(150))
    assert logged["msbridge.flush_steps"] == "50"
    assert logged["data.prompt"] == "sha256:" + hashlib.sha256(LONG.encode()).hexdigest()
    resolved = yaml.safe_load(artifact_text(client, run_id, "config/resolved.yaml", tmp_path))
    assert resolved["params"]["data"]["prompt"] == LONG
    # tags
    tags = mlrun.data.tags
    assert tags["msbridge.run_id"] == run.run_id and tags["msbridge.last_step"] == "300"
    assert (tags["msbridge.version"], tags["mindspore.version"], tags["python.version"]) == ("0.1.0", "2.9.0", "3.11.9")
    assert "mindformers.version" not in tags  # not installed: no tag rather than "None"
    assert tags["msbridge.host"] == "node-7" and tags["msbridge.world_size"] == "1"
    assert tags["mlflow.source.git.commit"] == "0123abcd" and tags["msbridge.sweep_id"] == "sweep-7"
    assert tags["team"] == "nlp" and tags["api_token"] == "***"
    assert tags["mlflow.note.content"] == README  # the run page's description
    assert client.get_experiment(mlrun.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert tags["msbridge.event.anomaly.last"].startswith("step 7: ") and tags["msbridge.event.checkpoint.last"] == \
        'step 300: {"path": "ckpt/step_300.ckpt", "epoch": "3"}'
    # artifacts
    assert {a.path for a in client.list_artifacts(run_id)} == {"README.md", "run.json", "config", "events.jsonl"}
    assert artifact_text(client, run_id, "README.md", tmp_path) == README
    assert json.loads(artifact_text(client, run_id, "run.json", tmp_path))["run_id"] == run.run_id
    lines = [json.loads(x) for x in artifact_text(client, run_id, "events.jsonl", tmp_path).splitlines()]
    assert [(e["kind"], e["step"]) for e in lines] == [("anomaly", 7), ("checkpoint", 300)]
    # never a secret, anywhere
    texts = [artifact_text(client, run_id, p, tmp_path) for p in ("README.md", "run.json", "config/resolved.yaml")]
    assert not [t for t in texts + [json.dumps(logged), json.dumps(tags)] if SECRET in t]
    assert logged["msbridge.sinks.mlflow.tracking_uri"] == "http://bob:***@tracker:5000"


def _refuse(constant):
    raise ValueError(f"not JSON: {constant}")


def test_artifacts_are_strict_json_with_nonfinite_values(shared_sqlite, tmp_path):
    run = replace(mlflow_run(tmp_path, params={"warmup": math.inf}),
                  metadata={"final loss": math.nan, "best": -math.inf, "nested": {"x": [math.nan]}})
    sink = MlflowSink(tracking_uri=shared_sqlite)
    sink.open(run)
    sink.write(make_records(range(1, 3)), [Event("anomaly", 2, 0, 1.0, {"value": math.nan})])
    sink.close(FINISHED)
    client = MlflowClient(shared_sqlite)
    run_id = only_run(client, run.experiment).info.run_id
    meta = json.loads(artifact_text(client, run_id, "run.json", tmp_path), parse_constant=_refuse)  # strict parse
    assert (meta["final loss"], meta["best"], meta["nested"]) == ("nan", "-inf", {"x": ["nan"]})
    for line in artifact_text(client, run_id, "events.jsonl", tmp_path).splitlines():
        json.loads(line, parse_constant=_refuse)
    assert yaml.safe_load(artifact_text(client, run_id, "config/resolved.yaml", tmp_path))["params"]["warmup"] == math.inf


@pytest.mark.parametrize("status", [FAILED, KILLED])
def test_final_status(uri, tmp_path, status):
    run = mlflow_run(tmp_path)
    jsonl, sink = open_pair(run, tracking_uri=uri)
    write([jsonl, sink], make_records(range(1, 6)))
    close([jsonl, sink], status)
    client = MlflowClient(uri)
    mlrun = only_run(client, run.experiment)
    assert mlrun.info.status == status
    assert_same_series(client, mlrun.info.run_id, run.run_dir)


@pytest.mark.slow
def test_resume_reattaches_and_never_logs_a_step_twice(uri, tmp_path, caplog):
    run = mlflow_run(tmp_path, flush_steps=50)
    jsonl, sink = open_pair(run, tracking_uri=uri)
    write([jsonl, sink], make_records(range(1, 61), seed=1), [Event("anomaly", 30, 0, 1.0, {"check": "spike"})])
    # The process dies here: no close. The job resumes from its step-40 checkpoint with a new flush_steps
    # and hands steps 41-60 over again (resumed_from_step stays 0): the sink's own last-step tag must hold.
    resumed = replace(run, config={**run.config, "flush_steps": 25})
    jsonl, sink = open_pair(resumed, tracking_uri=uri)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        write([jsonl, sink], make_records(range(41, 101), seed=2), [Event("anomaly", 90, 0, 2.0, {"check": "spike"})])
    close([jsonl, sink])

    client = MlflowClient(uri)
    mlrun = only_run(client, run.experiment)
    assert mlrun.info.status == FINISHED and mlrun.data.tags["msbridge.last_step"] == "100"
    for name in ("train/loss", "perf/step_time_ms"):
        assert steps(client, mlrun.info.run_id, name) == list(range(1, 101)), name  # each step once
    first = dict((r.step, r.values["train/loss"]) for r in make_records(range(1, 61), seed=1))
    assert dict(mlflow_series(client, mlrun.info.run_id, "train/loss"))[50] == first[50]  # the first attempt's
    assert_same_series(client, mlrun.info.run_id, run.run_dir)
    assert mlrun.data.params["msbridge.flush_steps"] == "50"  # MLflow keeps a param's first value ...
    assert "msbridge.flush_steps" in caplog.text  # ... and says which changed
    events = artifact_text(client, mlrun.info.run_id, "events.jsonl", tmp_path).splitlines()
    assert [json.loads(e)["step"] for e in events] == [30, 90]


@pytest.mark.slow
def test_resume_catches_up_from_the_jsonl_log(uri, tmp_path):
    """MLflow lagged when the job died (its backlog was in memory): resuming fills the gap from jsonl."""
    run = mlflow_run(tmp_path)
    jsonl, sink = open_pair(run, tracking_uri=uri)
    write([jsonl, sink], make_records(range(1, 41), seed=1))
    never_in_mlflow = make_records(range(41, 61), seed=1)
    jsonl.write(never_in_mlflow, [Event("anomaly", 50, 0, 5.0, {"check": "spike"})])
    jsonl, sink = open_pair(replace(run, resumed_from_step=60), tracking_uri=uri)
    write([jsonl, sink], make_records(range(55, 101), seed=2))  # the callback would skip 55-60; the sink must too
    close([jsonl, sink])
    client = MlflowClient(uri)
    mlrun = only_run(client, run.experiment)
    assert steps(client, mlrun.info.run_id) == list(range(1, 101))
    assert_same_series(client, mlrun.info.run_id, run.run_dir)
    events = artifact_text(client, mlrun.info.run_id, "events.jsonl", tmp_path).splitlines()
    assert [json.loads(e)["step"] for e in events] == [50]
    assert mlrun.data.tags["msbridge.event.anomaly.last"].startswith("step 50: ")


@pytest.mark.slow
def test_backlog_is_bounded_and_close_gives_up_in_time(tmp_path, caplog, monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every request is refused, for real
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "300")  # the user's own setting
    requests = Requests(monkeypatch)
    sink = MlflowSink(tracking_uri=uri, max_pending=30, close_timeout=1.0, backoff_initial=0.1)
    run = mlflow_run(tmp_path)
    sink.open(run)
    # MLflow's HTTP limits go to its client process; the user's own setting (inherited) wins
    assert sink._client._env == {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    refused = []
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        for start in range(1, 100, 10):
            try:
                sink.write(make_records(range(start, start + 10)), [])
            except Behind:  # not taken: its host reads these from jsonl once MLflow takes a batch again
                refused.append(start)
        tries = requests.during(sink, sink.close)
    assert refused == list(range(31, 100, 10)), "nothing past max_pending waits in memory"
    # close retries with backoff (waits of at least 0.1, 0.2, 0.4 ... s) while close_timeout=1 s lasts, then makes
    # a last try at the deadline: 1 s holds three such waits, so five requests at most, however slow the machine
    assert 1 <= len(tries) <= 5
    assert_backs_off(tries[:-1], 0.1, 60.0)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in m for m in messages) == 1
    assert sum("dropping the oldest" in m for m in messages) == 0
    lost = "steps 1-30 (30 records)"  # none sent: exact; the refused ones are its host's to count
    assert [m for m in messages if "gave up" in m] == [
        f"msbridge: gave up on MLflow at {uri}: {lost} and status FINISHED not delivered; "
        f"once it is back: msbridge replay {run.run_dir} --to mlflow"]
    assert sink.undelivered() == (f"{lost} and status FINISHED not delivered to MLflow at {uri} "
                                "(unreachable until close_timeout ran out)")  # the run's outcome lists it


@pytest.mark.slow
def test_server_killed_mid_run_and_down_at_start(server, tmp_path, caplog, monkeypatch):
    """Job A logs, the server is SIGKILLed, job B starts during the outage; both keep writing,
    the server comes back on the same port, and both runs end complete, each step once.

    No write or flush blocks its caller: each sends one request at most (MLflow's own retries are off, so that
    is one refused connection), and a sink's requests are spaced by its backoff."""
    uri = f"http://user:secret@127.0.0.1:{server.port}"  # fake credentials: they must never be logged
    options = dict(tracking_uri=uri, backoff_initial=0.2, backoff_max=1.0, close_timeout=30)
    caplog.set_level(logging.INFO)
    requests = Requests(monkeypatch)

    def unreachable_warnings():
        return [r for r in caplog.records if r.levelno == logging.WARNING and "unreachable" in r.getMessage()]

    run_a, run_b = mlflow_run(tmp_path), mlflow_run(tmp_path)
    jsonl_a, sink_a = open_pair(run_a, **options)
    write([jsonl_a, sink_a], make_records(range(1, 41)))
    client = MlflowClient(server.uri)
    assert len(client.get_metric_history(sink_a.run_id, "train/loss")) == 40
    server.kill()
    try:
        jsonl_b, sink_b = open_pair(run_b, **options)
        outage = {sink_a: [], sink_b: []}
        for start in (41, 61, 81):
            for jsonl, sink in ((jsonl_a, sink_a), (jsonl_b, sink_b)):
                jsonl.write(make_records(range(start, start + 20)), [])
                wrote = requests.during(sink, sink.write, make_records(range(start, start + 20)), [])
                flushed = requests.during(sink, sink.flush)
                assert len(wrote) <= 1 and len(flushed) <= 1, "one attempt per call, never a retry loop in it"
                outage[sink] += wrote + flushed
            time.sleep(0.3)  # longer than the first backoff: the next round tries again
        assert len(unreachable_warnings()) == 2  # one per sink, not one per failed attempt
    finally:
        server.start()
    for sink, started in outage.items():
        assert sink._client._env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"  # a request is one connection attempt
        assert len(started) >= 2, "rounds 1 and 2 both tried"
        assert_backs_off(started, 0.2, 1.0)
    for pair in ((jsonl_a, sink_a), (jsonl_b, sink_b)):
        write(pair, make_records(range(101, 121)))
        close(pair)

    for run, first in ((run_a, 1), (run_b, 41)):
        mlrun = only_run(client, run.experiment)
        assert mlrun.info.status == FINISHED
        assert steps(client, mlrun.info.run_id) == list(range(first, 121))
        assert_same_series(client, mlrun.info.run_id, run.run_dir)
    assert all(f"http://user:***@127.0.0.1:{server.port}" in r.getMessage() for r in unreachable_warnings())
    assert "secret" not in caplog.text


def test_names_mlflow_rejects_are_cleaned_with_one_warning(shared_sqlite, tmp_path, caplog):
    run = mlflow_run(tmp_path, params={"lr@warmup": 1, "lr_warmup": 2, "k" * 300: 3, "../up": 4, "学习率": 5})
    sink = MlflowSink(tracking_uri=shared_sqlite)
    sink.open(run)
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        sink.write([Record(1, 0, 1.0, {"eval/acc@1": 0.5})], [])
        sink.close()
    mlrun = only_run(MlflowClient(shared_sqlite), run.experiment)
    params = mlrun.data.params
    assert params["lr_warmup"] == "2" and params["学习率"] == "5"  # valid names kept
    assert params[clean_key("../up")] == "4" and clean_key("../up").startswith("__/up-")
    renamed = {k: v for k, v in params.items() if v in ("1", "3")}
    assert len(renamed) == 2 and all(len(k) <= MAX_KEY_LENGTH for k in renamed)
    assert mlrun.data.metrics == {clean_key("eval/acc@1"): 0.5} and clean_key("eval/acc@1") != "eval/acc_1"
    param_warnings = [r for r in caplog.records if "param/tag name" in r.getMessage()]
    assert len(param_warnings) == 1 and "'lr@warmup' ->" in param_warnings[0].getMessage()


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=400))
def test_clean_key_is_always_valid(key):
    name = clean_key(key)
    _validate_param_name(name)  # MLflow's own check: raises on a name it would reject
    assert len(name) <= MAX_KEY_LENGTH and clean_key(name) == name
    try:
        _validate_param_name(key)
    except MlflowException:
        return
    if len(key) <= MAX_KEY_LENGTH and not key.endswith("\n"):  # MLflow's regex `$` lets a last "\n" through
        assert name == key  # a name MLflow takes is kept as it is


def test_one_record_over_a_batch_is_split(shared_sqlite, tmp_path):
    run = mlflow_run(tmp_path)
    sink = MlflowSink(tracking_uri=shared_sqlite)
    sink.open(run)
    wide = {f"dist/loss/rank_{r}": float(r) for r in range(2500)}
    sink.write([Record(1, 0, 1.0, wide), Record(2, 0, 2.0, {"train/loss": 1.0})], [])
    sink.close()
    mlrun = only_run(MlflowClient(shared_sqlite), run.experiment)
    assert mlrun.data.metrics == {**wide, "train/loss": 1.0} and mlrun.data.tags["msbridge.last_step"] == "2"


def test_the_run_is_reached_at_start_and_mlflow_runs_in_a_child_process(shared_sqlite, tmp_path):
    """Through the dispatcher, the MLflow run exists before any window; MLflow's client is a child process
    (its own GIL; away from a live training at this process's priority), started again if it dies, and ended
    by close; no step is lost."""
    run = mlflow_run(tmp_path)
    sink = MlflowSink(tracking_uri=shared_sqlite)
    dispatcher = Dispatcher([JsonlSink(), sink], run)
    client = MlflowClient(shared_sqlite)
    deadline = time.monotonic() + 60
    while not client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 f"tags.`msbridge.run_id` = '{run.run_id}'"):
        assert time.monotonic() < deadline, "the MLflow run was not created at start"
        time.sleep(0.1)
    dispatcher.submit(make_records(range(1, 21)))
    assert dispatcher.flush(timeout=60)
    first = sink._client._proc
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert first.pid != os.getpid() and os.getpriority(os.PRIO_PROCESS, first.pid) == mine
    first.kill()
    first.wait()
    dispatcher.submit(make_records(range(21, 41)))
    assert dispatcher.flush(timeout=60)
    second = sink._client._proc
    assert second.pid != first.pid and os.getpriority(os.PRIO_PROCESS, second.pid) == mine
    dispatcher.close(FINISHED)
    assert dispatcher.failures == {} and sink._client is None and second.poll() == 0  # close ended it
    mlrun = only_run(client, run.experiment)
    assert mlrun.info.status == FINISHED and steps(client, mlrun.info.run_id) == list(range(1, 41))
    assert_same_series(client, mlrun.info.run_id, run.run_dir)


def _stored_steps(client, run):
    """The run's ``train/loss`` steps in MLflow (none before its experiment and run exist)."""
    experiment = client.get_experiment_by_name(run.experiment)
    found = client.search_runs([experiment.experiment_id]) if experiment is not None else []
    return steps(client, found[0].info.run_id) if found else []


@pytest.mark.parametrize("batch_seconds", [60, 0])
def test_batch_seconds_holds_later_batches_for_one_write_and_the_close_delivers_them(shared_sqlite, tmp_path,
                                                                                    batch_seconds):
    """Through the dispatcher, read back with MLflow's own client: the first batch is in MLflow at once; at
    ``batch_seconds: 60`` the next two wait (jsonl holds them), at 0 they arrive without a close; the close delivers
    every step once either way."""
    run = mlflow_run(tmp_path)
    wal = JsonlSink()
    dispatcher = Dispatcher([wal, MlflowSink(tracking_uri=shared_sqlite, batch_seconds=batch_seconds)], run)
    client = MlflowClient(shared_sqlite)

    def wait_for(wanted):
        deadline = time.monotonic() + 60
        while _stored_steps(client, run) != wanted and time.monotonic() < deadline:
            time.sleep(0.1)
        return _stored_steps(client, run)

    dispatcher.submit(make_records(range(1, 11)))
    assert wait_for(list(range(1, 11))) == list(range(1, 11)), "the first batch at once"
    dispatcher.submit(make_records(range(11, 21)))
    dispatcher.submit(make_records(range(21, 31)))
    if batch_seconds:
        time.sleep(2.0)
        assert _stored_steps(client, run) == list(range(1, 11)), "later batches wait for batch_seconds"
        assert last_step(wal.path) == 30, "jsonl holds them meanwhile"
    else:
        assert wait_for(list(range(1, 31))) == list(range(1, 31)), "at 0, each batch as it is flushed"
    started = time.monotonic()
    dispatcher.close(FINISHED)
    assert time.monotonic() - started < 30 and dispatcher.failures == {}
    assert _stored_steps(client, run) == list(range(1, 31)), "every step once, at the close"
    assert_same_series(client, only_run(client, run.experiment).info.run_id, run.run_dir)


def test_describe_masks_the_uri(tmp_path):
    run = mlflow_run(tmp_path)
    local, remote = MlflowSink(), MlflowSink(tracking_uri=f"https://bob:{SECRET}@mlflow.example.com", experiment="e")
    db = f"sqlite:///{tmp_path / run.experiment}/mlflow.db"
    assert local.describe(run) == {"where": f"{db} (experiment {run.experiment!r})"}
    assert remote.describe(run) == {"where": "https://bob:***@mlflow.example.com (experiment 'e')"}
    for never_opened in (local, remote):
        child = never_opened._client._proc
        never_opened.close()
        assert child.poll() == 0, "close ends the client process of a sink never opened"


def test_configuration_problems_are_named_not_waited_out(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="trackign_uri: unknown option; did you mean 'tracking_uri'"):
        MlflowSink(trackign_uri="sqlite:///x.db")
    with pytest.raises(ConfigError, match="http_timeout: expected null or a number >= 0"):
        MlflowSink(http_timeout="fast")
    for file_store in (str(tmp_path / "mlruns"), f"file://{tmp_path}/mlruns"):  # MLflow 3 refuses its file store
        with pytest.raises(ConfigError, match="is in maintenance mode .* set MLFLOW_ALLOW_FILE_STORE=true"):
            MlflowSink(tracking_uri=file_store)
    # A fake for a fault we cannot cause for real here: mlflow is installed in this venv.
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'msbridge\[mlflow\]'"):
        MlflowSink()


@pytest.mark.slow
def test_bridge_monitor_training_matches_jsonl(tmp_path):
    from helpers.training import train_regression

    import msbridge

    monitor = msbridge.BridgeMonitor({"sinks": ["jsonl", "mlflow"], "experiment": "t", "flush_steps": 10,
                                      "output_dir": str(tmp_path / "{experiment}/{run_name}")}, progress=False)
    train_regression([monitor], steps=24, epochs=2)  # nn.Dense, Model.train(dataset_sink_mode=False), CPU
    client = MlflowClient(f"sqlite:///{tmp_path}/t/mlflow.db")  # the default: the experiment dir's store
    mlrun = only_run(client, "t")
    assert mlrun.info.status == FINISHED and mlrun.data.tags["msbridge.run_id"] == monitor.run.run_id
    assert len(client.get_metric_history(mlrun.info.run_id, "train/loss")) == 48
    assert_same_series(client, mlrun.info.run_id, monitor.run_dir)
    assert os.path.isdir(tmp_path / "t" / "mlartifacts")  # artifacts beside the store, not in the cwd


class _SignInPage:
    """A web server that answers every request with an HTML sign-in form, as an authenticating proxy in front of a
    team's MLflow does: ``status`` 200 (the form itself) or 401."""

    def __init__(self, status):
        import http.server
        import threading

        body = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body><form>Sign in</form></body></html>"

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.slow
@pytest.mark.parametrize("status", [200, 401])
def test_a_server_that_asks_for_a_sign_in_is_named_so_not_waited_for(tmp_path, monkeypatch, status):
    page = _SignInPage(status)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cr3t-pw")
    sink = MlflowSink(tracking_uri=f"http://bob:s3cr3t-url@127.0.0.1:{page.port}", close_timeout=30,
                      http_retries=0)
    sink.open(mlflow_run(tmp_path))
    with pytest.raises(Exception, match="asks for authentication") as raised:
        sink.write(make_records(range(1, 3)), [])
    started = time.monotonic()
    sink.close(FINISHED)
    assert time.monotonic() - started < 10  # said, not retried for close_timeout
    page.server.shutdown()
    for said in (str(raised.value), sink.undelivered()):
        assert "MLFLOW_TRACKING_TOKEN" in said and "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in said
        assert ("answered 401" if status == 401 else "a web page (a sign-in form)") in said
        assert "s3cr3t" not in said and "unreachable" not in said

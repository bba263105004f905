"""TensorBoardSink: read back with TensorBoard's own reader, compared with the jsonl log of the same records."""
from __future__ import annotations

import glob
import logging
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from helpers.runs import Handed, make_records, make_run
from helpers.wire_cases import SCALAR_EVENTS
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import metadata as hp_metadata

from msbridge.adapters._eventwire import TENSORBOARD_VALUE, scalar_event, version_event
from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.adapters.tensorboard_sink import TensorBoardSink, _as_hparams, clean_tag
from msbridge.errors import MissingDependencyError
from msbridge.names import is_global_metric
from msbridge.sinks.base import FAILED, FINISHED, KILLED, Event, Record
from msbridge.sinks.dispatch import Dispatcher
from msbridge.sinks.runlog import read_run

README = "# run r1\n\nA *tiny* run."
PARAMS = {"optimizer": {"lr": 0.01, "betas": [0.9, 0.95]}, "model": {"hidden": 4, "act": "gelu"}}


def tb_run(tmp_path, params=PARAMS, **fields):
    """A run whose config and metadata the HPARAMS tab shows."""
    return make_run(tmp_path, config={"params": params, "experiment": "exp", "flush_steps": 5, "step_interval": 1},
                    metadata={"batch_size": 8}, readme=README, **fields)


def tb_root(tmp_path, name="r1"):
    return str(tmp_path / "exp" / "tensorboard" / name)


def load(path):
    ea = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def series(ea, tag):
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def texts(ea, tag):
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(tag)]


def same_series(tb, jsonl):
    """TensorBoard stores float32; jsonl keeps float64 and reads any non-finite value back as NaN."""
    assert [s for s, _ in tb] == [s for s, _ in jsonl]
    for (step, got), (_, want) in zip(tb, jsonl):
        if math.isnan(want):
            assert not math.isfinite(got), step
        else:
            assert got == np.float32(want), step


def test_series_equal_the_jsonl_log_and_split_global_from_rank(tmp_path):
    run = tb_run(tmp_path, world_size=2)
    jsonl, tb = JsonlSink(), TensorBoardSink()
    batch1, batch2 = make_records(range(1, 8), world_size=2), make_records(range(8, 13), world_size=2)
    for sink in (jsonl, tb):
        sink.open(run)
        sink.write(batch1, [])
        sink.write(batch2, [])
        sink.close(FINISHED)

    log = read_run(run.run_dir).ranks[0]
    glob_ea, rank_ea = load(tb_root(tmp_path)), load(os.path.join(tb_root(tmp_path), "rank_0"))
    names = log.metric_names()
    assert {n for n in names if is_global_metric(n)} == {"train/global_loss", "dist/loss_std",
                                                          "dist/loss/rank_0", "dist/loss/rank_1"}
    for name in names:
        here, other = (glob_ea, rank_ea) if is_global_metric(name) else (rank_ea, glob_ea)
        same_series(series(here, name), log.series(name))
        assert name not in other.Tags()["scalars"]
    assert len(series(rank_ea, "train/loss")) == 12


def test_ranks_side_by_side_and_only_the_global_rank_writes_the_run_dir(tmp_path):
    logdir = str(tmp_path / "tb")
    for rank in (1, 0):
        sink = TensorBoardSink(logdir=logdir)
        sink.open(tb_run(tmp_path, rank=rank, world_size=2))
        sink.write(make_records(range(1, 6), rank=rank, world_size=2), [])
        sink.close(FINISHED)
        if rank == 1:  # only the global rank writes the run's global dir
            assert glob.glob(os.path.join(logdir, "r1", "events.*")) == []

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    assert sorted(mux.Runs()) == ["r1", "r1/rank_0", "r1/rank_1"]
    rank1 = load(os.path.join(logdir, "r1", "rank_1"))
    rank1_records = make_records(range(1, 6), rank=1, world_size=2)
    assert [v for _, v in series(rank1, "train/loss")] == [np.float32(r.values["train/loss"]) for r in rank1_records]
    assert sorted(rank1.Tags()["scalars"]) == sorted(rank1_records[0].values)  # its own metrics, no global one
    assert not [n for n in rank1_records[0].values if is_global_metric(n)] and len(rank1_records[0].values) == 11
    with pytest.raises(KeyError):  # hparams are the global rank's job
        rank1.PluginTagToContent("hparams")


def test_hparams_readme_events_and_status_in_the_run_dir(tmp_path):
    run = tb_run(tmp_path)
    sink = Handed(TensorBoardSink())  # the status and the hparams at the last step handed
    sink.open(run)
    recs = [Record(s, 0, time.time(), {"train/loss": l, "train/global_loss": g})
            for s, l, g in [(1, 3.0, 2.5), (2, 2.0, 1.5), (3, 2.2, 1.8)]]
    sink.write(recs, [Event("anomaly", 2, 0, time.time(), {"check": "loss_spike", "value": 9.5})])
    sink.close(FINISHED)

    root = tb_root(tmp_path)
    # in the run's own dir, not in a timestamped subdir as tensorboardX's add_hparams would put them
    assert [d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))] == ["rank_0"]
    ea = load(root)
    content = ea.PluginTagToContent("hparams")
    assert set(content) == {hp_metadata.SESSION_START_INFO_TAG, hp_metadata.SESSION_END_INFO_TAG}
    start = hp_metadata.parse_session_start_info_plugin_data(content[hp_metadata.SESSION_START_INFO_TAG])
    hp = {k: (v.number_value if v.HasField("number_value") else v.string_value) for k, v in start.hparams.items()}
    assert hp == {"optimizer.lr": 0.01, "optimizer.betas": "[0.9, 0.95]", "model.hidden": 4.0, "model.act": "gelu",
                  "msbridge.experiment": "exp", "msbridge.flush_steps": 5.0, "msbridge.step_interval": 1.0,
                  "msbridge.world_size": 1.0, "msbridge.batch_size": 8.0}
    end = hp_metadata.parse_session_end_info_plugin_data(content[hp_metadata.SESSION_END_INFO_TAG])
    assert end.status == 1  # STATUS_SUCCESS
    assert series(ea, "hparams/final_loss") == [(3, np.float32(2.2))]
    assert series(ea, "hparams/final_global_loss") == [(3, np.float32(1.8))]
    assert series(ea, "hparams/best_loss") == [(3, np.float32(1.5))]  # best of the global loss
    assert texts(ea, "run/README") == [(0, README)]
    assert texts(ea, "run/status") == [(3, FINISHED)]
    rank_ea = load(os.path.join(root, "rank_0"))
    [(step, text)] = texts(rank_ea, "events/anomaly")
    assert step == 2 and "loss_spike" in text and "9.5" in text
    assert texts(rank_ea, "run/status") == [(3, FINISHED)]


@pytest.mark.parametrize("status", [FAILED, KILLED])
def test_a_failed_run_is_a_failed_hparams_session(tmp_path, status):
    sink = Handed(TensorBoardSink())
    sink.open(tb_run(tmp_path))
    sink.write([Record(1, 0, time.time(), {"train/loss": math.nan})], [])
    sink.close(status)
    ea = load(tb_root(tmp_path))
    end = hp_metadata.parse_session_end_info_plugin_data(
        ea.PluginTagToContent("hparams")[hp_metadata.SESSION_END_INFO_TAG])
    assert end.status == 2  # STATUS_FAILURE
    assert texts(ea, "run/status") == [(1, status)]
    assert math.isnan(series(ea, "hparams/final_loss")[0][1])
    assert "hparams/best_loss" not in ea.Tags()["scalars"]  # no finite loss: no best


def test_the_hparams_tab_compares_a_sweep(tmp_path):
    """TensorBoard's own hparams backend lists both runs, with every run's keys and metrics."""
    from tensorboard import context
    from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups

    for i, lr in enumerate([0.1, 0.01]):
        params = {"optimizer": {"lr": lr}, **({"extra": "b-only"} if i else {})}
        sink = TensorBoardSink()
        sink.open(tb_run(tmp_path, name=f"lr{lr}", params=params))
        sink.write([Record(s, 0, time.time(), {"train/loss": lr * 10 / s}) for s in (1, 2, 3)]
                   + [Record(3, 0, time.time(), {"objective/best": lr * 5, "objective/best_step": 3.0})], [])
        sink.close(FINISHED)

    logdir = str(tmp_path / "exp" / "tensorboard")
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    ctx = backend_context.Context(base_plugin.TBContext(
        logdir=logdir, multiplexer=mux, data_provider=MultiplexerDataProvider(mux, logdir)))
    request_ctx = context.RequestContext()
    exp = get_experiment.Handler(request_ctx, ctx, "", api_pb2.GetExperimentRequest()).run()
    assert {"optimizer.lr", "extra"} <= {h.name for h in exp.hparam_infos}
    assert ("", "hparams/final_loss") in {(m.name.group, m.name.tag) for m in exp.metric_infos}
    request = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=10,
                                               allowed_statuses=[api_pb2.STATUS_SUCCESS])
    request.col_params.add(hparam="optimizer.lr")
    request.col_params.add(metric=api_pb2.MetricName(tag="hparams/final_loss"))
    request.col_params.add(metric=api_pb2.MetricName(tag="hparams/objective_best"), order=api_pb2.ORDER_ASC)
    groups = list_session_groups.Handler(request_ctx, ctx, "", request).run().session_groups
    final = {g.name: ({k: v.number_value for k, v in g.hparams.items() if k == "optimizer.lr"},
                      [m.value for m in g.metric_values if m.name.tag == "hparams/final_loss"])
             for g in groups}
    assert final == {"lr0.1": ({"optimizer.lr": 0.1}, [pytest.approx(1 / 3)]),
                     "lr0.01": ({"optimizer.lr": 0.01}, [pytest.approx(0.1 / 3)])}
    # the sweep's objective per session, the HParams table sorted on it: the best run first
    best = [(g.name, [m.value for m in g.metric_values if m.name.tag == "hparams/objective_best"]) for g in groups]
    assert best == [("lr0.01", [pytest.approx(0.05)]), ("lr0.1", [pytest.approx(0.5)])]


def hparams_of(path):
    """The HPARAMS tab's values of the run's last session (its last session-start summary; EventAccumulator keeps
    a tag's first), read with TensorBoard's event file loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    contents = [v.metadata.plugin_data.content for f in sorted(glob.glob(os.path.join(path, "events.out.*")))
                for e in EventFileLoader(f).Load() for v in e.summary.value
                if v.tag == hp_metadata.SESSION_START_INFO_TAG]
    start = hp_metadata.parse_session_start_info_plugin_data(contents[-1])
    return {k: v.number_value if v.HasField("number_value") else v.string_value for k, v in start.hparams.items()}


def test_a_sweeps_trial_state_is_an_hparam_and_a_single_run_has_none(tmp_path):
    """A sweep's run (``sweep_id`` set) adds ``msbridge.trial_state`` as MLflow's tag says it: PRUNED when it holds the
    ``pruned`` event (the trackers are closed FINISHED, its exit), COMPLETE with a finite objective, else FAIL; a run
    outside a sweep has no such key."""
    cases = {"pruned": ("s1", ["pruned"], FINISHED, 2.0), "done": ("s1", [], FINISHED, 0.5),
             "no-objective": ("s1", [], FINISHED, None), "killed": ("s1", [], KILLED, 0.5),
             "single": (None, ["pruned"], FINISHED, 0.5)}
    for name, (sweep_id, kinds, status, best) in cases.items():
        sink = TensorBoardSink()
        sink.open(make_run(tmp_path, name=name, config={"params": {"lr": 0.1}, "sweep_id": sweep_id}))
        values = {"train/loss": 1.0, **({} if best is None else {"objective/best": best})}
        sink.write([Record(5, 0, time.time(), values)],
                   [Event(kind, 5, 0, time.time(), {"metric": "eval/loss"}) for kind in kinds])
        sink.close(status)
    got = {name: hparams_of(tb_root(tmp_path, name)).get("msbridge.trial_state") for name in cases}
    assert got == {"pruned": "PRUNED", "done": "COMPLETE", "no-objective": "FAIL", "killed": "FAIL", "single": None}
    end = hp_metadata.parse_session_end_info_plugin_data(
        load(tb_root(tmp_path, "pruned")).PluginTagToContent("hparams")[hp_metadata.SESSION_END_INFO_TAG])
    assert end.status == 1  # STATUS_SUCCESS: a pruned trial ended as its sweep meant it to (exit code 0)


def test_a_replayed_pruned_trial_keeps_its_state(tmp_path):
    """A replay into a run whose event files hold the ``pruned`` event: the state read back is still PRUNED."""
    run = make_run(tmp_path, name="t1", config={"sweep_id": "s1"})
    sink = TensorBoardSink()
    sink.open(run)
    sink.write([Record(5, 0, time.time(), {"train/loss": 1.0})], [Event("pruned", 5, 0, time.time(), {})])
    sink.close(FINISHED)
    again = TensorBoardSink()
    again.open(run)
    again.write([Record(6, 0, time.time(), {"train/loss": 0.9})], [])
    again.close(FINISHED)
    assert hparams_of(tb_root(tmp_path, "t1"))["msbridge.trial_state"] == "PRUNED"


def test_nonfinite_values_are_stored_as_they_are(tmp_path):
    sink = TensorBoardSink()
    sink.open(tb_run(tmp_path))
    values = [2.0, math.nan, math.inf, -math.inf, 1e39, 1.0]  # 1e39: beyond float32
    sink.write([Record(s + 1, 0, time.time(), {"train/loss": v}) for s, v in enumerate(values)], [])
    sink.close(FINISHED)
    got = [v for _, v in series(load(os.path.join(tb_root(tmp_path), "rank_0")), "train/loss")]
    assert got[0] == 2.0 and math.isnan(got[1]) and got[2:5] == [math.inf, -math.inf, math.inf] and got[5] == 1.0


@pytest.mark.parametrize("step, wall_time, values", SCALAR_EVENTS)
def test_scalar_event_is_byte_for_byte_the_tensorboard_proto(step, wall_time, values):
    from tensorboardX.proto.event_pb2 import Event as TbEvent

    event = TbEvent(wall_time=wall_time, step=step)
    for tag, value in values.items():
        event.summary.value.add(tag=tag, simple_value=value)
    ours = scalar_event(step, wall_time, values, TENSORBOARD_VALUE, {})
    # proto3 leaves out a zero step or wall time; parsed, ours is the message protobuf writes
    assert TbEvent.FromString(ours).SerializeToString() == event.SerializeToString()
    assert step == 0 or ours == event.SerializeToString()
    version = TbEvent(wall_time=wall_time, file_version="brain.Event:2").SerializeToString()
    assert TbEvent.FromString(version_event(wall_time, "brain.Event:2")).SerializeToString() == version


def test_every_step_and_value_reads_back_exactly_with_wall_times(tmp_path):
    """TensorBoard's reader checks each record's CRCs; steps, float32 values and wall times come back as written."""
    values = [2.0, math.nan, math.inf, -math.inf, 1e39, -1e39, 1e-40, 0.1, 3.0]
    recs = [Record(s, 0, 1_700_000_000.25 + s, {"train/loss": v, "perf/samples_per_s": float(s)})
            for s, v in zip(range(10, 10 + 3 * len(values), 3), values)]
    sink = TensorBoardSink()
    sink.open(tb_run(tmp_path))
    sink.write(recs[:4], [])
    sink.write(recs[4:], [])
    sink.flush()  # readable before close
    ea = load(os.path.join(tb_root(tmp_path), "rank_0"))
    got = ea.Scalars("train/loss")
    assert [e.step for e in got] == [r.step for r in recs]
    assert [e.wall_time for e in got] == [r.time for r in recs]
    want = [2.0, math.inf, -math.inf, math.inf, -math.inf, float(np.float32(1e-40)), float(np.float32(0.1)), 3.0]
    assert math.isnan(got[1].value) and [e.value for e in got[:1] + got[2:]] == want  # 1e39: beyond float32
    assert series(ea, "perf/samples_per_s") == [(r.step, float(r.step)) for r in recs]
    sink.close(FINISHED)


def test_invalid_names_are_cleaned_with_one_warning(tmp_path, caplog):
    names = ["train/loss", "eval/acc (top-1)", "/perf/x", "a b", "a_b"]
    sink = TensorBoardSink()
    sink.open(tb_run(tmp_path))
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        sink.write([Record(s, 0, time.time(), {n: float(i + s) for i, n in enumerate(names)}) for s in (1, 2)], [])
        sink.write([Record(3, 0, time.time(), {n: float(i + 3) for i, n in enumerate(names)})], [])
    sink.close(FINISHED)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    for mapping in ("'eval/acc (top-1)' -> 'eval/acc__top-1_'", "'/perf/x' -> 'perf/x'", "'a_b' -> 'a_b_2'"):
        assert mapping in warnings[0]
    assert "'train/loss'" not in warnings[0]
    ea = load(os.path.join(tb_root(tmp_path), "rank_0"))
    assert sorted(ea.Tags()["scalars"]) == ["a_b", "a_b_2", "eval/acc__top-1_", "perf/x", "train/loss"]
    assert series(ea, "a_b") == [(s, 3.0 + s) for s in (1, 2, 3)]  # "a b" came first
    assert series(ea, "a_b_2") == [(s, 4.0 + s) for s in (1, 2, 3)]
    assert clean_tag("dist/loss/rank_3") == "dist/loss/rank_3" and clean_tag("//") == "_"


def test_params_as_hparams():
    assert _as_hparams({"a": {"b": 1, "c": None, "d": {"e": True}}, "f": [1, 2], "g": "x"}) == \
        {"a.b": 1, "a.d.e": True, "f": "[1, 2]", "g": "x"}


def test_resume_adds_a_file_and_never_writes_a_step_twice(tmp_path):
    first = TensorBoardSink()
    first.open(tb_run(tmp_path))
    first.write(make_records(range(1, 6), world_size=1), [])
    first.close(KILLED)
    again = TensorBoardSink()
    again.open(tb_run(tmp_path, resumed_from_step=5))
    again.write(make_records(range(3, 9), world_size=1, seed=1), [])  # restarted from a checkpoint at step 2
    again.close(FINISHED)

    rank_dir = os.path.join(tb_root(tmp_path), "rank_0")
    assert len(glob.glob(os.path.join(rank_dir, "events.out.tfevents.*"))) == 2
    got = series(load(rank_dir), "train/loss")
    assert [s for s, _ in got] == list(range(1, 9))
    expected = [r.values["train/loss"] for r in make_records(range(1, 6), world_size=1)]
    expected += [r.values["train/loss"] for r in make_records(range(3, 9), world_size=1, seed=1)][3:]
    assert [v for _, v in got] == [np.float32(v) for v in expected]


def test_a_replay_writes_exactly_the_steps_each_directory_lacks(tmp_path):
    """Holes (a failed write left the rank dir without steps 4-6 and the run dir without 8-9), not only the tail:
    a replay of steps 1-12 writes each missing step once, in the directory that lacks it, and nothing else."""
    records = make_records(range(1, 13), world_size=1)
    first = TensorBoardSink()
    first.open(tb_run(tmp_path))
    first.write([r for r in records if r.step in (1, 2, 3, 7, 8, 9)], [])
    first.write([Record(r.step, 0, r.time, {k: v for k, v in r.values.items() if not is_global_metric(k)})
                 for r in records if r.step == 10], [])  # step 10's global metrics did not reach the run dir
    first.close(KILLED)
    for _ in range(2):  # the second replay finds nothing missing
        again = TensorBoardSink()
        again.open(tb_run(tmp_path))
        again.write(records, [])
        again.close(KILLED)
    rank_dir = os.path.join(tb_root(tmp_path), "rank_0")
    for folder, name in ((rank_dir, "train/loss"), (tb_root(tmp_path), "train/global_loss")):
        got = sorted(series(load(folder), name))  # the filled steps come from the replay's own (later) file
        assert [s for s, _ in got] == list(range(1, 13)), (folder, [s for s, _ in got])  # every step, each once
        assert [v for _, v in got] == [np.float32(r.values[name]) for r in records]
    assert len(glob.glob(os.path.join(tb_root(tmp_path), "rank_0", "events.out.tfevents.*"))) == 2, \
        "the second replay added no file"


def test_everything_written_is_readable_before_close(tmp_path):
    sink = TensorBoardSink()
    sink.open(tb_run(tmp_path))
    sink.write(make_records(range(1, 1001), world_size=1), [])
    sink.flush()
    assert len(series(load(os.path.join(tb_root(tmp_path), "rank_0")), "train/loss")) == 1000
    assert texts(load(tb_root(tmp_path)), "run/README") == [(0, README)]
    sink.close(FINISHED)


def test_through_the_dispatcher_beside_jsonl(tmp_path):
    run = tb_run(tmp_path)
    dispatcher = Dispatcher([JsonlSink(), TensorBoardSink()], run)
    for start in range(1, 31, 10):
        dispatcher.submit(make_records(range(start, start + 10), world_size=1), [])
    dispatcher.submit([], [Event("checkpoint", 30, 0, time.time(), {"path": "ckpt-30"})])
    assert dispatcher.flush(timeout=30)
    rank_dir = os.path.join(tb_root(tmp_path), "rank_0")
    assert len(series(load(rank_dir), "train/loss")) == 30  # durable at flush, before close
    dispatcher.close(FINISHED)

    assert dispatcher.failures == {}
    log = read_run(run.run_dir).ranks[0]
    rank_ea, glob_ea = load(rank_dir), load(tb_root(tmp_path))
    same_series(series(rank_ea, "train/loss"), log.series("train/loss"))
    same_series(series(glob_ea, "train/global_loss"), log.series("train/global_loss"))
    assert [s for s, _ in texts(rank_ea, "events/checkpoint")] == [30]


def test_describe_and_no_writer_thread(tmp_path):
    run = tb_run(tmp_path)
    sink = TensorBoardSink()
    logdir = str(tmp_path / "exp" / "tensorboard")
    assert sink.describe(run) == {"where": os.path.join(logdir, "r1")}
    before = threading.active_count()
    sink.open(run)
    sink.write(make_records(range(1, 11), world_size=1), [])
    assert threading.active_count() == before  # synchronous: no writer thread to keep busy
    sink.close(FINISHED)
    assert sink.describe(run)["where"] == os.path.dirname(glob.glob(os.path.join(logdir, "r1", "events.*"))[0])


def test_tensorboardx_is_imported_only_by_the_sink(monkeypatch):
    code = "import sys, msbridge.adapters.tensorboard_sink; print('tensorboardX' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(MissingDependencyError, match=r"msbridge\[tensorboard\]"):
        TensorBoardSink()


@pytest.mark.slow
def test_real_training_loss_curve_equals_jsonl(tmp_path):
    from helpers.training import train_regression

    from msbridge import BridgeMonitor

    monitor = BridgeMonitor({"experiment": "tb", "run_name": "dense", "flush_steps": 5,
                             "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
                             "sinks": ["jsonl", "tensorboard"], "params": {"optimizer": {"lr": 0.01}}},
                            progress=False)
    train_regression([monitor], steps=12, epochs=2)

    log = read_run(monitor.run_dir).ranks[0]
    root = str(tmp_path / "tb" / "tensorboard" / "dense")
    rank_ea, glob_ea = load(os.path.join(root, "rank_0")), load(root)
    assert [s for s, _ in series(rank_ea, "train/loss")] == list(range(1, 25))
    same_series(series(rank_ea, "train/loss"), log.series("train/loss"))
    same_series(series(glob_ea, "train/global_loss"), log.series("train/global_loss"))
    assert "train/loss" not in glob_ea.Tags()["scalars"]
    start = hp_metadata.parse_session_start_info_plugin_data(
        glob_ea.PluginTagToContent("hparams")[hp_metadata.SESSION_START_INFO_TAG])
    assert start.hparams["optimizer.lr"].number_value == 0.01
    assert f" view {monitor.run_dir}" in texts(glob_ea, "run/README")[0][1]  # the README says how to look


def test_a_shared_writer_gets_every_series_and_stays_open(tmp_path):
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "theirs" / "rank_0"))  # as mindformers opens one per rank
    writer.add_scalar("loss", 1.5, 1)  # their own series, beside ours
    run = tb_run(tmp_path, world_size=2)
    jsonl, tb = JsonlSink(), TensorBoardSink()
    tb.share_writer(writer)
    for sink in (jsonl, tb):
        sink.open(run)
        sink.write(make_records(range(1, 6), world_size=2), [Event("anomaly", 3, 0, 0.0, {"check": "x"})])
        sink.close(FINISHED)
    assert tb.describe(run)["where"] == str(tmp_path / "theirs" / "rank_0")
    writer.add_scalar("loss", 1.25, 2)  # the owner's writer still works after the sink closed
    writer.close()
    assert not os.path.exists(tb_root(tmp_path)), "no files of our own"
    assert len(os.listdir(tmp_path / "theirs" / "rank_0")) == 1
    ea = load(str(tmp_path / "theirs" / "rank_0"))
    log = read_run(run.run_dir).ranks[0]
    for name in log.metric_names():  # this rank's and the run's global metrics, in the one file
        same_series(series(ea, name), log.series(name))
    assert series(ea, "loss") == [(1, 1.5), (2, 1.25)]
    assert "events/anomaly" in ea.Tags()["tensors"] and "run/README" in ea.Tags()["tensors"]


def test_a_shared_writer_whose_owner_adds_series_meanwhile_takes_every_batch(tmp_path):
    """mindformers' TrainingStateMonitor adds a tensorboardX writer per tag with ``add_scalars`` (the attention
    logits of each head) on the training thread while the sink flushes on its own: the sink flushes only the file it
    writes, never iterating the owner's writers ("dictionary changed size during iteration" lost the sink once)."""
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "theirs" / "rank_0"))

    def owner():  # a new sub-writer at every call, as each head's first logit makes one
        for head in range(200):
            writer.add_scalars("max_attention_logit", {f"head_{head}": 1.0}, head)

    thread = threading.Thread(target=owner, daemon=True)
    tb = TensorBoardSink()
    tb.share_writer(writer)
    tb.open(tb_run(tmp_path))
    thread.start()
    step = 1
    while thread.is_alive():
        tb.write(make_records(range(step, step + 10)), [])
        tb.flush()
        step += 10
    thread.join()
    assert step > 1 and len(writer.all_writers) == 201, "the owner added its writers while the sink wrote"
    assert tb.undelivered() == ""
    tb.close(FINISHED)
    writer.close()

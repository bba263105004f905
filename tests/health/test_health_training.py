"""Health on real MindSpore training (CPU): every check fires where it should and every action is real.

A NaN batch, the seed's "lr x10 for a few dozen steps" drill, a bad batch, a
loss that plateaus and a step that slows down are all made in the data or the
schedule of a real ``Model.train``; weights, checkpoints, dumps and the run's
files are read back from disk.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from helpers import runs
from helpers.training import OutputRecorder
from mindspore import nn
from mindspore.train import Callback, Model
from plateau_oracle import first_plateau

from msbridge import ConfigError
from msbridge.capture.train_step import TrainStep
from msbridge.health.dumps import directory_size
from msbridge.sinks.runlog import read_run

HERE = os.path.dirname(os.path.abspath(__file__))
QUIET = {"throughput_drop": False}  # 1 ms CPU steps are too noisy for it; it has its own test


def data(steps, poison=(), scale=None, batch=8, seed=0):
    """``steps`` batches of a noisy linear regression; ``poison`` steps get NaN inputs,
    ``scale`` maps a step to a factor on its labels (a bad batch). Steps are 1-based."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps * batch, 16)).astype(np.float32)
    y = (x @ rng.normal(size=(16, 1)) + 0.1 * rng.normal(size=(steps * batch, 1))).astype(np.float32)
    for step in poison:
        x[(step - 1) * batch:step * batch] = np.nan
    for step, factor in (scale or {}).items():
        y[(step - 1) * batch:step * batch] *= factor
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(batch, drop_remainder=True)


def train(callbacks, dataset, lr=0.05, cell="plain"):
    """Train a Dense(16, 1) with SGD. ``cell``: plain (Model builds TrainOneStepCell),
    trainstep (msbridge.TrainStep: records grad norm) or skip (TrainStep(skip_nonfinite=True))."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    net = nn.Dense(16, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    if cell == "plain":
        model = Model(net, nn.MSELoss(), opt)
    else:
        model = Model(TrainStep(nn.WithLossCell(net, nn.MSELoss()), opt, skip_nonfinite=cell == "skip"))
    model.train(1, dataset, callbacks=list(callbacks), dataset_sink_mode=False)
    return net


def monitor(tmp_path, health, sinks=("jsonl",), flush_steps=5, extra=()):
    return runs.monitor(tmp_path, extra, experiment="h", flush_steps=flush_steps, sinks=list(sinks),
                        health={**QUIET, **health})


class Weights(Callback):
    """Copies every parameter (weights, optimizer state and step; not msbridge's ring) after every step."""

    def __init__(self):
        super().__init__()
        self.after = {}

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        self.after[int(cb.cur_step_num)] = {p.name: p.asnumpy().copy() for p in cb.train_network.get_parameters()
                                            if not p.name.startswith("msbridge_ring")}


class StopAt(Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            run_context.request_stop()


def events(mon, kind=None, check=None):
    log = read_run(mon.run_dir).ranks[0]
    return [e for e in log.events if (kind is None or e.kind == kind)
            and (check is None or e.detail.get("check") == check)]


def outcome(mon):
    return json.load(open(os.path.join(mon.run_dir, "run.json")))["outcome"]


DRILL_LR = [0.05] * 60 + [0.5] * 30 + [0.05] * 30  # the seed's drill: lr x10 for a few dozen steps


# -- checks ------------------------------------------------------------------------------
@pytest.mark.slow
def test_nan_batch_fires_at_exactly_that_step_and_is_counted_in_every_sink(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    mon = monitor(tmp_path, {"dump_window": 4, "dump_batch": True}, sinks=("jsonl", "tensorboard"))
    train([mon], data(20, poison=[7]))

    log = read_run(mon.run_dir).ranks[0]
    assert [e.step for e in events(mon, "anomaly", "nonfinite")] == [7]
    loss = dict(log.series("train/loss"))
    nan_steps = dict(log.series("health/nan_steps"))
    assert [r.step for r in log.records] == list(range(1, 21)), "production dumps and goes on"
    assert all(nan_steps[s] == sum(not math.isfinite(loss[t]) for t in range(1, s + 1)) for s in loss)
    assert nan_steps[6] == 0 and nan_steps[7] == 1
    assert math.isfinite(dict(log.series("train/loss_ema"))[7]), "the EMA skips the NaN: only the counter shows it"

    [action] = events(mon, "action", "nonfinite")
    dump = action.detail["dump"]
    assert action.step == 7 and dump.startswith(os.path.join(mon.run_dir, "dumps", "step000000007-rank0-nonfinite"))
    assert sorted(os.listdir(dump)) == ["anomaly.json", "batch.npz", "config.json", "window.jsonl"]
    batch = np.load(os.path.join(dump, "batch.npz"))
    assert batch["input_0"].shape == (8, 16) and np.isnan(batch["input_0"]).all(), "the poisoned batch itself"
    window = [json.loads(line) for line in open(os.path.join(dump, "window.jsonl"))]
    assert [w["step"] for w in window] == [4, 5, 6, 7] and window[-1]["values"]["train/loss"] is None
    assert json.load(open(os.path.join(dump, "anomaly.json")))["step"] == 7
    assert json.load(open(os.path.join(dump, "config.json")))["health"]["dump_window"] == 4

    tb = EventAccumulator(str(tmp_path / "h" / "tensorboard" / "r" / "rank_0"), size_guidance={"tensors": 0})
    tb.Reload()
    assert [e.step for e in tb.Tensors("events/anomaly")] == [7]
    assert [(e.step, e.value) for e in tb.Scalars("health/nan_steps")][5:7] == [(6, 0.0), (7, 1.0)]


@pytest.mark.slow
def test_lr_drill_fires_the_grad_norm_check_and_warmup_silences_it(tmp_path):
    health = {"warmup_steps": 20, "grad_norm_spike": {"window": 20}}
    mon = monitor(tmp_path / "drill", health)
    train([mon], data(120), lr=DRILL_LR, cell="trainstep")
    spikes = events(mon, "anomaly", "grad_norm_spike")
    assert spikes and 61 <= spikes[0].step <= 90, "fires inside the x10 window, not before"
    nonfinite = [e.step for e in events(mon, "anomaly", "nonfinite")]
    assert all(step > spikes[0].step for step in nonfinite), "the early warning comes before any NaN"
    grad = dict(read_run(mon.run_dir).ranks[0].series("train/grad_norm"))
    assert grad[spikes[0].step] == pytest.approx(spikes[0].detail["grad_norm"])
    assert grad[spikes[0].step] > 4 * max(grad[s] for s in range(50, 61)) / 2

    quiet = monitor(tmp_path / "warm", {**health, "warmup_steps": 100})
    train([quiet], data(120), lr=DRILL_LR, cell="trainstep")
    assert [e.step for e in events(quiet, "anomaly", "grad_norm_spike") if e.step <= 100] == []


@pytest.mark.slow
def test_a_bad_batch_is_a_loss_spike_with_its_recovery_step(tmp_path):
    mon = monitor(tmp_path, {"warmup_steps": 20, "loss_spike": {"window": 20}})
    train([mon], data(80, scale={50: 2.0}))  # labels doubled for one batch
    [spike] = events(mon, "anomaly", "loss_spike")
    [recovery] = events(mon, "recovery", "loss_spike")
    loss = dict(read_run(mon.run_dir).ranks[0].series("train/loss"))
    assert spike.step == 50 and recovery.detail["spike_step"] == 50
    assert recovery.step == recovery.detail["recovery_step"] > 50
    assert loss[recovery.step] < loss[50] / 10 and loss[recovery.step - 1] > recovery.detail["median"]


@pytest.mark.slow
def test_plateau_early_stops_on_the_smoothed_loss_not_the_raw_one(tmp_path):
    opts = {"action": "stop", "patience": 15, "min_delta": 1e-3, "ema_decay": 0.9}
    mon, ref = monitor(tmp_path, {"warmup_steps": 10, "plateau": opts}), OutputRecorder()
    train([mon, ref], data(300))

    [stop] = events(mon, "early_stop")
    log = read_run(mon.run_dir).ranks[0]
    assert stop.step < 300 and log.records[-1].step == stop.step == ref.steps[-1]
    assert outcome(mon)["status"] == "FINISHED"
    assert outcome(mon)["stopped by"].startswith(f"plateau at step {stop.step}")

    assert first_plateau(ref.losses, decay=0.9, warmup=10, patience=15) == stop.step
    assert first_plateau(ref.losses, decay=None, warmup=10, patience=15) != stop.step


@pytest.mark.slow
def test_throughput_drop_against_the_post_warmup_baseline(tmp_path):
    class Slow(Callback):
        def on_train_step_end(self, run_context):
            time.sleep(0.3 if run_context.original_args().cur_step_num > 60 else 0.01)  # 30x slower from step 61

    # factor 0.2: a shared 2-CPU machine can halve the rate for a few steps, and a loaded one adds time to every
    # step: with 30 ms added, a 10x sleep is a drop to 0.31x only; a 30x sleep is 0.12x (0.19x with 60 ms added)
    health = {"warmup_steps": 10, "throughput_drop": {"baseline_steps": 20, "window": 5, "factor": 0.2}}
    mon = monitor(tmp_path, health)
    train([Slow(), mon], data(80))
    [drop] = events(mon, "anomaly", "throughput_drop")
    assert 61 <= drop.step <= 65 and drop.detail["ratio"] < 0.2 and drop.detail["unit"] == "samples/s"


# -- actions -----------------------------------------------------------------------------
@pytest.mark.slow
def test_stop_ends_training_at_the_firing_step_and_closes_failed(tmp_path):
    mon, ref = monitor(tmp_path, {"profile": "debug"}, flush_steps=100), OutputRecorder()
    train([mon, ref], data(20, poison=[7]))
    log = read_run(mon.run_dir).ranks[0]
    assert [r.step for r in log.records] == list(range(1, 8)) and ref.steps == list(range(1, 8))
    [action] = events(mon, "action", "nonfinite")
    assert action.step == 7 and action.detail["action"] == "stop" and "nonfinite at step 7" in action.detail["reason"]
    assert outcome(mon)["status"] == "FAILED" and "- status: FAILED" in open(mon.run_dir + "/README.md").read()


@pytest.mark.slow
def test_stop_leaves_the_weights_of_the_firing_step(tmp_path):
    mon = monitor(tmp_path, {"warmup_steps": 20, "grad_norm_spike": {"window": 20, "action": "stop"}}, flush_steps=50)
    stopped = train([mon], data(120), lr=DRILL_LR, cell="trainstep")
    [action] = events(mon, "action", "grad_norm_spike")
    step = action.step
    assert read_run(mon.run_dir).ranks[0].records[-1].step == step
    reference = train([StopAt(step)], data(120), lr=DRILL_LR, cell="trainstep")  # exactly `step` updates
    for got, want in zip(stopped.trainable_params(), reference.trainable_params()):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())


@pytest.mark.slow
def test_skip_leaves_the_weights_bit_identical_and_counts(tmp_path):
    mon, weights = monitor(tmp_path, {"nonfinite": {"action": "skip"}}), Weights()
    train([mon, weights], data(20, poison=[5, 9]), cell="skip")
    for step in (5, 9):
        assert {"weight", "bias", "accum.weight", "global_step"} <= set(weights.after[step])  # optimizer state too
        for name, before in weights.after[step - 1].items():
            np.testing.assert_array_equal(weights.after[step][name], before)
        assert not np.array_equal(weights.after[step + 1]["weight"], weights.after[step]["weight"]), "training goes on"
    log = read_run(mon.run_dir).ranks[0]
    skipped = dict(log.series("health/skipped_steps"))
    assert [skipped[s] for s in (4, 5, 8, 9, 20)] == [0, 1, 1, 2, 2]
    assert [e.step for e in events(mon, "action", "nonfinite")] == [5, 9]
    assert all(math.isfinite(v) for s, v in log.series("train/loss") if s not in (5, 9))


def test_skip_is_refused_before_any_sink_opens_without_trainstep(tmp_path):
    mon = monitor(tmp_path, {"nonfinite": {"action": "skip"}})
    with pytest.raises(ConfigError, match=r"Model trains TrainOneStepCell.*TrainStep\(.*skip_nonfinite=True\)"):
        train([mon], data(4))
    assert not os.path.exists(os.path.join(mon.run_dir, "metrics", "rank_0.jsonl"))
    assert not os.path.exists(os.path.join(mon.run_dir, "run.json"))


@pytest.mark.parametrize("cell,source", [("plain", "host snapshot"), ("skip", "network")])
def test_checkpoint_and_stop_saves_the_last_healthy_weights(tmp_path, cell, source):
    mon, weights = monitor(tmp_path, {"nonfinite": {"action": "checkpoint_and_stop"}}), Weights()
    train([mon, weights], data(20, poison=[9]), cell=cell)
    [ckpt] = events(mon, "checkpoint")
    assert ckpt.step == 9 and ckpt.detail["healthy_step"] == 8 and ckpt.detail["source"].startswith(source)
    assert ckpt.detail["duration_s"] > 0 and os.path.getsize(ckpt.detail["path"]) > 0
    loaded = ms.load_checkpoint(ckpt.detail["path"])
    for name, healthy in weights.after[8].items():
        assert np.isfinite(loaded[name].asnumpy()).all()
        np.testing.assert_array_equal(loaded[name].asnumpy(), healthy)
    assert max(weights.after) == 9 and outcome(mon)["status"] == "FAILED"


@pytest.mark.slow
def test_dump_quota_holds_when_anomalies_repeat(tmp_path):
    poison = list(range(5, 55, 5))  # ten separate NaN episodes: TrainStep skips each bad update
    health = {"nonfinite": {"action": "dump"}, "dump_every_steps": 1, "dump_window": 5, "dump_quota_mb": 0.02}
    mon = monitor(tmp_path, health)
    train([mon], data(60, poison=poison), cell="skip")
    actions = events(mon, "action", "nonfinite")
    assert [e.step for e in actions] == poison
    dumps = [e.detail["dump"] for e in actions]
    written = [d for d in dumps if os.path.isdir(d)]
    assert 1 <= len(written) < len(poison) and dumps[len(written):] == ["quota"] * (len(poison) - len(written))
    assert directory_size(os.path.join(mon.run_dir, "dumps")) <= 0.02 * 2**20
    [refused] = events(mon, "dump_refused")
    assert refused.step == poison[len(written)] and refused.detail["reason"] == "quota"


# -- ending badly ----------------------------------------------------------------------
@pytest.mark.slow
def test_keyboard_interrupt_closes_killed_with_every_step_before_it(tmp_path):
    class CtrlC(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 6:
                raise KeyboardInterrupt

    mon = monitor(tmp_path, {}, flush_steps=100)
    with pytest.raises(KeyboardInterrupt):
        train([mon, CtrlC()], data(20))
    assert [r.step for r in read_run(mon.run_dir).ranks[0].records] == list(range(1, 7))
    [interrupt] = events(mon, "interrupt")
    assert interrupt.step == 6 and outcome(mon)["status"] == "KILLED"


SCRIPT = """
import sys, time
sys.path[:0] = [{here!r}, {tests!r}]  # this file, and the shared helpers (helpers/training.py)
from mindspore.train import Callback
from msbridge import BridgeMonitor
from test_health_training import data, train

class Tick(Callback):
    def on_train_step_end(self, run_context):
        print("step", run_context.original_args().cur_step_num, flush=True)
        time.sleep(0.01)

mon = BridgeMonitor({{"output_dir": {out!r}, "flush_steps": 25, "sinks": ["jsonl"]}}, progress=False)
train([mon, Tick()], data(5000))
print("training returned", flush=True)
"""


@pytest.mark.slow
def test_sigterm_flushes_everything_and_closes_killed(tmp_path):
    out = str(tmp_path / "run")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT.format(here=HERE, tests=os.path.dirname(HERE), out=out)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    seen = 0
    for line in proc.stdout:
        seen = int(line.split()[1])
        if seen >= 40:  # mid-window: steps 26..40 are only in the monitor's buffer
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == -signal.SIGTERM, "the process still ends as killed by SIGTERM"
    assert "training returned" not in rest
    log = read_run(out).ranks[0]
    steps = [r.step for r in log.records]
    assert steps == list(range(1, len(steps) + 1)) and steps[-1] >= seen, "nothing recorded before the signal is lost"
    assert [e.detail for e in log.events if e.kind == "interrupt"] == [{"signal": "SIGTERM"}]
    meta = json.load(open(os.path.join(out, "run.json")))
    assert meta["outcome"]["status"] == "KILLED" and "- status: KILLED" in open(os.path.join(out, "README.md")).read()

"""``msbridge.track``: MindSpore's quick-start loop (examples/quickstart) with three added lines records every
step in all four sinks, equal to the loss the loop prints itself; and the functional API's own behaviour
(Tensors kept until the flush, a health stop as ``run.should_stop``, a raising loop closing the run FAILED)."""
from __future__ import annotations

import glob
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import msbridge
from msbridge.names import GRAD_NORM, LOSS, LR
from msbridge.sinks.runlog import read_run

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart"
PRINTED = re.compile(r"^loss: +([0-9.]+) +\[ *(\d+)/ *(\d+)\]$")
EPOCHS, SAMPLES, BATCHES = 2, 640, 10  # 640 images in batches of 64: 10 steps an epoch


def mindinsight_losses(summary_root: Path) -> dict:
    """{step: loss} from the MindInsight sink's summary file, read with MindSpore's own protobuf class."""
    from mindspore.train.summary_pb2 import Event as SummaryEvent
    from msbridge.adapters._eventwire import read_records
    from msbridge.adapters.mindinsight_sink import mindinsight_tag

    [path] = glob.glob(str(summary_root / "*_rank_0" / "*_MS"))
    out = {}
    for body in read_records(path):
        event = SummaryEvent.FromString(body)
        for value in event.summary.value:
            if value.tag == mindinsight_tag(LOSS):
                out[event.step] = value.scalar_value
    return out


@pytest.mark.slow
def test_the_quick_start_loop_records_every_printed_loss_in_all_four_sinks(tmp_path):
    script = (EXAMPLE / "quickstart.py").read_text()
    assert len([line for line in script.splitlines() if line.endswith("# msbridge")]) == 3
    proc = subprocess.run([sys.executable, str(EXAMPLE / "quickstart.py"), "--epochs", str(EPOCHS), "--samples",
                           str(SAMPLES), "--print-every", "1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "GLOG_v": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [(int(m.group(2)), float(m.group(1))) for m in map(PRINTED.match, proc.stdout.splitlines()) if m]
    assert len(printed) == EPOCHS * BATCHES
    want = {epoch * BATCHES + batch + 1: loss for epoch, (batch, loss) in
            zip([i // BATCHES for i in range(len(printed))], printed)}  # the loop's batch index, per epoch
    [run_dir] = glob.glob(str(tmp_path / "msbridge_runs" / "quickstart" / "quickstart-*"))
    log = read_run(run_dir).ranks[0]
    jsonl = dict(log.series(LOSS))
    assert sorted(jsonl) == list(range(1, EPOCHS * BATCHES + 1))  # every step, before any value is compared
    for step, loss in want.items():  # the loop prints %f: 6 decimals
        assert jsonl[step] == pytest.approx(loss, abs=5e-7), step
    epochs = dict(log.series("train/epoch"))
    assert epochs[BATCHES] == 1.0 and epochs[BATCHES + 1] == 2.0
    experiment = tmp_path / "msbridge_runs" / "quickstart"
    run_name = Path(run_dir).name
    acc = EventAccumulator(str(experiment / "tensorboard" / run_name / "rank_0"), size_guidance={"scalars": 0})
    acc.Reload()
    tb = {e.step: e.value for e in acc.Scalars(LOSS)}
    client = MlflowClient(f"sqlite:///{experiment / 'mlflow.db'}")
    [mlrun] = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    mlflow = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, LOSS)}
    mindinsight = mindinsight_losses(experiment / "summary")
    for name, series in (("tensorboard", tb), ("mlflow", mlflow), ("mindinsight", mindinsight)):
        assert sorted(series) == sorted(jsonl), name
        for step, value in series.items():  # TensorBoard and MindInsight store float32
            assert value == pytest.approx(jsonl[step], rel=1e-6), (name, step)
    assert json.loads((Path(run_dir) / "run.json").read_text())["outcome"]["status"] == "FINISHED"


def _config(tmp_path, **extra):
    return {"experiment": "fn", "run_name": "r", "output_dir": str(tmp_path / "{experiment}" / "{run_name}"),
            "flush_steps": 4, "sinks": ["jsonl"], **extra}


def test_tensors_are_kept_until_the_flush_and_every_name_recorded(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    losses = [ms.Tensor(np.float32(3.0 - 0.1 * i)) for i in range(10)]
    with msbridge.track(_config(tmp_path), total_steps=10, batch_size=8, progress=False) as run:
        for i, loss in enumerate(losses[:3]):
            run.step(loss=loss, grad_norm=ms.Tensor(np.float32(i)), lr=0.1, accuracy=0.5 + i / 100)
        held = run.monitor._buffer._tensors[LOSS]
        assert [t is l for t, l in zip(held, losses)] == [True] * 3  # the Tensors themselves, not copies
        assert not (Path(run.run_dir) / "metrics" / "rank_0.jsonl").read_text().count('"metrics"')
        for loss in losses[3:]:
            run.step(loss=loss)  # grad_norm, lr, accuracy left out: absent at these steps, not NaN
    log = read_run(run.run_dir).ranks[0]
    assert [s for s, _ in log.series(LOSS)] == list(range(1, 11))
    assert [v for _, v in log.series(LOSS)] == pytest.approx([3.0 - 0.1 * i for i in range(10)], abs=1e-6)
    assert log.series(GRAD_NORM) == [(1, 0.0), (2, 1.0), (3, 2.0)]
    assert [v for _, v in log.series(LR)][:3] == pytest.approx([0.1] * 3)
    assert [v for _, v in log.series("train/accuracy")][:3] == pytest.approx([0.5, 0.51, 0.52])
    assert "perf/samples_per_s" in log.metric_names() and run.outcome.status == "FINISHED"


def test_a_health_stop_is_a_flag_the_loop_reads_and_the_run_ends_failed(tmp_path):
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    cfg = _config(tmp_path, health={"nonfinite": {"action": "stop"}})
    seen = []
    with msbridge.track(cfg, progress=False) as run:
        for step in range(1, 21):
            run.step(loss=ms.Tensor(np.float32(math.nan if step == 6 else 1.0)))
            seen.append(step)
            if run.should_stop:
                break
    assert seen[-1] == 6, "the stop lands on the step that fired"
    meta = json.loads((Path(run.run_dir) / "run.json").read_text())
    assert meta["outcome"]["status"] == "FAILED" and run.outcome.status == "FAILED"
    assert [s for s, _ in read_run(run.run_dir).ranks[0].series(LOSS)] == list(range(1, 7))


@pytest.mark.parametrize("error, status", [(RuntimeError("data loader died"), "FAILED"),
                                           (KeyboardInterrupt(), "KILLED")])
def test_a_loop_that_raises_closes_the_run_with_its_steps(tmp_path, error, status):
    with pytest.raises(type(error)):
        with msbridge.track(_config(tmp_path), progress=False) as run:
            for step in range(1, 4):
                run.step(loss=float(step))
            raise error
    assert run.outcome.status == status
    assert json.loads((Path(run.run_dir) / "run.json").read_text())["outcome"]["status"] == status
    assert [s for s, _ in read_run(run.run_dir).ranks[0].series(LOSS)] == [1, 2, 3]


def test_checkpoint_and_stop_without_a_network_is_refused_before_the_run(tmp_path):
    cfg = _config(tmp_path, health={"nonfinite": {"action": "checkpoint_and_stop"}})
    with pytest.raises(msbridge.ConfigError, match=r"network=model"):
        msbridge.track(cfg, progress=False)


def test_a_value_that_is_no_number_says_which_keyword(tmp_path):
    with msbridge.track(_config(tmp_path), progress=False) as run:
        run.step(loss=1.0)
        with pytest.raises(TypeError, match=r"run.step\(loss=...\) takes a MindSpore Tensor or a real number, "
                                            r"not str"):
            run.step(loss="high")
        run.step(loss=2.0)
    assert [v for _, v in read_run(run.run_dir).ranks[0].series(LOSS)] == [1.0, 2.0]


@pytest.mark.slow  # two real msrun ranks: ~40 s here
def test_two_ranks_of_a_functional_loop_meet_in_one_collective_per_flush(tmp_path, monkeypatch):
    from helpers import msrun_job

    monkeypatch.setattr(msrun_job, "WORKER", Path(__file__).resolve().parent / "helpers" / "track_worker.py")
    job = msrun_job.Job(tmp_path, 2, "--steps", "12")
    assert job.proc.returncode == 0 and job.workers_ok(0), job.logs()
    logs = job.rank_logs()
    assert sorted(logs) == [0, 1]
    local = {r: dict(logs[r].series(LOSS)) for r in (0, 1)}
    assert sorted(local[0]) == sorted(local[1]) == list(range(1, 13))
    assert local[1][1] > 2 * local[0][1], "rank 1's labels are 3x: its loss is larger"
    global_loss = dict(logs[0].series("train/global_loss"))
    assert sorted(global_loss) == list(range(1, 13))
    for step, value in global_loss.items():  # equal batches: the mean of the ranks' losses
        assert value == pytest.approx((local[0][step] + local[1][step]) / 2, rel=1e-5), step
    assert "train/global_loss" not in logs[1].metric_names()

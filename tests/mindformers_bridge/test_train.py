"""examples/mindformers/ trained for real by ``mindformers.Trainer`` on CPU, with MSBridgeMonitor from the YAML.

Each run is ``examples/mindformers/train.py`` in a fresh process (mindformers
fixes its log dir and registries per process). The reference for every value
is mindformers' own MFLossMonitor log line of the same step.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("mindformers")

from helpers.mf_runs import Printed, close, mf_lines, only_run, train, variant  # noqa: E402
from helpers.mindinsight_server import require_mindinsight, serve  # noqa: E402

from msbridge.sinks.runlog import read_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.compat]  # compat: also run against the oldest supported pair


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example as shipped: 30 steps, every sink, MFLossMonitor and TrainingStateMonitor beside it."""
    require_mindinsight()
    work = tmp_path_factory.mktemp("mf") / "work"
    out = train(work, steps=30)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return work, only_run(work), mf_lines(work)


def test_every_step_matches_mindformers_own_log(example):
    work, run_dir, mf = example
    assert sorted(mf) == list(range(1, 31))
    log = read_run(run_dir).ranks[0]
    for name in ("train/loss", "train/global_loss", "train/lr", "train/grad_norm", "train/overflow"):
        series = log.series(name)
        assert [s for s, _ in series] == list(range(1, 31)), name
        close(series, {s: dict(v, **{"train/global_loss": v["train/loss"]}) for s, v in mf.items()}, name)
    # mindformers hands back its live scale_sense Parameter: sampled once per flush (10 steps or flush_seconds)
    sampled = [s for s, _ in log.series("train/loss_scale")]
    assert sampled[-1] == 30 and 3 <= len(sampled) < 30, sampled
    close(log.series("train/loss_scale"), mf, "train/loss_scale")
    assert mf[30]["train/loss"] < mf[1]["train/loss"] - 1.0, "the tiny llama learns"


def test_run_metadata_reads_the_run_yaml(example):
    _, run_dir, _ = example
    meta = json.loads(Path(run_dir, "run.json").read_text())
    assert meta["outcome"]["status"] == "FINISHED" and meta["expected_steps"] == 30
    config = meta["config"]
    assert config["step_interval"] == 1 and config["seq_length"] == 32  # monitor_config and model_config
    assert config["params"]["model"]["model_config"]["hidden_size"] == 64
    assert config["params"]["optimizer"]["type"] == "AdamW"
    assert "tiny-llama" in Path(run_dir, "README.md").read_text()


def test_tensorboard_and_mlflow_hold_the_same_series(example):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    work, run_dir, mf = example
    tb_run = work / "msbridge_runs" / "tiny-llama" / "tensorboard" / Path(run_dir).name
    read = {}
    for where in (tb_run, tb_run / "rank_0"):  # the run's global metrics; rank 0's own
        ea = EventAccumulator(str(where), size_guidance={"scalars": 0})
        ea.Reload()
        read[where.name] = ea
    close([(e.step, e.value) for e in read["rank_0"].Scalars("train/loss")], mf, "train/loss")
    assert [e.step for e in read["rank_0"].Scalars("train/lr")] == list(range(1, 31))
    global_loss = [(e.step, e.value) for e in read[tb_run.name].Scalars("train/global_loss")]
    close(global_loss, mf, "train/loss")

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'msbridge_runs' / 'tiny-llama' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("tiny-llama").experiment_id])[0]
    assert run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss"))
    close(history, mf, "train/loss")
    assert run.data.tags["model"] == "tiny-llama"
    assert run.data.params["model.model_config.num_layers"] == "2"


def test_mindinsight_serves_the_series(example, tmp_path):
    work, run_dir, mf = example
    with serve(str(work / "msbridge_runs" / "tiny-llama" / "summary"), str(tmp_path / "ws")) as client:
        points = client.wait_for_points(f"./{Path(run_dir).name}_rank_0", "1_train/loss/scalar", 30)
    close([(p["step"], p["value"]) for p in points], mf, "train/loss")


def test_a_bad_inline_key_fails_before_training_naming_file_line_and_entry(tmp_path):
    config = variant(tmp_path, "typo.yaml", "callbacks:\n  - type: MFLossMonitor\n  - type: MSBridgeMonitor\n"
                                            "    experiment: tiny-llama\n    flush_step: 10\n")
    out = train(tmp_path / "work", steps=4, config=config)
    assert out.returncode != 0
    assert "typo.yaml:6: callbacks[1].flush_step: unknown key; did you mean 'flush_steps'?" in out.stderr
    assert "Epoch:[" not in out.stdout + out.stderr, "no step ran"


def test_ring_wrapper_records_every_step_inside_the_graph(tmp_path):
    """``runner_wrapper: MSBridgeRing`` around the CPU cell: loss scale and all reach the ring each step.
    (mindformers' sink mode falls back to step-by-step on CPU, so the ring is exercised without it.)"""
    config = variant(tmp_path, "ring.yaml", "runner_wrapper:\n  type: MSBridgeRing\n  wrapper: CPUTrainOneStepCell\n"
                                            "  ring_size: 64\n  use_clip_grad: True\n  max_grad_norm: 1.0\n"
                                            "  scale_sense: 1.0\n")
    work = tmp_path / "work"
    out = train(work, steps=12, config=config)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    mf, log = mf_lines(work), read_run(only_run(work)).ranks[0]
    assert sorted(mf) == list(range(1, 13))
    for name in ("train/loss", "train/lr", "train/grad_norm", "train/loss_scale", "train/overflow"):
        series = log.series(name)
        assert [s for s, _ in series] == list(range(1, 13)), name  # the loss scale too: read from the ring
        close(series, mf, name)


def test_global_norm_spike_is_forwarded_and_the_run_closes_failed(tmp_path):
    """TrainingStateMonitor (check_for_global_norm) stops training with TREError at the first spike."""
    threshold = 2.5
    config = variant(tmp_path, "spike.yaml", "monitor_config:\n  monitor_on: True\n  dump_path: ''\n"
                                             f"  step_interval: 1\n  check_for_global_norm: True\n"
                                             f"  global_norm_spike_threshold: {threshold}\n")
    work = tmp_path / "work"
    out = train(work, steps=30, config=config)
    assert out.returncode != 0 and "TREError" in out.stderr
    mf = mf_lines(work)
    spike = max(mf)  # TrainingStateMonitor raised at the end of the last step mindformers logged
    assert mf[spike]["train/grad_norm"] >= threshold > max(v["train/grad_norm"] for s, v in mf.items() if s < spike)
    recorded = json.loads((work / "output" / "abnormal_global_norm.json").read_text())
    assert list(recorded) == [str(spike)]

    run_dir = only_run(work)
    log = read_run(run_dir).ranks[0]
    # the spike step is recorded although TrainingStateMonitor raised before MSBridgeMonitor saw its end
    assert [s for s, _ in log.series("train/loss")] == list(range(1, spike + 1))
    close(log.series("train/grad_norm"), mf, "train/grad_norm")
    forwarded = [e for e in log.events if e.kind == "mindformers_global_norm_spike"]
    assert [(e.step, round(e.detail["global_norm"], 5)) for e in forwarded] == \
        [(spike, round(recorded[str(spike)][0], 5))]
    failure = [e for e in log.events if e.kind == "exception"]
    assert failure and "TREError" in failure[0].detail["message"]
    assert json.loads(Path(run_dir, "run.json").read_text())["outcome"]["status"] == "FAILED"


def test_seven_outputs_and_no_global_norm(tmp_path):
    """``local_norm: True`` adds (local norms, sizes); without ``use_clip_grad`` global_norm is None."""
    config = variant(tmp_path, "local.yaml", "runner_wrapper:\n  local_norm: True\n  use_clip_grad: False\n")
    work = tmp_path / "work"
    out = train(work, steps=6, config=config)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = (work / "output" / "log" / "rank_0" / "info.log").read_text()
    mf = {int(m[1]): {"train/loss": Printed(m[2]), "train/lr": float(m[3])}
          for m in re.finditer(r"step:\[\s*(\d+)/\s*\d+\], loss:\[([-\d.e+]+)/[^\]]*\], per_step_time: \d+ms, "
                               r"lr: ([-\d.e+]+),", text)}
    log = read_run(only_run(work)).ranks[0]
    assert sorted(mf) == [s for s, _ in log.series("train/loss")] == list(range(1, 7))
    close(log.series("train/loss"), mf, "train/loss")
    close(log.series("train/lr"), mf, "train/lr")
    assert "train/grad_norm" not in log.metric_names()


def test_mindformers_tensorboard_writer_is_shared(tmp_path):
    """With mindformers' tensorboard on, msbridge's tensorboard sink writes through its writer: one file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = variant(tmp_path, "tb.yaml", "tensorboard:\n  tensorboard_dir: output/tensorboard\n")
    work = tmp_path / "work"
    out = train(work, steps=6, config=config)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rank_dir = work / "output" / "tensorboard" / "rank_0"
    files = [p for p in rank_dir.rglob("events.out.tfevents.*")]
    assert len(files) == 1, files
    ea = EventAccumulator(str(rank_dir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    assert "loss" in tags and "train/loss" in tags and "train/global_loss" in tags, tags  # mindformers' and ours
    close([(e.step, e.value) for e in ea.Scalars("train/loss")], mf_lines(work), "train/loss")
    assert not (work / "msbridge_runs" / "tiny-llama" / "tensorboard").exists()

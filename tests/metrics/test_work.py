"""What a step is worth on real MindSpore training (CPU): samples and tokens seen against the dataset's own
counts, resumed runs continuing the count, TFLOP/s and MFU from the demo model's config."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers.runs import monitor
from helpers.training import regression_data, train_regression

from msbridge.metrics.work import Work, global_batch, make_work
from msbridge.names import MFU, SAMPLES_PER_S, SAMPLES_SEEN, STEP_TIME, TFLOPS, TOKENS_SEEN
from msbridge.sinks.runlog import read_run


def dataset_counts(steps: int, epochs: int) -> tuple:
    """Samples and values (the 16 features of a sample stand for its tokens) the dataset itself yields."""
    samples = values = 0
    for _ in range(epochs):
        for x, _y in regression_data(steps).create_tuple_iterator(output_numpy=True):
            samples += x.shape[0]
            values += x.size
    return samples, values


@pytest.mark.slow
def test_samples_and_tokens_seen_are_the_datasets_own_counts(tmp_path):
    mon = monitor(tmp_path, seq_length=16)
    train_regression([mon], steps=6, epochs=2)
    log = read_run(mon.run_dir).ranks[0]
    samples, tokens = dataset_counts(6, 2)
    assert [r.step for r in log.records] == list(range(1, 13))
    assert log.records[-1].values[SAMPLES_SEEN] == samples == 96
    assert log.records[-1].values[TOKENS_SEEN] == tokens == 96 * 16
    assert [v for _, v in log.series(SAMPLES_SEEN)] == [8.0 * s for s in range(1, 13)]
    # No model config: N is counted from the network, nn.Dense(16, 1)'s 16 weights, 6 * 16 FLOPs per "token".
    last = log.records[-1].values
    assert last[TFLOPS] == pytest.approx(6 * 16 * 16 * 8 / (last[STEP_TIME] / 1e3) / 1e12, rel=1e-9)


@pytest.mark.slow
def test_a_resumed_run_continues_the_count_from_the_checkpoints_step(tmp_path):
    first = monitor(tmp_path, seq_length=16)
    train_regression([first], steps=6, epochs=1)  # steps 1..6
    second = monitor(tmp_path, seq_length=16, resume=True)
    train_regression([second], steps=6, epochs=3, initial_epoch=1)  # from the checkpoint of epoch 1: 7..18
    log = read_run(second.run_dir).ranks[0]
    seen = dict(log.series(SAMPLES_SEEN))
    samples, tokens = dataset_counts(6, 3)
    assert seen[7] == 7 * 8 and seen[18] == samples == 144
    assert dict(log.series(TOKENS_SEEN))[18] == tokens


def test_global_batch_over_the_data_parallel_ranks():
    assert global_batch(8, None, {}, None, world_size=4) == 32
    assert global_batch(8, None, {"parallel_config": {"data_parallel": 2}}, None, world_size=8) == 16
    assert global_batch(8, None, {}, [6, 7], world_size=8) == 16  # the last pipeline stage's ranks
    assert global_batch(64, None, {"parallel": {"full_batch": True}, "parallel_config": {"data_parallel": 8}},
                        None, world_size=8) == 64
    assert global_batch(8, 1024, {}, None, world_size=4) == 1024
    assert global_batch(None, None, {}, None, world_size=4) is None


@pytest.mark.slow
def test_tflops_and_mfu_of_the_demo_model_on_cpu(tmp_path, caplog):
    """The demo's own config gives the FLOPs; a CPU has no peak, so MFU is off with one line, unless
    ``peak_tflops`` is set, and then MFU is exactly achieved over peak."""
    from msbridge import BridgeMonitor
    from msbridge.demo import demo_config, train

    config = demo_config(str(tmp_path), {"sinks": ["jsonl"], "flush_steps": 5, "peak_tflops": 0.5})
    config["params"]["train"]["eval_every"] = 0
    with caplog.at_level(logging.INFO, logger="msbridge"):
        mon = train(BridgeMonitor(config, progress=False), steps=6, params=config["params"])
    assert "663,552 FLOPs per token" in caplog.text
    rec = read_run(mon.run_dir).ranks[0].records[-1].values
    per_sample = 663_552 * 32
    expected = per_sample * 16 / (rec[STEP_TIME] / 1e3) / 1e12
    assert rec[TFLOPS] == pytest.approx(expected, rel=1e-9)
    assert rec[TFLOPS] == pytest.approx(rec[SAMPLES_PER_S] * per_sample / 1e12, rel=1e-9)
    assert rec[MFU] == pytest.approx(100 * rec[TFLOPS] / 0.5, rel=1e-12)
    assert rec[TOKENS_SEEN] == 6 * 16 * 32


@pytest.mark.slow
def test_without_a_model_config_n_is_counted_once_from_the_network(tmp_path, caplog):
    from msbridge import BridgeMonitor
    from msbridge.demo import demo_config, train

    config = demo_config(str(tmp_path), {"sinks": ["jsonl"], "flush_steps": 5, "run_name": "no-model-config"})
    params = config.pop("params")
    params["train"]["eval_every"] = 0
    with caplog.at_level(logging.INFO, logger="msbridge"):
        mon = train(BridgeMonitor(config, progress=False), steps=5, params=params)
    assert "614,400 FLOPs per token (6*N, N = 102,400 weights counted from the network" in caplog.text
    rec = read_run(mon.run_dir).ranks[0].records[-1].values
    assert rec[TFLOPS] == pytest.approx(rec[SAMPLES_PER_S] * 614_400 * 32 / 1e12, rel=1e-9)


def test_no_peak_on_cpu_turns_mfu_off_with_one_line(caplog):
    from msbridge.config.load import load_config
    from msbridge.demo import demo_config

    cfg = load_config(demo_config("/tmp/unused", {"sinks": ["jsonl"]}))
    with caplog.at_level(logging.INFO, logger="msbridge"):
        work = make_work(cfg, world_size=1, batch_size=16)
    assert work.flops_per_sample == 663_552 * 32 and work.peak_tflops is None
    assert [r.getMessage() for r in caplog.records if "MFU is off" in r.getMessage()] == [
        "msbridge: cpu: no peak figure (MFU is off); set peak_tflops to record perf/mfu"]
    cols = work.columns(np.array([3]), np.array([0.01]))
    assert MFU not in cols and cols[TFLOPS][0] == pytest.approx(663_552 * 32 * 16 / 0.01 / 1e12)


def test_flops_per_sample_from_the_config_wins_and_work_is_per_device():
    work = Work(global_batch=64, seq_length=128, flops_per_sample=1e9, devices=8, peak_tflops=2.0)
    cols = work.columns(np.array([10, 11]), np.array([0.004, 0.002]))
    np.testing.assert_allclose(cols[TFLOPS], [1e9 * 64 / 8 / 0.004 / 1e12, 1e9 * 64 / 8 / 0.002 / 1e12])
    np.testing.assert_allclose(cols[MFU], 100 * cols[TFLOPS] / 2.0)
    assert cols[SAMPLES_SEEN].tolist() == [640.0, 704.0] and cols[TOKENS_SEEN].tolist() == [640.0 * 128, 704.0 * 128]

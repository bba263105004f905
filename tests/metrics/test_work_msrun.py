"""What a step is worth in a real data-parallel job on CPU under msrun (metrics/work.py across ranks).

Two ranks train 12 steps on their own shards (tests/helpers/dist_worker.py), each batched with
``drop_remainder=True``, and count the samples their steps consumed (each batch's leading dimension: the
dataset's own count). Every rank's ``perf/samples_seen`` at each step is the global batch x the step, the global
batch being the sum of the shards' batches; at the last step that is the sum of every shard's consumed samples.
``perf/tokens_seen`` is that x ``seq_length``, and ``perf/tflops`` is flops_per_sample x the global batch / the
world size / the step time, per record. With unequal batches (4 and 8) each rank first assumes its own batch x 2;
the flush's collective carries the ranks' own batch sizes, and every rank then records their sum
(docs/metrics.md, "Across ranks").
"""
from __future__ import annotations

import pytest
from helpers.msrun_job import Job

pytestmark = pytest.mark.slow

STEPS, SEQ, FLOPS = 12, 32, 1.0e6


def _job(root, batches: str) -> Job:
    job = Job(root, 2, "--steps", str(STEPS), "--flush", "4", "--batches", batches, "--seq-length", str(SEQ),
              "--flops-per-sample", str(FLOPS), "--count", timeout=240.0)
    assert job.proc.returncode == 0, job.logs()
    return job


def _consumed(job: Job) -> list:
    return [int((job.out() / f"samples_{rank}.txt").read_text()) for rank in range(2)]


@pytest.fixture(scope="module", params=["8", "4,8"], ids=["equal-batches", "unequal-batches"])
def job(request, tmp_path_factory) -> Job:
    return _job(tmp_path_factory.mktemp("work"), request.param)


def test_every_ranks_counts_are_the_shards_consumed_samples(job):
    consumed = _consumed(job)
    global_batch = sum(consumed) // STEPS
    assert sum(consumed) == global_batch * STEPS and consumed[0] != 0
    logs = job.rank_logs()
    assert sorted(logs) == [0, 1]
    for rank, log in logs.items():
        samples, tokens = log.series("perf/samples_seen"), dict(log.series("perf/tokens_seen"))
        assert [s for s, _ in samples] == list(range(1, STEPS + 1)), f"rank {rank}"
        assert samples[-1][1] == sum(consumed), f"rank {rank}: the last count is every shard's samples"
        for step, value in samples:
            assert value == global_batch * step and tokens[step] == value * SEQ, f"rank {rank} step {step}"


def test_tflops_is_the_global_batchs_flops_per_device_per_step_time(job):
    global_batch = sum(_consumed(job)) // STEPS
    for rank, log in job.rank_logs().items():
        step_ms, tflops = dict(log.series("perf/step_time_ms")), dict(log.series("perf/tflops"))
        assert sorted(tflops) == list(range(1, STEPS + 1))
        for step, value in tflops.items():
            expected = FLOPS * global_batch / 2 / (step_ms[step] / 1e3) / 1e12
            assert value == pytest.approx(expected, rel=1e-6), f"rank {rank} step {step}"
        assert "perf/mfu" not in log.records[-1].values, "no peak on CPU: MFU is off"

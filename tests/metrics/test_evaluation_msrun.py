"""Evaluations in a real data-parallel job on CPU under msrun (metrics/evaluation.py across ranks).

Two ranks run ``Model.fit`` over 2 epochs of 10 steps with a validation set of their own after each epoch:
rank 0 evaluates 4 samples, rank 1 evaluates 8, so the sample-weighted global value and the plain mean differ.
Every rank's jsonl holds its own result; rank 0 alone records ``eval/global_*``, weighted by samples
(docs/distributed.md, "Evaluations").
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers.msrun_job import Job

pytestmark = pytest.mark.slow

STEPS, EPOCHS = 10, 2


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> Job:
    job = Job(tmp_path_factory.mktemp("eval"), 2, "--steps", str(STEPS), "--flush", "5", "--eval",
              "--hard-rank", "1", timeout=240.0)
    assert job.proc.returncode == 0, job.logs()
    return job


def test_every_rank_records_every_step_and_its_own_evaluations(evaluated):
    logs = evaluated.rank_logs()
    assert sorted(logs) == [0, 1]
    for rank, log in logs.items():
        assert [s for s, _ in log.series("train/loss")] == list(range(1, STEPS * EPOCHS + 1)), f"rank {rank}"
        assert [s for s, _ in log.series("eval/loss")] == [STEPS, STEPS * EPOCHS], f"rank {rank}"
        assert [v for _, v in log.series("eval/samples")] == [4.0 * (rank + 1)] * EPOCHS, f"rank {rank}"
        assert [s for s, _ in log.series("eval/mae")] == [STEPS, STEPS * EPOCHS]
    assert not logs[1].series("eval/global_loss"), "only rank 0 records the global evaluation"


def test_rank_zero_weights_the_global_result_by_each_ranks_samples(evaluated):
    logs = evaluated.rank_logs()
    local = {rank: dict(log.series("eval/loss")) for rank, log in logs.items()}
    samples = {rank: dict(log.series("eval/samples")) for rank, log in logs.items()}
    global_loss = dict(logs[0].series("eval/global_loss"))
    assert sorted(global_loss) == [STEPS, STEPS * EPOCHS]
    for step, value in global_loss.items():
        weights = np.array([samples[0][step], samples[1][step]])
        pair = np.array([local[0][step], local[1][step]])
        assert value == pytest.approx(float(pair @ weights / weights.sum()), rel=1e-6), f"step {step}"
        assert value != pytest.approx(float(pair.mean()), rel=1e-3), "the ranks' results differ, so weighting shows"
    assert dict(logs[0].series("objective/final"))[STEPS * EPOCHS] == pytest.approx(global_loss[STEPS * EPOCHS])

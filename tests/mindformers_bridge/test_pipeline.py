"""msbridge under mindformers' pipeline / gradient-accumulation wrapper reset, on real run YAML shapes.

The run YAMLs in tests/data/mindformers_runs/ are trimmed copies of mindformers' own (their source path is in
each file's first line). mindformers' own reset code (``BaseTrainer._check_grad_accumulation_steps``,
``_check_global_batch_size_for_auto_parallel``, ``_reset_wrapper``: what ``set_config`` runs) is applied to
them with the parallel context they set. ``MFPipelineWithLossScaleCell`` itself cannot be built here (it
needs semi-auto parallel with a communication group, which CPU stand-alone has not); its loss rule is
mindformers' ``MFLossMonitor._fix_loss_for_parallel``, run for real.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

pytest.importorskip("mindformers")

import mindspore as ms  # noqa: E402
from mindformers.core.callback.callback import MFLossMonitor  # noqa: E402
from mindformers.tools.register import MindFormerConfig  # noqa: E402
from mindformers.trainer.base_trainer import BaseTrainer  # noqa: E402

from helpers.mf_runs import RUN_YAMLS as RUNS  # noqa: E402

import msbridge.mindformers  # noqa: E402,F401  (installs the reset hook)
from msbridge.capture.window import Window  # noqa: E402
from msbridge.config.mindformers_rules import wrapper_reset  # noqa: E402
from msbridge.config.prepare import prepare  # noqa: E402
from msbridge.mindformers.pipeline import PipelineLoss  # noqa: E402
from msbridge.names import LOSS  # noqa: E402

pytestmark = pytest.mark.compat  # also run against the oldest supported pair (.ci/compat.sh)
MODES = {0: "data_parallel", 1: "semi_auto_parallel", 2: "auto_parallel"}


@pytest.fixture
def parallel_context():
    yield
    ms.reset_auto_parallel_context()


def _apply_mindformers_reset(path: str, keep_ring: bool) -> MindFormerConfig:
    """mindformers' own set_config checks on the YAML, in the parallel context it asks for."""
    config = MindFormerConfig(path)
    stages = config.parallel_config.pipeline_stage or 1
    context = {"parallel_mode": MODES[config.parallel.parallel_mode], "pipeline_stages": stages,
               "full_batch": bool(config.parallel.full_batch)}
    if not config.parallel.full_batch:
        context["dataset_strategy"] = tuple(tuple(s) for s in config.parallel.dataset_strategy)
    ms.set_auto_parallel_context(**context)
    trainer = BaseTrainer.__new__(BaseTrainer)
    trainer.config = config
    methods = ("_reset_wrapper_for_pipeline_parallel", "_reset_wrapper_for_grad_accu")
    saved = {name: getattr(BaseTrainer, name) for name in methods}
    try:
        if not keep_ring:  # mindformers' methods as shipped, without msbridge's hook
            for name in methods:
                setattr(BaseTrainer, name, saved[name].__wrapped__)
        trainer._check_grad_accumulation_steps()
        trainer._check_global_batch_size_for_auto_parallel()
        trainer._reset_wrapper()
    finally:
        for name, method in saved.items():
            setattr(BaseTrainer, name, method)
    return config


@pytest.mark.parametrize("path", RUNS, ids=os.path.basename)
def test_mindformers_reset_keeps_the_ring_and_config_check_says_so_first(path, parallel_context):
    prepared = prepare(path)
    assert not prepared.problems, prepared.problems
    predicted = wrapper_reset(prepared.tree.data)
    shipped = _apply_mindformers_reset(path, keep_ring=False).runner_wrapper
    assert (shipped.type == "MFPipelineWithLossScaleCell") == (predicted is not None)  # msbridge predicts mindformers
    kept = _apply_mindformers_reset(path, keep_ring=True).runner_wrapper
    said = [n for n in prepared.notes if n.text.startswith("runner_wrapper -> ")]
    assert kept.type == "MSBridgeRing" and kept.ring_size == 256
    if predicted is None:
        assert kept.wrapper != "MFPipelineWithLossScaleCell" and not said
        return
    assert kept.wrapper == "MFPipelineWithLossScaleCell"
    assert kept.micro_batch_num == predicted["micro_batch_num"] == shipped.micro_batch_num
    assert len(said) == 1 and said[0].level == logging.WARNING  # said once, before training
    assert "msbridge keeps its ring around that cell" in said[0].text
    by = "micro_batch_num" if predicted["stages"] > 1 else "gradient_accumulation_steps"
    assert f"divided by {by} {predicted['micro_batch_num']}" in said[0].text


def _window(loss):
    n = len(loss)
    return Window(steps=np.arange(1, n + 1), epochs=np.zeros(n), wall_time=np.zeros(n), step_time_s=np.zeros(n),
                  monitor_s=np.zeros(n), scalars={LOSS: np.asarray(loss, np.float64)})


def _loss_monitor(**kwargs):
    return MFLossMonitor(learning_rate=1e-3, per_print_times=1, origin_epochs=1, dataset_size=10, **kwargs)


def test_pipeline_loss_is_mindformers_loss_from_the_last_stage(parallel_context, caplog):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", pipeline_stages=4)
    monitor = _loss_monitor(micro_batch_num=8)
    cell_loss = np.array([16.0, 12.0, 8.0])
    with caplog.at_level(logging.INFO, logger="msbridge"):
        last = PipelineLoss.at_train_begin([monitor], None, ring=True, rank=7, world_size=8)
        first = PipelineLoss.at_train_begin([monitor], None, ring=True, rank=0, world_size=8)
    assert monitor.print_warning_flag  # MFLossMonitor still prints its own one-time warnings
    # as MFLossMonitor.on_train_step_end calls it (1.6 has no print_warning argument)
    expected = np.array([float(monitor._fix_loss_for_parallel(v)) for v in cell_loss])
    assert last.loss_ranks == first.loss_ranks == (6, 7)
    window = _window(cell_loss)
    last.adjust(window)
    np.testing.assert_allclose(window.scalars[LOSS], expected, rtol=1e-12)
    np.testing.assert_allclose(expected, cell_loss / 8, rtol=1e-12)
    window = _window(cell_loss)
    first.adjust(window)
    assert LOSS not in window.scalars  # stage 0's loss is not the loss: not recorded
    said = [r for r in caplog.records if r.name == "msbridge"]
    assert any("valid on ranks [6, 7] only; this rank records no train/loss" in r.getMessage() for r in said)
    assert all(r.levelno == logging.INFO for r in said)  # the ring is kept: config check's warning was enough


def test_gradient_accumulation_loss_divided_as_mindformers_does(parallel_context):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", pipeline_stages=1)
    monitor = _loss_monitor(gradient_accumulation_steps=4)
    found = PipelineLoss.at_train_begin([monitor], None, ring=True, rank=0, world_size=8)
    assert found.loss_ranks is None and found.factor == pytest.approx(0.25)
    assert found.factor == pytest.approx(float(monitor._fix_loss_for_parallel(1.0)))
    window = _window([4.0, 2.0])
    found.adjust(window)
    np.testing.assert_allclose(window.scalars[LOSS], [1.0, 0.5])


def test_a_plain_run_keeps_the_loss_and_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        found = PipelineLoss.at_train_begin([_loss_monitor()], None, ring=False, rank=0, world_size=1)
    assert found.factor == 1.0 and found.loss_ranks is None and not caplog.records


class MFPipelineWithLossScaleCell(ms.nn.Cell):
    """A stand-in named as mindformers' cell: the real one does not compile on CPU (semi-auto parallel
    graphs raise ``RuntimeError: Invalid backend: CPU`` there). Only its name and ``micro_size`` are read."""

    def __init__(self, micro_size: int) -> None:
        super().__init__()
        self.micro_size = micro_size
        self.calculate_per_token_loss = False


def test_no_ring_around_the_pipeline_cell_is_said_once_with_what_is_recorded(parallel_context, caplog):
    outer = ms.nn.SequentialCell([MFPipelineWithLossScaleCell(micro_size=4)])
    with caplog.at_level(logging.WARNING, logger="msbridge"):
        found = PipelineLoss.at_train_begin([], outer, ring=False, rank=0, world_size=1)
    assert found.factor == pytest.approx(0.25)  # no MFLossMonitor: the cell's micro_batch_num
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1
    assert "no device ring around it" in said[0] and "reads each step's outputs at its end" in said[0]
    assert "train/loss is the cell's loss x 0.25 (MFPipelineWithLossScaleCell's micro_batch_num)" in said[0]

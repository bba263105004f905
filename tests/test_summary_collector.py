"""MindSpore's own ``SummaryCollector`` runs beside ``BridgeMonitor`` in msbridge's default install: MindSpore's
AlexNet summary sample's collector (its default arguments, and the sample's ``collect_specified_data``) in a
real ``Model.train``, on CPU; both record every step and agree on the loss."""
from __future__ import annotations

import glob
from pathlib import Path

import pytest
from helpers.training import OutputRecorder, train_regression
from mindspore.train import SummaryCollector
from mindspore.train.summary_pb2 import Event as SummaryEvent
from msbridge.adapters._eventwire import read_records

from msbridge import BridgeMonitor
from msbridge.names import LOSS
from msbridge.sinks.runlog import read_run

pytestmark = pytest.mark.slow  # each test over 1 s here (the fast tier: pytest -m 'not slow')

STEPS = 12
# MindSpore's "Collecting Summary Record" tutorial (the AlexNet sample): its specified collector
SAMPLE = {"collect_metric": True, "histogram_regular": "^conv1.*|^conv2.*", "collect_graph": True,
          "collect_dataset_graph": True}


def collected_losses(summary_dir: Path) -> dict:
    """{step: loss} of SummaryCollector's own summary file (tag ``loss/auto``), read with MindSpore's class."""
    [path] = [p for p in glob.glob(str(summary_dir / "*summary*")) if not p.endswith("_lineage")]
    out = {}
    for body in read_records(path):
        event = SummaryEvent.FromString(body)
        for value in event.summary.value:
            if value.tag == "loss/auto":
                out[event.step] = value.scalar_value
    return out


@pytest.mark.parametrize("specified", [None, SAMPLE], ids=["defaults", "alexnet-sample"])
def test_summary_collector_runs_beside_the_monitor(tmp_path, specified):
    kwargs = {} if specified is None else {"collect_specified_data": specified, "collect_freq": 1}
    collector = SummaryCollector(summary_dir=str(tmp_path / "summary_dir"), **kwargs)
    monitor = BridgeMonitor({"experiment": "sc", "run_name": "r", "flush_steps": 4, "sinks": ["jsonl"],
                             "output_dir": str(tmp_path / "{experiment}" / "{run_name}")}, progress=False)
    recorder = OutputRecorder()
    train_regression([collector, monitor, recorder], steps=STEPS)
    assert monitor.outcome.status == "FINISHED"
    ours = dict(read_run(monitor.run_dir).ranks[0].series(LOSS))
    assert sorted(ours) == list(range(1, STEPS + 1))
    assert [ours[s] for s in recorder.steps] == pytest.approx(recorder.losses, rel=1e-6)
    theirs = collected_losses(tmp_path / "summary_dir")
    every = 1 if specified else 10  # SummaryCollector's default collect_freq is 10
    assert sorted(theirs) == [s for s in range(1, STEPS + 1) if s == 1 or s % every == 0]
    for step, loss in theirs.items():  # float32 in the summary file
        assert loss == pytest.approx(ours[step], rel=1e-6), step

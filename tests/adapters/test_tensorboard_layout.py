"""TensorBoard's Custom Scalars tab opens on what matters: the layout the sink writes is tensorboardX's
bytes, and TensorBoard's own plugin serves it and the loss of every step through it."""
from __future__ import annotations

import json
import re
import time

import pytest
from helpers.runs import make_records, make_run
from tensorboard import context
from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.custom_scalar.custom_scalars_plugin import CustomScalarsPlugin
from tensorboard.plugins.scalar.scalars_plugin import ScalarsPlugin
from tensorboardX import summary as tbx_summary
from tensorboardX.proto import event_pb2, layout_pb2

from msbridge.adapters._eventwire import custom_scalars_summary, summary_event
from msbridge.adapters.jsonl_sink import JsonlSink
from msbridge.adapters.tensorboard_sink import LAYOUT, TensorBoardSink
from msbridge import names
from msbridge.health.runner import SKIPPED_STEPS
from msbridge.names import HEADLINE, MFU, TOKENS_SEEN
from msbridge.sinks.base import FINISHED
from msbridge.sinks.runlog import read_run


@pytest.mark.parametrize("step", [0, 1200])
def test_the_layout_is_byte_for_byte_tensorboardx(step):
    """tensorboardX's ``custom_scalars`` builds the same Summary (it has no ``closed``: set here after)."""
    reference = tbx_summary.custom_scalars({title: {chart: ["Multiline", list(tags)] for chart, tags in charts}
                                            for title, _, charts in LAYOUT})
    layout = layout_pb2.Layout.FromString(reference.value[0].tensor.string_val[0])
    for category, (_, closed, _) in zip(layout.category, LAYOUT):
        category.closed = closed
    reference.value[0].tensor.string_val[0] = layout.SerializeToString()
    assert custom_scalars_summary(LAYOUT) == reference.SerializeToString()
    event = event_pb2.Event(wall_time=1.7e9, step=step, summary=reference)
    assert summary_event(step, 1.7e9, custom_scalars_summary(LAYOUT)) == event.SerializeToString()


def test_the_headline_charts_come_first_open_and_in_order():
    title, closed, charts = LAYOUT[0]
    assert not closed and all(later_closed for _, later_closed, _ in LAYOUT[2:])
    tags = [tag for _, regexes in charts for tag in regexes]
    assert [next(name for name in HEADLINE if re.fullmatch(tag, name)) for tag in tags] == list(HEADLINE)
    assert [chart for chart, _ in charts][:4] == ["loss", "grad norm", "learning rate", "throughput (samples/s)"]


def test_the_perf_section_opens_second_on_mfu_and_tokens_seen():
    """Second, open; its first row (Custom Scalars lays charts out left to right) starts with MFU and tokens
    seen; every tag of the layout is a metric msbridge writes."""
    title, closed, charts = LAYOUT[1]
    assert title == "msbridge: perf" and not closed
    assert [tags for _, tags in charts[:2]] == [(f"^{re.escape(MFU)}$",), (f"^{re.escape(TOKENS_SEEN)}$",)]
    written = {getattr(names, n) for n in dir(names) if isinstance(getattr(names, n), str)} | {SKIPPED_STEPS}
    tags = [tag for _, _, cs in LAYOUT for _, regexes in cs for tag in regexes if not tag.endswith("\\d+$")]
    assert all(re.sub(r"\\(.)", r"\1", tag[1:-1]) in written for tag in tags), tags


def plugins(logdir):
    """TensorBoard's Custom Scalars plugin on ``logdir``, with the Scalars plugin it reads series through."""
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    instances = {}
    provider = MultiplexerDataProvider(mux, logdir)
    tb_context = base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider,
                                       plugin_name_to_instance=instances)
    instances["scalars"] = ScalarsPlugin(tb_context)
    return CustomScalarsPlugin(tb_context)


def test_tensorboard_serves_the_layout_and_every_step_of_the_loss_through_it(tmp_path):
    """Two runs of a sweep, two ranks each: one layout (TensorBoard merges equal charts), the loss chart
    holds each rank's loss and the global loss, every step."""
    for name in ("lr0.1", "lr0.01"):
        for rank in (0, 1):
            run = make_run(tmp_path, name=name, rank=rank, world_size=2, start_time=time.time())
            for sink in (JsonlSink(), TensorBoardSink()):
                sink.open(run)
                sink.write(make_records(range(1, 31), rank=rank, world_size=2), [])
                sink.close(FINISHED)
    logdir = str(tmp_path / "exp" / "tensorboard")
    custom = plugins(logdir)
    request = context.RequestContext()
    layout = json.loads(custom.layout_impl(request, ""))  # what GET /data/plugin/custom_scalars/layout answers
    assert [(c["title"], c.get("closed", False), [(ch["title"], ch["multiline"]["tag"]) for ch in c["chart"]])
            for c in layout["category"]] == [(t, closed, [(ch, list(tags)) for ch, tags in charts])
                                             for t, closed, charts in LAYOUT]

    [loss_tags] = [ch["multiline"]["tag"] for ch in layout["category"][0]["chart"] if ch["title"] == "loss"]
    for name in ("lr0.1", "lr0.01"):
        for run, rank in ((f"{name}/rank_0", 0), (f"{name}/rank_1", 1), (name, 0)):
            served = {}
            for regex in loss_tags:
                served.update(custom.scalars_impl(request, run, regex, "")["tag_to_events"])
            log = read_run(str(tmp_path / "exp" / name)).ranks[rank]
            want = "train/global_loss" if run == name else "train/loss"  # the run dir holds the global loss
            assert list(served) == [want], (run, list(served))
            points = served[want]
            assert [p[1] for p in points] == [s for s, _ in log.series(want)] == list(range(1, 31))
            assert [p[2] for p in points] == pytest.approx([v for _, v in log.series(want)], rel=1e-6)

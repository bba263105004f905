"""The streamed column reader (``read_run_columns``, what ``msbridge plot`` and ``diagnose`` read with) gives
what the whole-file reader gives: the same records, events, bad-line counts, and the same diagnosis."""
from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import synthetic_runs as sr

from msbridge.offline.diagnose import diagnose
from msbridge.sinks.columns import read_run_columns
from msbridge.sinks.runlog import RunLogError, rank_file, read_run


def same_records(a, b):
    assert len(a.records) == len(b.records) > 0
    for x, y in zip(a.records, b.records):
        assert (x.step, x.rank, x.time) == (y.step, y.rank, y.time)
        assert x.values.keys() == y.values.keys()
        assert all(v == y.values[k] or (math.isnan(v) and math.isnan(y.values[k])) for k, v in x.values.items())


@pytest.mark.parametrize("scenario", [sr.nan_steps(), sr.straggler(), sr.nonfinite_on_one_rank(), sr.loss_spike()],
                         ids=lambda sc: sc.name)
def test_columns_hold_what_the_whole_file_reader_holds(tmp_path, scenario):
    run_dir = sr.write_run(tmp_path / "run", scenario)
    whole, streamed = read_run(run_dir), read_run_columns(run_dir)
    assert list(whole.ranks) == list(streamed.ranks)
    for rank, log in whole.ranks.items():
        other = streamed.ranks[rank]
        same_records(log, other)
        assert other.header == log.header and other.events == log.events
        assert other.metric_names() == log.metric_names()
        for name in log.metric_names():
            steps, values = other.arrays(name)
            assert steps.tolist() == [s for s, _ in log.series(name)]
            np.testing.assert_array_equal(values, [v for _, v in log.series(name)])
    assert diagnose(streamed).to_dict() == diagnose(whole).to_dict()


def test_a_cut_last_line_and_a_bad_line_are_counted_the_same(tmp_path):
    run_dir = sr.write_run(tmp_path / "run", sr.clean())
    path = rank_file(run_dir, 0)
    lines = open(path, encoding="utf-8").read().splitlines(keepends=True)
    lines[5] = "not json\n"
    open(path, "w", encoding="utf-8").write("".join(lines))
    sr.cut_last_line(run_dir)
    whole, streamed = read_run(run_dir).ranks[0], read_run_columns(run_dir).ranks[0]
    assert (streamed.truncated, streamed.skipped) == (whole.truncated, whole.skipped) == (1, [(6, "not a JSON line")])
    same_records(whole, streamed)
    with pytest.raises(RunLogError, match=r"rank_0.jsonl:6: not a JSON line"):
        read_run_columns(run_dir, strict=True)

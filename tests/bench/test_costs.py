"""``msbridge bench``'s fixed costs per run: medians, the excess over the paired baseline run, the table."""
from __future__ import annotations

import pytest

from msbridge.bench.costs import fixed_cost_row, fixed_costs_markdown


def result(repeat, start, close_cpu, close_s, total, child=None):
    return {"repeat": repeat, "cpu_start_s": start, "cpu_close_s": close_cpu, "close_s": close_s,
            "cpu_total_s": total, "mlflow_child_rss_mb": child}


def test_added_is_paired_with_the_baseline_of_the_same_repeat():
    runs = {"a": [result(0, 4.0, 0.0, 0.0, 10.0), result(1, 8.0, 0.0, 0.0, 20.0), result(2, 4.0, 0.0, 0.0, 10.0)],
            "e": [result(0, 5.0, 0.5, 0.4, 12.0, 120.0), result(1, 9.5, 0.7, 0.6, 23.0, 110.0),
                  {"repeat": 2, "error": "worker exited with 1"}]}
    row = fixed_cost_row("e", runs)
    assert row["cpu_start_s"] == pytest.approx(7.25) and row["mlflow_child_rss_mb"] == pytest.approx(115.0)
    assert row["cpu_start_s_added"] == pytest.approx(1.25)  # median of +1.0 (repeat 0) and +1.5 (repeat 1)
    assert row["cpu_total_s_added"] == pytest.approx(2.5) and row["close_s_added"] == pytest.approx(0.5)
    base = fixed_cost_row("a", runs)
    assert base["mlflow_child_rss_mb"] is None and base["cpu_start_s_added"] == 0.0

    lines = fixed_costs_markdown([base, row])
    assert lines[-2] == "| (a) | 4.00 | 0.00 | 0.00 | 10.0 | n/a |"
    assert lines[-1] == "| (e) | 7.25 (+1.25) | 0.60 (+0.60) | 0.50 (+0.50) | 17.5 (+2.5) | 115 |"

"""``msbridge bench``'s side-by-side table: each setup's own CPU a step over its baseline, msbridge's budget, and
(slow) the peers run for real next to msbridge, a row each."""
from __future__ import annotations

import pytest

from msbridge.bench.sidebyside import (BUDGET_US, ONE_TRACKER_PEERS, budget_targets, own_cost, side_by_side_markdown,
                                      where_it_goes)
from msbridge.bench.suite import SETUPS, check_targets, markdown, summarise


def _run(repeat, hooks, threads, children, cpu_ms=12.0, train_us=9000.0):
    return {"repeat": repeat, "steps_per_s": 80.0, "median_step_ms": 12.5, "cpu_ms_per_step": cpu_ms,
            "peak_rss_mb": 500.0, "idle_cpu_per_s": 0.0, "hooks_us_per_step": hooks,
            "py_threads_us_per_step": threads, "children_us_per_step": children,
            "training_thread_us_per_step": train_us}


def test_own_cost_is_the_paired_median_excess_over_the_baseline_on_and_off_the_training_thread():
    runs = {"a": [_run(0, 1.0, 5.0, 0.0), _run(1, 1.0, 9.0, 0.0), _run(2, 2.0, 5.0, 0.0)],
            "e": [_run(0, 11.0, 45.0, 20.0, cpu_ms=12.1), _run(1, 13.0, 50.0, 30.0, cpu_ms=12.3),
                  _run(2, 12.0, 40.0, 25.0, cpu_ms=12.2, train_us=9100.0)]}
    cost = own_cost("e", runs, "a")
    assert cost["own_on_us"] == pytest.approx(10.0)  # 10, 12, 10
    assert cost["own_us"] == pytest.approx(70.0)  # (76-6), (93-10), (77-7) = 70, 83, 70
    assert cost["own_off_us"] == pytest.approx(60.0)
    assert cost["process_added_us"] == pytest.approx(200.0)
    assert cost["training_thread_added_us"] == pytest.approx(0.0)


def test_a_repeat_without_its_baseline_or_figures_is_left_out_not_counted_as_zero():
    runs = {"a": [_run(0, 1.0, 5.0, 0.0)], "p_tbx": [_run(0, 400.0, 900.0, 0.0), _run(1, 1.0, 1.0, 0.0)]}
    runs["p_tbx"][0]["children_us_per_step"] = None
    cost = own_cost("p_tbx", runs, "a")
    assert cost["own_on_us"] == pytest.approx(399.0) and cost["own_us"] is None and cost["own_off_us"] is None


def test_budget_and_cheapest_peer_targets_are_met_or_not_by_the_figures():
    runs = {"a": [_run(r, 1.0, 2.0, 0.0) for r in range(3)],
            "e": [_run(r, 14.0, 50.0, 20.0) for r in range(3)],
            "p_tbx": [_run(r, 500.0, 900.0, 0.0) for r in range(3)],
            "p_mlflow": [_run(r, 2000.0, 3.0, 0.0) for r in range(3)]}
    rows = [summarise(s, runs) for s in runs]
    targets = check_targets({"rows": rows})
    assert targets["msbridge_on_us"]["measured"] == pytest.approx(13.0) and targets["msbridge_on_us"]["met"] is True
    assert targets["msbridge_off_us"]["measured"] == pytest.approx(68.0) and targets["msbridge_off_us"]["met"]
    assert targets["msbridge_all_us"]["measured"] == pytest.approx(81.0) and targets["msbridge_all_us"]["met"]
    assert targets["msbridge_over_cheapest_peer"]["measured"] == pytest.approx(81.0 / 1397.0)
    runs["e"] = [_run(r, 30.0, 50.0, 20.0) for r in range(3)]
    over = budget_targets({r["setup"]: r for r in [summarise(s, runs) for s in runs]})
    assert over["msbridge_on_us"]["measured"] == pytest.approx(29.0) and over["msbridge_all_us"]["measured"] == 97.0
    assert BUDGET_US == {"all": 85.0, "off": 70.0, "on": 15.0}


def test_the_table_has_a_row_per_shown_setup_and_says_why_one_could_not_run():
    runs = {"a": [_run(0, 1.0, 2.0, 0.0)], "e": [_run(0, 14.0, 50.0, 20.0)],
            "p_mf": [{"setup": "p_mf", "error": "RuntimeError: no CPU kernel"}]}
    lines = side_by_side_markdown([summarise(s, runs) for s in runs])
    assert any(line.startswith("| (e) | msbridge, all sinks, every step | 1.000") and "**81**" in line
               for line in lines)
    assert any(line.startswith("| (p_mf) |") and "n/a: RuntimeError: no CPU kernel" in line for line in lines)
    assert not any(line.startswith("| (a) |") for line in lines), "the baseline is not a row of its own"


@pytest.mark.slow
def test_the_peers_run_beside_msbridge_and_each_gets_a_row(tmp_path):
    """A real bench, few steps: every peer trains the bench model with its tracker (real MLflow on sqlite,
    tensorboardX, SummaryCollector, mindformers), and the table has each one's CPU a step."""
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboardX")
    pytest.importorskip("mindformers")
    from msbridge.bench.suite import run_bench

    report = run_bench(["e", *ONE_TRACKER_PEERS], steps=20, repeats=1, out=str(tmp_path / "out"), stall_s=0.0,
                       echo=lambda _: None)
    rows = {r["setup"]: r for r in report["rows"]}
    assert set(rows) == {"a", "e", *ONE_TRACKER_PEERS}
    assert [s for s, r in rows.items() if "error" in r] == []
    for peer in ("p_mlflow", "p_mlflow_async", "p_tbx"):  # 14 values a step to one tracker: hooks on the thread
        assert rows[peer]["own_on_us"] > 0 and rows[peer]["own_us"] >= rows[peer]["own_on_us"], peer
    assert rows["e"]["steps_recorded"] == 20
    table = (tmp_path / "out" / "bench.md").read_text()
    for setup in ("e", *ONE_TRACKER_PEERS):
        assert f"| ({setup}) | {SETUPS[setup]} |" in table.split("Side by side")[1], setup
    assert "msbridge_over_cheapest_peer" in markdown(report)


def test_where_it_goes_names_each_thread_and_the_children():
    runs = {"a": [_run(0, 1.0, 0.0, 0.0)],
            "e": [dict(_run(r, 14.0, 50.0, 20.0), thread_us_per_step={"msbridge-jsonl": 20.0 + r,
                                                                       "msbridge-mlflow": 30.0})
                  for r in range(3)]}
    row = summarise("e", runs)
    assert row["threads_by_name_us"] == {"msbridge-jsonl": 21.0, "msbridge-mlflow": 30.0}
    line = where_it_goes(row)
    assert line == ("(e): hooks on the training thread 14, msbridge-jsonl 21, msbridge-mlflow 30, "
                    "child processes 20")

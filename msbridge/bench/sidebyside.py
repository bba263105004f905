"""``msbridge bench``'s side-by-side table: each setup's own CPU a step, msbridge's against its peers and its budget.

A setup's own CPU a step (steady state, the worker's ``HookClock`` and schedstat) is: its hooks on the training
thread, every Python thread but the training one (the trackers' writer threads, msbridge's sink hosts), and every
child process (MLflow's client, SummaryCollector's writer). What it adds is that less the same count in its
baseline run of the same repeat (no monitoring), the median over repeats; so is the process's whole CPU (every
thread, MindSpore's included: noisier, at the clock's 10 ms ticks).

Example:
    >>> row.update(own_cost("p_tbx", runs, "a"))
    >>> print("\\n".join(side_by_side_markdown(rows)))
"""
from __future__ import annotations

from statistics import median
from typing import Any, Dict, List, Mapping, Optional, Sequence

#: msbridge's budget a step, all four sinks (setup ``e``), in CPU us: all of it, off and on the training thread.
BUDGET_US = {"all": 85.0, "off": 70.0, "on": 15.0}
#: The setups whose every figure the side-by-side table shows, in this order (when they ran).
SHOWN = ("e", "e_thin", "f", "p_mlflow", "p_mlflow_async", "p_tbx", "p_summary", "p_mf", "b", "d", "d_mf")
#: The peers each writing one tracker: msbridge with all four sinks must cost less CPU a step than each.
ONE_TRACKER_PEERS = ("p_mlflow", "p_mlflow_async", "p_tbx", "p_summary", "p_mf")


def _own(run: Mapping[str, Any]) -> Optional[float]:
    parts = [run.get(k) for k in ("hooks_us_per_step", "py_threads_us_per_step", "children_us_per_step")]
    return None if None in parts else sum(parts)


def _paired(mine: Sequence[Mapping[str, Any]], base: Mapping[int, Mapping[str, Any]], figure: Any) -> Optional[float]:
    diffs = []
    for run in mine:
        other = base.get(run["repeat"])
        if other is None:
            continue
        a, b = figure(run), figure(other)
        if a is not None and b is not None:
            diffs.append(a - b)
    return median(diffs) if diffs else None


def own_cost(setup: str, runs: Mapping[str, List[Dict[str, Any]]], baseline: str) -> Dict[str, Any]:
    """The CPU us a step ``setup`` adds over ``baseline`` (paired by repeat, medians): on the training thread in its
    hooks, off it (Python threads and children), in all; and the whole process's and training thread's excess."""
    mine = [r for r in runs.get(setup, []) if "error" not in r]
    base = {r["repeat"]: r for r in runs.get(baseline, []) if "error" not in r}
    hooks = _paired(mine, base, lambda r: r.get("hooks_us_per_step"))
    total = _paired(mine, base, _own)
    cpu_ms = _paired(mine, base, lambda r: r.get("cpu_ms_per_step"))
    names = {n for r in mine for n in r.get("thread_us_per_step") or {}}
    threads = {n: median([r["thread_us_per_step"].get(n, 0.0) for r in mine if r.get("thread_us_per_step")])
               for n in sorted(names)}
    return {"own_on_us": hooks, "own_us": total, "threads_by_name_us": threads,
            "own_off_us": None if None in (hooks, total) else total - hooks,
            "process_added_us": None if cpu_ms is None else cpu_ms * 1e3,
            "training_thread_added_us": _paired(mine, base, lambda r: r.get("training_thread_us_per_step"))}


def where_it_goes(row: Mapping[str, Any]) -> str:
    """One line: a setup's CPU us a step by place: its hooks, each Python thread by name, its child processes."""
    parts = [f"hooks on the training thread {_cell(row.get('hooks_us_per_step'))}"]
    parts += [f"{name} {us:.0f}" for name, us in (row.get("threads_by_name_us") or {}).items() if us >= 0.5]
    parts.append(f"child processes {_cell(row.get('children_us_per_step'))}")
    return f"({row['setup']}): " + ", ".join(parts)


def budget_targets(rows: Mapping[str, Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """msbridge's (``e``) CPU a step against ``BUDGET_US``, and against the cheapest peer writing one tracker."""
    e = rows.get("e", {})
    out = {f"msbridge_{part}_us": {"target": f"< {limit:.0f} us", "measured": e.get(f"own_{part}_us" if part != "all"
                                                                                 else "own_us")}
           for part, limit in BUDGET_US.items()}
    peers = [rows[p]["own_us"] for p in ONE_TRACKER_PEERS if rows.get(p, {}).get("own_us") is not None]
    if peers and e.get("own_us") is not None:
        out["msbridge_over_cheapest_peer"] = {"target": "< 1 (times)", "measured": e["own_us"] / min(peers)}
    return out


def _cell(value: Optional[float], spec: str = ".0f") -> str:
    return "n/a" if value is None else format(value, spec)


def side_by_side_markdown(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The table: every shown setup's ratio, step, and the CPU a step it adds, on and off the training thread."""
    lines = ["", "Side by side: the CPU a step each setup adds over its baseline (no monitoring, same repeat; "
             "medians), us:", "",
             "| setup | what | ratio (min-max) | median step ms | on the training thread (its hooks) | off it "
             "(threads + children) | all it adds | whole process over baseline | training thread over baseline | "
             "its hooks' wall time |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted((r for r in rows if r["setup"] in SHOWN), key=lambda r: SHOWN.index(r["setup"])):
        if "error" in row:
            lines.append(f"| ({row['setup']}) | {row['label']} | n/a: {row['error']} | | | | | | | |")
            continue
        lines.append(f"| ({row['setup']}) | {row['label']} | {_cell(row['ratio'], '.3f')} "
                     f"({_cell(row['ratio_min'], '.2f')}-{_cell(row['ratio_max'], '.2f')}) | "
                     f"{row['median_step_ms']:.2f} | {_cell(row.get('own_on_us'))} | {_cell(row.get('own_off_us'))} | "
                     f"**{_cell(row.get('own_us'))}** | {_cell(row.get('process_added_us'))} | "
                     f"{_cell(row.get('training_thread_added_us'))} | {_cell(row.get('hooks_wall_us_per_step'))} |")
    lines += ["", "Where it goes, CPU us a step (medians, not less the baseline):", ""]
    lines += [f"- {where_it_goes(r)}" for r in rows if r["setup"] in SHOWN and "error" not in r]
    return lines

"""``msbridge bench``'s fixed costs per run: what a run pays once, whatever its length.

A sweep of many short trials pays these every trial: the CPU seconds (the training process and
its children: the MLflow client process, writers) up to the end of the first step and from the
end of the last step to the end of the run (sinks closed), the whole run's CPU, the close's wall
time, and the MLflow client process's RSS mid-run. Each is the median over repeats; "added" is the
median of the paired difference with the baseline run of the same repeat (no monitoring).

Example:
    >>> rows = [fixed_cost_row(s, runs) for s in runs]
    >>> print("\\n".join(fixed_costs_markdown(rows)))
"""
from __future__ import annotations

from statistics import median
from typing import Any, Dict, List, Mapping, Optional, Sequence

#: figure -> (label, format); the CPU and time figures also get an "added" column.
FIGURES = {"cpu_start_s": ("start CPU s", ".2f"), "cpu_close_s": ("close CPU s", ".2f"),
           "close_s": ("close s", ".2f"), "cpu_total_s": ("CPU s per run", ".1f"),
           "mlflow_child_rss_mb": ("MLflow child RSS MB", ".0f")}
ADDED = ("cpu_start_s", "cpu_close_s", "close_s", "cpu_total_s")


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return median(known) if known else None


def fixed_cost_row(setup: str, runs: Mapping[str, List[Dict[str, Any]]], baseline: str = "a") -> Dict[str, Any]:
    """Medians of each figure over ``setup``'s runs, and each CPU/time figure's median excess over ``baseline``."""
    mine = [r for r in runs.get(setup, []) if "error" not in r]
    base = {r["repeat"]: r for r in runs.get(baseline, []) if "error" not in r}
    row: Dict[str, Any] = {"setup": setup, "baseline": baseline}
    for key in FIGURES:
        row[key] = _median([r.get(key) for r in mine])
    for key in ADDED:
        row[f"{key}_added"] = _median([r[key] - base[r["repeat"]][key] for r in mine if r["repeat"] in base
                                       and r.get(key) is not None and base[r["repeat"]].get(key) is not None])
    return row


def fixed_costs_markdown(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The fixed costs as a markdown table (figure, and "+added" over the baseline where there is one)."""
    lines = ["", "Fixed costs per run (median; + what monitoring adds over the baseline run of the same repeat):", "",
             "| setup | " + " | ".join(label for label, _ in FIGURES.values()) + " |",
             "|---|" + "---|" * len(FIGURES)]
    for row in rows:
        cells = []
        for key, (_, spec) in FIGURES.items():
            value, added = row.get(key), row.get(f"{key}_added")
            cell = "n/a" if value is None else format(value, spec)
            if added is not None and row["setup"] != row["baseline"]:
                cell += f" ({added:+{spec}})"
            cells.append(cell)
        lines.append(f"| ({row['setup']}) | " + " | ".join(cells) + " |")
    return lines

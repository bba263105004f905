"""The distributed readings of ``msbridge diagnose``: chronic stragglers, and which rank went wrong first.

- ``straggler``: from each rank's own file, its per-window ``perf/own_step_time_ms``
  (its step without the wait for others); for a run with rank 0's file only, from
  rank 0's ``dist/step_time_ms/rank_{r}`` (``per_rank_curves``). A rank
  whose own step time is above the other ranks' median by more than the run's
  ``straggler.margin`` in at least ``straggler.windows`` consecutive windows is
  chronic; a one-off stall is not. The evidence: slow windows, longest streak,
  how much slower, its data wait and callback time (from the live ``straggler``
  events).
- ``first_anomaly``: the first rank and step that went non-finite, read from
  every rank's own ``train/loss`` and ``train/grad_norm`` (a step the loss
  scaler skipped on purpose counts only with a non-finite loss), with the ranks
  that followed; plus each live ``blame`` event for other checks (a loss spike
  on one rank first).

Example:
    >>> [d.ranks for d in check_stragglers(read_run("runs/dist/dist-1"))]
    [[3]]
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Dict, List, Tuple

import numpy as np

from ..config.value_checks import straggler_settings
from ..metrics.rank_timing import median_of_others
from ..names import GRAD_NORM, LOSS, OVERFLOW, OWN_STEP_TIME
from ..sinks.runlog import RunLog
from .report import Diagnosis, Skip

_RANK_TIME = re.compile(r"^dist/step_time_ms/rank_(\d+)$")


def _settings(run: RunLog) -> Tuple[float, int]:
    """The run's ``straggler`` margin and windows, from its run.json (defaults when it has none)."""
    try:
        with open(os.path.join(run.run_dir, "run.json"), encoding="utf-8") as fh:
            given = json.load(fh).get("config", {}).get("straggler") or {}
    except (OSError, ValueError):
        given = {}
    settings = straggler_settings(given)
    return float(settings["margin"]), int(settings["windows"])


def _streaks(slow: np.ndarray) -> List[Tuple[int, int]]:
    """``(first index, length)`` of every run of True."""
    out, start = [], None
    for i, flag in enumerate(list(slow) + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            out.append((start, i - start))
            start = None
    return out


def _own_times(run: RunLog) -> Tuple[List[int], List[int], Dict[int, Dict[int, float]], Dict[int, str]]:
    """``(ranks, steps, {step: {rank: own step time}}, {rank: series name})``: from every rank's own file, else
    from rank 0's per-rank curves."""
    by_step: Dict[int, Dict[int, float]] = {}
    own = {r: log for r, log in run.ranks.items() if OWN_STEP_TIME in log.metric_names()}
    if len(own) >= 2:
        for r, log in own.items():
            for step, value in log.series(OWN_STEP_TIME):
                by_step.setdefault(step, {})[r] = value
        return sorted(own), sorted(by_step), by_step, {r: OWN_STEP_TIME for r in own}
    log = run.ranks[min(run.ranks)]
    names = {int(m.group(1)): n for n in log.metric_names() if (m := _RANK_TIME.match(n))}
    for rec in log.records if names else ():
        for r, name in names.items():
            if name in rec.values:
                by_step.setdefault(rec.step, {})[r] = rec.values[name]
    return sorted(names), sorted(by_step), by_step, names


def check_stragglers(run: RunLog) -> List[Diagnosis]:
    """Ranks slower than the other ranks' median by the margin for ``windows`` consecutive windows or more."""
    log = run.ranks[min(run.ranks)]
    ranks, steps, by_step, names = _own_times(run)
    if len(ranks) < 2:
        raise Skip(f"no per-rank step times ({OWN_STEP_TIME}): a single-process run, or one recorded before "
                   "msbridge carried each rank's timing")
    own = np.array([[by_step[s].get(r, math.nan) for r in ranks] for s in steps], dtype=np.float64)
    margin, windows = _settings(run)
    median = np.array([median_of_others(row) for row in own])
    with np.errstate(invalid="ignore"):
        slow = own > median * (1 + margin)
    events = {int(e.detail.get("straggler_rank", -1)): dict(e.detail) for e in log.events if e.kind == "straggler"}
    found = []
    for j, r in enumerate(ranks):
        runs = [(i, n) for i, n in _streaks(slow[:, j]) if n >= windows]
        if not runs:
            continue
        longest = max(runs, key=lambda x: x[1])
        first, n = longest
        ratio = own[first:first + n, j] / median[first:first + n, j]
        pct = float(np.round(100 * (np.mean(ratio) - 1), 1))
        span = [int(steps[first]), int(steps[first + n - 1])]
        live = events.get(r, {})
        wait = live.get("data_wait_ms")
        evidence: Dict[str, Any] = {
            "slow_windows": int(slow[:, j].sum()), "windows": len(steps), "longest_streak": n,
            "streak_steps": span, "mean_slower_pct": pct, "margin": margin, "windows_needed": windows,
            "own_step_time_ms": [round(float(v), 3) for v in own[first:first + n, j]],
            "others_median_ms": [round(float(v), 3) for v in median[first:first + n, j]]}
        if live:
            evidence["live_event"] = live
        where = f"; its data wait was {wait:.1f} ms per step" if isinstance(wait, (int, float)) else ""
        found.append(Diagnosis(
            "straggler", f"rank {r} is a chronic straggler: {pct:.0f}% slower than the other ranks' median in {n} "
            f"consecutive windows (steps {span[0]}-{span[1]})",
            f"every rank waits for rank {r} in each gradient AllReduce{where}: look at its data pipeline "
            "(workers, disk, shard), its host (CPU load, other processes) and its callbacks",
            round(min(1.0, 0.5 + 0.5 * float(slow[:, j].mean())), 3),
            f"above the other ranks' median by more than {margin:.0%} in {int(slow[:, j].sum())} of "
            f"{len(steps)} windows, {n} in a row (needs {windows})", names[r], [int(steps[i]) for i in np.flatnonzero(slow[:, j])], [r],
            evidence))
    return found


def _first_nonfinite(run: RunLog) -> Dict[int, int]:
    """Each rank's first step with a non-finite loss or grad norm (a loss-scaler overflow step: only the loss)."""
    first: Dict[int, int] = {}
    for rank, log in run.ranks.items():
        for rec in log.records:
            bad = [n for n in (LOSS, GRAD_NORM) if n in rec.values and not math.isfinite(rec.values[n])]
            if rec.values.get(OVERFLOW, 0.0) >= 0.5:
                bad = [n for n in bad if n == LOSS]
            if bad:
                first[rank] = rec.step
                break
    return first


def check_first_anomaly(run: RunLog) -> List[Diagnosis]:
    """Which rank went non-finite first (from every rank's file), and every live ``blame`` of another check."""
    if len(run.ranks) < 2:
        raise Skip("only one rank's file in this run: nothing to compare")
    found: List[Diagnosis] = []
    first = _first_nonfinite(run)
    if first:
        step = min(first.values())
        leaders = sorted(r for r, s in first.items() if s == step)
        followers = {r: s for r, s in sorted(first.items(), key=lambda x: (x[1], x[0])) if s != step}
        by_step: Dict[int, List[int]] = {}
        for r, s in followers.items():
            by_step.setdefault(s, []).append(r)
        then = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} at step {s}"
                         for s, rs in by_step.items()) or "no other rank"
        who = f"rank {leaders[0]}" if len(leaders) == 1 else f"ranks {', '.join(map(str, leaders))} together"
        found.append(Diagnosis(
            "first_anomaly", f"{who} went non-finite first, at step {step}; then {then}",
            f"look at {who}'s batch and inputs at step {step} (its dump, if one was written); the others "
            "followed through the gradient AllReduce", 1.0 if len(leaders) == 1 else 0.6,
            "read from every rank's own loss and grad norm", LOSS, [step] + sorted(set(followers.values())),
            leaders + list(followers), {"first_nonfinite_step": {str(r): s for r, s in first.items()}}))
    log = run.ranks[min(run.ranks)]
    for event in log.events:
        detail = event.detail
        if event.kind != "blame" or detail.get("check") == "nonfinite":
            continue
        rank, step = int(detail.get("blamed_rank", -1)), int(detail.get("first_step", event.step))
        found.append(Diagnosis(
            "first_anomaly", f"rank {rank} was first: {detail.get('check')} at step {step}",
            f"look at rank {rank}'s batch at step {step}; ranks that followed: "
            f"{', '.join(str(t['rank']) for t in detail.get('then', [])) or 'none in that window'}",
            0.8 if len(detail.get("same_step_ranks", [])) <= 1 else 0.4,
            "the live blame event (each rank's own health finding, gathered at the flush)",
            LOSS, [step], [rank], {"blame": dict(detail)}))
    return found


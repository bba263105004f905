"""``msbridge compare``: a sweep's runs side by side, read back from MLflow, best first.

The runs are ranked on one objective: the one the runs were trained with (their ``msbridge.objective`` tag,
``objective:`` in the config), else the first of ``eval/global_loss``, ``eval/loss``, ``train/global_loss``,
``train/loss`` that every run recorded, lower is better. Each row shows the params that differ between runs
(a sweep's parent run is not a row), the objective's best value, the step of that best and its final value,
median throughput and status; ``★`` marks the best run. What the steps were worth, where the runs recorded it
(``WORK_COLUMNS``: median tokens/s and MFU, the last ``perf/tokens_seen``), is a column when any row has it: two
parallel strategies or global batches compare on cost as well as on the objective.

Example:
    >>> table = compare("msbridge-sweep", "sqlite:///msbridge_runs/msbridge-sweep/mlflow.db")
    >>> print(format_table(table))
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..adapters.mlflow_tracker.run.sweep import PARENT_TAG
from ..adapters.mlflow_tracker.run.view import OBJECTIVE_TAG, PRUNED_TAG, differing_params
from ..errors import MissingDependencyError, MsbridgeError
from ..masking import mask_text
from ..names import DEFAULT_OBJECTIVES, MFU, SAMPLES_PER_S, TOKENS_PER_S, TOKENS_SEEN, objective_metric
from ..paths import DEFAULT_EXPERIMENT_DIR, render_experiment_dir
from ..sinks.registry import sink_class

NAN = float("nan")
BEST_MARK = "★"
#: The work columns: (metric, header, how a run's series becomes one number, format).
WORK_COLUMNS = ((TOKENS_PER_S, "tokens/s", "median", "{:.1f}"), (MFU, "mfu %", "median", "{:.2f}"),
                (TOKENS_SEEN, "tokens seen", "last", "{:.0f}"))


@dataclass
class RunRow:
    """One MLflow run of the experiment, summarised on the objective."""

    run_name: str
    run_id: str
    status: str
    best: float
    best_step: Optional[int]
    final: float
    samples_per_s: float
    points: int
    params: Dict[str, str] = field(default_factory=dict)
    work: Dict[str, float] = field(default_factory=dict)  # WORK_COLUMNS' metrics this run recorded


@dataclass
class Comparison:
    """The rows, best first, the objective they are ranked on and the param keys whose values differ."""

    objective: str
    mode: str
    rows: List[RunRow]
    differing: List[str]


def _client(tracking_uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise MissingDependencyError("msbridge compare", "mlflow", "mlflow") from None
    return MlflowClient(tracking_uri=tracking_uri)


def _history(client: Any, run_id: str, key: str) -> List[Tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _objective(runs: Sequence[Any], metric: Optional[str], mode: Optional[str]) -> Tuple[str, str]:
    """The objective given, else the runs' own (the latest tagged run's), else the default every run has."""
    tagged = next((r.data.tags[OBJECTIVE_TAG] for r in runs if OBJECTIVE_TAG in r.data.tags), "")
    tag_metric, _, tag_mode = tagged.partition(" (")
    common = set.intersection(*(set(r.data.metrics) for r in runs)) if runs else set()
    chosen = metric or tag_metric or objective_metric(None, common) or DEFAULT_OBJECTIVES[-1]
    return chosen, mode or tag_mode.rstrip(")") or "min"


def _row(client: Any, run: Any, metric: str, mode: str) -> RunRow:
    series = _history(client, run.info.run_id, metric)
    finite = [(s, v) for s, v in series if math.isfinite(v)]
    pick = max if mode == "max" else min
    best_step, best = pick(finite, key=lambda p: p[1]) if finite else (None, NAN)
    speed = [v for _, v in _history(client, run.info.run_id, SAMPLES_PER_S) if math.isfinite(v)]
    return RunRow(run_name=run.info.run_name or run.info.run_id[:8], run_id=run.info.run_id,
                  status="PRUNED" if PRUNED_TAG in run.data.tags else run.info.status,
                  best=best, best_step=best_step,
                  final=series[-1][1] if series else NAN,
                  samples_per_s=statistics.median(speed) if speed else NAN, points=len(series),
                  params=dict(run.data.params), work=_work(client, run))


def _work(client: Any, run: Any) -> Dict[str, float]:
    """The run's ``WORK_COLUMNS`` numbers: a median or the last finite value of each metric it logged."""
    out = {}
    for name, _, how, _ in WORK_COLUMNS:
        if name not in run.data.metrics:
            continue
        values = [v for _, v in _history(client, run.info.run_id, name) if math.isfinite(v)]
        if values:
            out[name] = statistics.median(values) if how == "median" else values[-1]
    return out


def compare(experiment: str, tracking_uri: str, metric: Optional[str] = None,
            mode: Optional[str] = None) -> Comparison:
    """The experiment's runs ranked on the objective (``metric``/``mode`` override the runs' own)."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = ", ".join(e.name for e in client.search_experiments()) or "none"
        raise MsbridgeError(f"no MLflow experiment {experiment!r} at {mask_text(tracking_uri)}; it has: {names}")
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=5000) if PARENT_TAG not in r.data.tags]
    metric, mode = _objective(runs, metric, mode)
    runs.sort(key=lambda r: r.info.start_time or 0)  # of equal values, the run started first ranks first
    rows = [_row(client, run, metric, mode) for run in runs]
    sign = -1 if mode == "max" else 1
    rows.sort(key=lambda r: (r.status != "FINISHED", not math.isfinite(r.best),  # completed runs first
                             sign * r.best if math.isfinite(r.best) else 0))
    return Comparison(metric, mode, rows, differing_params([r.params for r in rows]))


def _table(table: Comparison) -> Tuple[List[str], List[List[str]]]:
    work = [c for c in WORK_COLUMNS if any(c[0] in r.work for r in table.rows)]
    header = ["rank", "best", "run", *table.differing, f"{table.objective} ({table.mode})", "at_step", "final",
              "samples/s", *(c[1] for c in work), "points", "status"]
    body = [[str(i), BEST_MARK if i == 1 and math.isfinite(r.best) else "", r.run_name,
             *(r.params.get(k, "") for k in table.differing), f"{r.best:.4f}",
             "" if r.best_step is None else str(r.best_step), f"{r.final:.4f}", f"{r.samples_per_s:.1f}",
             *(fmt.format(r.work[name]) if name in r.work else "" for name, _, _, fmt in work),
             str(r.points), r.status]
            for i, r in enumerate(table.rows, 1)]
    return header, body


def format_table(table: Comparison, fmt: str = "text") -> str:
    """Render as an aligned text table, CSV or JSON."""
    if fmt == "json":
        return json.dumps({**asdict(table), "best_run": table.rows[0].run_name if table.rows else None}, indent=2)
    header, body = _table(table)
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([header, *body])
        return out.getvalue().rstrip("\n")
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def default_tracking_uri(experiment: str, root: Optional[str] = None) -> str:
    """The store msbridge writes ``experiment`` to by default: ``sqlite:///<root>/<experiment>/mlflow.db``.

    ``root`` defaults to ``./msbridge_runs``: the experiment dir of a config that places neither
    ``experiment_dir`` nor ``output_dir``, of the demo and of ``examples/sweep``.
    """
    template = os.path.join(root, "{experiment}") if root else DEFAULT_EXPERIMENT_DIR
    return sink_class("mlflow").store_default(render_experiment_dir(template, experiment))["tracking_uri"]

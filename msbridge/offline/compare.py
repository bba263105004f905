"""``msbridge compare``: a sweep's runs side by side, read back from MLflow.

Shows only the params that differ between runs (a sweep's parent run is not a row), then final and best loss,
median throughput and status, best final loss first.

Example:
    >>> rows, differing = compare("msbridge-sweep", "sqlite:///msbridge_runs/msbridge-sweep/mlflow.db")
    >>> print(format_table(rows, differing))
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

from ..adapters._mlflow_sweep import PARENT_TAG
from ..errors import MissingDependencyError, MsbridgeError
from ..masking import mask_text
from ..names import LOSS, SAMPLES_PER_S
from ..paths import DEFAULT_EXPERIMENT_DIR, render_experiment_dir
from ..sinks.registry import sink_class

NAN = float("nan")


@dataclass
class RunRow:
    """One MLflow run of the experiment, summarised."""

    run_name: str
    run_id: str
    status: str
    final_loss: float
    best_loss: float
    samples_per_s: float
    steps: int
    params: Dict[str, str] = field(default_factory=dict)


def _client(tracking_uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise MissingDependencyError("msbridge compare", "mlflow", "mlflow") from None
    return MlflowClient(tracking_uri=tracking_uri)


def _history(client: Any, run_id: str, key: str) -> List[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def compare(experiment: str, tracking_uri: str) -> Tuple[List[RunRow], List[str]]:
    """Rows sorted by final loss (non-finite last) and the param keys whose values differ."""
    client = _client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = ", ".join(e.name for e in client.search_experiments()) or "none"
        raise MsbridgeError(f"no MLflow experiment {experiment!r} at {mask_text(tracking_uri)}; it has: {names}")
    rows = []
    for run in client.search_runs([exp.experiment_id], max_results=5000):
        if PARENT_TAG in run.data.tags:  # a sweep's parent run: its children are the rows
            continue
        losses = _history(client, run.info.run_id, LOSS)
        finite = [v for v in losses if math.isfinite(v)]
        speed = [v for v in _history(client, run.info.run_id, SAMPLES_PER_S) if math.isfinite(v)]
        rows.append(RunRow(
            run_name=run.info.run_name or run.info.run_id[:8], run_id=run.info.run_id, status=run.info.status,
            final_loss=losses[-1] if losses else NAN, best_loss=min(finite) if finite else NAN,
            samples_per_s=statistics.median(speed) if speed else NAN, steps=len(losses),
            params=dict(run.data.params)))
    rows.sort(key=lambda r: (not math.isfinite(r.final_loss), r.final_loss))
    keys = sorted({k for r in rows for k in r.params})
    differing = [k for k in keys if len({r.params.get(k) for r in rows}) > 1]
    return rows, differing


def _table(rows: Sequence[RunRow], differing: Sequence[str]) -> Tuple[List[str], List[List[str]]]:
    header = ["rank", "run", *differing, "final_loss", "best_loss", "samples/s", "steps", "status"]
    body = [[str(i), r.run_name, *(r.params.get(k, "") for k in differing), f"{r.final_loss:.4f}",
             f"{r.best_loss:.4f}", f"{r.samples_per_s:.1f}", str(r.steps), r.status]
            for i, r in enumerate(rows, 1)]
    return header, body


def format_table(rows: Sequence[RunRow], differing: Sequence[str], fmt: str = "text") -> str:
    """Render as an aligned text table, CSV or JSON."""
    if fmt == "json":
        return json.dumps({"differing_params": list(differing), "runs": [asdict(r) for r in rows]}, indent=2)
    header, body = _table(rows, differing)
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

"""The MLflow pages msbridge opens: saved views (what MLflow's Share button stores) and the best run's mark.

MLflow 3's UI opens a saved view from an experiment tag ``mlflow.sharedViewState.<key>`` at
``#/experiments/<id>/runs?viewStateShareKey=<key>``; the tag holds the runs page's search facets (filter, sort)
and UI state (columns, chart sections and cards). Two views:

- ``loss_first_view``: one run's charts (or the experiment's), the train section's loss charts first;
- ``sweep_view``: a sweep compared. Sorted by ``objective/best`` (best first, by the objective's ``mode``): a
  sorted runs table is flat, so no run hides under the sweep's parent run. Columns: the params that differ
  between the runs, the trial's state (``msbridge.trial_state``: COMPLETE, PRUNED, FAIL, RUNNING, as Optuna names
  it), the objective (best, its step, final) and ``msbridge.best``, the mark ``mark_best`` puts on the best
  complete run. MLflow 3.17's table groups them as metrics, params, tags: the objective, the params, then the state
  and the mark. The MLflow sink writes it as each run of a sweep ends (``share_sweep_view``): one tag per sweep,
  rewritten in place. Charts: a parallel-coordinates chart of the differing params against ``objective/best``, then
  the loss and the objective's metric over steps on a log axis, so one diverging run does
  not flatten the others into a line.

MLflow leaves pinned runs out of a saved view (``runsPinned`` is not shared), so the best run is marked by a
tag, which the table shows as a column.

Example:
    >>> key, value = sweep_view(["optimizer.learning_rate"], "min", "eval/loss", sweep_id="a1b2c3d4")
    >>> key
    'mlflow.sharedViewState.msbridge-sweep-a1b2c3d4'
"""
from __future__ import annotations

import json
import math
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from msbridge.adapters.mlflow_tracker.run.fields import clean_key
from msbridge.adapters.mlflow_tracker.run.sweep import PARENT_TAG, SWEEP_TAG
from msbridge.names import DATA_WAIT_PCT, EVAL_LOSS, GLOBAL_LOSS, GRAD_NORM, LOSS, LR, MFU, OBJECTIVE_BEST, \
    OBJECTIVE_BEST_STEP, OBJECTIVE_FINAL, SAMPLES_PER_S, TFLOPS, TOKENS_SEEN

#: MLflow 3's UI opens in its GenAI mode unless the URL asks for model training (``workflowType``; else the
#: browser's last choice): every URL msbridge prints carries this query.
MODEL_TRAINING_QUERY = "workflowType=machine_learning"
#: An experiment tag MLflow's UI reads as a saved view (what its Share button stores), opened by
#: ``?viewStateShareKey=<key>``.
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
#: Chart sections in this order (MLflow sorts them by name otherwise: health, perf, train), loss charts first.
VIEW_SECTIONS = ("train", "eval", "objective", "dist", "perf", "grad_norm", "attention", "memory", "weight_norm",
                 "optimizer", "health")
VIEW_FIRST_CHARTS = {"train": (LOSS, GLOBAL_LOSS, GRAD_NORM, LR),
                     "perf": (MFU, TOKENS_SEEN, SAMPLES_PER_S, TFLOPS, DATA_WAIT_PCT)}
#: The perf section's third chart: the loss over tokens seen (MLflow's x-axis set to a metric), where runs
#: with different global batches or parallel strategies line up on the work done.
LOSS_OVER_TOKENS = "msbridge-perf-loss-over-tokens"
#: The run tag that marks the best run of a sweep (or of an experiment's runs), and its value there.
BEST_TAG = "msbridge.best"
BEST_MARK = "★ best"
#: The run tag naming the metric a run is compared on and its mode: ``eval/loss (min)``.
OBJECTIVE_TAG = "msbridge.objective"
#: The param of a run's name: not a compared param.
RUN_NAME_PARAM = "msbridge.run_name"
#: Runs ``mark_best`` and ``sweep_runs`` look at.
MAX_RUNS = 1000
_OBJECTIVE_COLUMNS = (OBJECTIVE_BEST, OBJECTIVE_BEST_STEP, OBJECTIVE_FINAL)
#: The tag of a run its sweep pruned (its ``pruned`` event, ``msbridge.sweep.trial``).
PRUNED_TAG = "msbridge.event.pruned.last"
#: The run tag of a sweep's run: its trial's state as Optuna names it (``trial_state``).
STATE_TAG = "msbridge.trial_state"
RUNNING, COMPLETE, PRUNED, FAIL = "RUNNING", "COMPLETE", "PRUNED", "FAIL"


def _card(key: str, section: str, **changes: Any) -> Dict[str, Any]:
    """One line chart card as MLflow's UI stores it (its ``RunsChartsLineCardConfig`` defaults)."""
    card = {"uuid": f"msbridge-{clean_key(key).replace('/', '-')}", "type": "LINE", "runsCountToCompare": 10,
            "metricSectionId": f"msbridge-{section}", "deleted": False, "isGenerated": True,
            "displayName": key.split("/")[-1], "metricKey": key, "lineSmoothness": 0, "xAxisScaleType": "linear",
            "scaleType": "linear", "range": {}, "xAxisKey": "step", "selectedXAxisMetricKey": "",
            "yAxisKey": "metric", "yAxisExpressions": [], "ignoreOutliers": False, "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True}
    card.update(changes)
    return card


def _sections(first: Sequence[str], ordered: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The chart sections, ``first`` on top in its order, then the rest in ``VIEW_SECTIONS`` order. ``first`` and
    ``ordered`` keep their cards' order (``isReordered``): MLflow appends a chart it generates there, where it
    otherwise files it among the section's cards by name (a generated ``perf/data_wait_ms`` before ``perf/mfu``)."""
    order = [*first, *(name for name in VIEW_SECTIONS if name not in first)]
    return [{"uuid": f"msbridge-{name}", "name": name, "display": True,
             "isReordered": name in first or name in ordered, "deleted": False, "isGenerated": True}
            for name in order]


def _tag(name: str, state: Mapping[str, Any]) -> Tuple[str, str]:
    return VIEW_TAG_PREFIX + name, json.dumps(state, separators=(",", ":"))


def loss_first_view(mlflow_run_id: Optional[str] = None) -> Tuple[str, str]:
    """The experiment tag ``(key, JSON value)`` of an MLflow view whose charts open on the loss: sections in
    ``VIEW_SECTIONS`` order, the train section's loss charts first, charts of metrics a run lacks hidden;
    with ``mlflow_run_id``, only that run. Open it at ``#/experiments/<id>/runs?viewStateShareKey=<key>``.

    Example:
        >>> loss_first_view("e36a30f1d658")[0]
        'mlflow.sharedViewState.msbridge-e36a30f1d658'
    """
    charts = [_card(key, section) for section, keys in VIEW_FIRST_CHARTS.items() for key in keys]
    tokens = next(i for i, card in enumerate(charts) if card["metricKey"] == TOKENS_SEEN)
    charts.insert(tokens + 1, _card(LOSS, "perf", uuid=LOSS_OVER_TOKENS, xAxisKey="metric",
                                    selectedXAxisMetricKey=TOKENS_SEEN, useGlobalXaxisKey=False))
    state: Dict[str, Any] = {"compareRunSections": _sections(["train"], tuple(VIEW_FIRST_CHARTS)),
                             "compareRunCharts": charts,
                             "isAccordionReordered": True, "hideEmptyCharts": True}
    if mlflow_run_id:
        state["searchFilter"] = f"attributes.run_id = '{mlflow_run_id}'"
    return _tag("msbridge-" + (mlflow_run_id or "loss-first"), state)


def sweep_view(differing: Sequence[str], mode: str, metric: Optional[str],
               sweep_id: Optional[str] = None) -> Tuple[str, str]:
    """The experiment tag ``(key, JSON value)`` of a sweep's first screen (see the module docstring):
    ``differing`` params as columns and parallel axes, sorted by ``objective/best`` for ``mode`` (min: ascending),
    ``metric`` (the objective's, e.g. ``eval/loss``) charted beside the loss; ``sweep_id`` filters its runs and
    puts their trial state before the objective."""
    columns = ["attributes.`Duration`", *(f"params.`{p}`" for p in differing),
               *([f"tags.`{STATE_TAG}`"] if sweep_id else []), *(f"metrics.`{m}`" for m in _OBJECTIVE_COLUMNS),
               f"tags.`{BEST_TAG}`"]
    parallel = {"uuid": "msbridge-sweep-parallel", "type": "PARALLEL", "runsCountToCompare": 100,
                "metricSectionId": "msbridge-objective", "deleted": False, "isGenerated": True,
                "displayName": "objective against the swept params", "selectedParams": list(differing),
                "selectedMetrics": [OBJECTIVE_BEST], "showAllRuns": True}
    curves = [m for m in (metric or EVAL_LOSS,) if m != LOSS] + [LOSS]
    charts = ([parallel] if differing else []) + [
        _card(key, "objective", scaleType="log", runsCountToCompare=100) for key in curves]
    # the objective's own series are the table's columns; as lines over the step they would only repeat them
    charts += [_card(key, "objective", deleted=True) for key in _OBJECTIVE_COLUMNS]
    state: Dict[str, Any] = {
        "orderByKey": f"metrics.`{OBJECTIVE_BEST}`", "orderByAsc": mode != "max",
        "searchFilter": _group_filter(sweep_id, children_only=True),
        "selectedColumns": columns, "compareRunSections": _sections(["objective", "train"]),
        "compareRunCharts": charts, "isAccordionReordered": True, "hideEmptyCharts": True,
        "runsHiddenMode": "SHOW_ALL"}
    return _tag("msbridge-sweep" + (f"-{sweep_id}" if sweep_id else ""), state)


def differing_params(params: Sequence[Mapping[str, str]]) -> List[str]:
    """The param keys whose values differ between the runs (a key a run lacks counts as differing), the run's
    name left out (the table's first column shows it).

    Example:
        >>> differing_params([{"lr": "0.1", "bs": "8"}, {"lr": "0.01", "bs": "8"}])
        ['lr']
    """
    keys = sorted({k for p in params for k in p} - {RUN_NAME_PARAM})
    return [k for k in keys if len({p.get(k) for p in params}) > 1]


def compared_view(runs: Sequence[Tuple[Mapping[str, str], Mapping[str, str]]]) -> Optional[Tuple[str, str]]:
    """``sweep_view`` of an experiment's runs, each ``(params, tags)`` (a sweep's parent runs left out here):
    the sweep's when every run carries one ``sweep_id``, else the experiment's; None for fewer than two runs.
    The objective's mode and metric are the latest run's (its ``msbridge.objective`` tag, ``eval/loss (min)``).

    Example:
        >>> runs = [({"lr": "0.1"}, {"msbridge.objective": "eval/loss (min)"}), ({"lr": "0.01"}, {})]
        >>> json.loads(compared_view(runs)[1])["selectedColumns"][1]
        'params.`lr`'
    """
    runs = [(params, tags) for params, tags in runs if PARENT_TAG not in tags]
    if len(runs) < 2:
        return None
    sweeps = {tags.get(SWEEP_TAG) for _, tags in runs}
    objective = next((tags[OBJECTIVE_TAG] for _, tags in runs if OBJECTIVE_TAG in tags), "")
    metric, _, mode = objective.partition(" (")
    return sweep_view(differing_params([params for params, _ in runs]), mode.rstrip(")") or "min", metric or None,
                      sweeps.pop() if len(sweeps) == 1 else None)


def _group_filter(sweep_id: Optional[str], children_only: bool = False) -> str:
    """The search filter of a sweep's runs; ``children_only`` leaves its parent run out."""
    if not sweep_id:
        return ""
    return f"tags.`{SWEEP_TAG}` = '{sweep_id}'" + (" and tags.`mlflow.parentRunId` LIKE '%'" if children_only else "")


def sweep_runs(client: Any, experiment_id: str, sweep_id: Optional[str], mode: str) -> List[Any]:
    """The runs compared with each other (the sweep's, else the experiment's; parents left out), best first."""
    order = f"metrics.`{OBJECTIVE_BEST}` {'DESC' if mode == 'max' else 'ASC'}"
    runs = client.search_runs([experiment_id], _group_filter(sweep_id), max_results=MAX_RUNS, order_by=[order])
    return [r for r in runs if PARENT_TAG not in r.data.tags]


def trial_state(status: str, tags: Mapping[str, str], metrics: Mapping[str, float]) -> str:
    """A run's state as Optuna names its trial, from its MLflow ``status``, tags and latest metrics: RUNNING while it
    runs; PRUNED when it finished with a ``pruned`` event; COMPLETE when it finished with a finite ``objective/best``
    (what ``msbridge sweep`` tells Optuna); FAIL otherwise (failed, killed, or no finite objective).

    Example:
        >>> [trial_state("FINISHED", {}, {"objective/best": v}) for v in (0.25, math.nan)]
        ['COMPLETE', 'FAIL']
    """
    if status in ("RUNNING", "SCHEDULED"):
        return RUNNING
    if status != "FINISHED":
        return FAIL
    if PRUNED_TAG in tags:
        return PRUNED
    best = metrics.get(OBJECTIVE_BEST)
    return COMPLETE if best is not None and math.isfinite(best) else FAIL


def completed(run: Any) -> bool:
    """A run that trained to its end with a finite objective: ``trial_state`` COMPLETE."""
    return trial_state(run.info.status, run.data.tags, run.data.metrics) == COMPLETE


def mark_best(client: Any, experiment_id: str, sweep_id: Optional[str], mode: str) -> Optional[str]:
    """Tag the best run by ``objective/best`` with ``BEST_TAG`` and take the tag off any other; returns its id.
    A run without a finite ``objective/best`` never has it. Only runs that completed compete, unless none did (a
    stopped or pruned run never takes the mark from one that finished); of equal values, the run started first.
    Each run of a sweep does this as it ends, so once the last has ended the mark is on the best."""
    runs = sweep_runs(client, experiment_id, sweep_id, mode)
    scored = [r for r in runs if math.isfinite(r.data.metrics.get(OBJECTIVE_BEST, math.nan))]
    scored = [r for r in scored if completed(r)] or scored
    top = [r for r in scored if r.data.metrics[OBJECTIVE_BEST] == scored[0].data.metrics[OBJECTIVE_BEST]]
    best = min(top, key=lambda r: r.info.start_time or 0).info.run_id if top else None  # a tie: the first started
    for run in runs:
        if run.info.run_id == best and run.data.tags.get(BEST_TAG) != BEST_MARK:
            client.set_tag(best, BEST_TAG, BEST_MARK)
        elif run.info.run_id != best and BEST_TAG in run.data.tags:
            client.delete_tag(run.info.run_id, BEST_TAG)
    return best


def server_address(uri: str) -> str:
    """The UI's address of a tracking server URI without its credentials ("" for a store that is no server).

    Example:
        >>> server_address("https://me:s3cret@mlflow.team.example:8443/"), server_address("sqlite:///m.db")
        ('https://mlflow.team.example:8443', '')
    """
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path.rstrip('/')}"


def view_page(experiment_id: str, key: str, mode: str = "") -> str:
    """The page, under the server's address, that opens the saved view ``key`` (its tag) in the model-training UI;
    ``mode``: ``CHART`` or ``TABLE`` (else the browser's last choice).

    Example:
        >>> view_page("3", "mlflow.sharedViewState.msbridge-sweep-a1", "TABLE")
        '/#/experiments/3/runs?viewStateShareKey=msbridge-sweep-a1&compareRunsMode=TABLE&workflowType=machine_learning'
    """
    query = {"viewStateShareKey": key[len(VIEW_TAG_PREFIX):], **({"compareRunsMode": mode} if mode else {})}
    return f"/#/experiments/{experiment_id}/runs?{urllib.parse.urlencode(query)}&{MODEL_TRAINING_QUERY}"


def share_sweep_view(client: Any, experiment_id: str, sweep_id: str) -> Optional[str]:
    """Write the saved view of the sweep's runs (``compared_view``) to the experiment, as MLflow's Share button
    does, unless it holds that view already; its page (``view_page``), None while the sweep has fewer than two runs
    to compare. One tag per sweep, so every run ending writes the same one, in place; of two runs writing it at
    once, a store may refuse the second insert: the first one's view stands."""
    runs = client.search_runs([experiment_id], _group_filter(sweep_id), max_results=MAX_RUNS)
    view = compared_view([(r.data.params, r.data.tags) for r in runs])
    if view is None:
        return None
    if client.get_experiment(experiment_id).tags.get(view[0]) != view[1]:
        try:
            client.set_experiment_tag(experiment_id, *view)
        except Exception:  # a store may refuse the second of two inserts of one tag at once: the first one stands
            if client.get_experiment(experiment_id).tags.get(view[0]) is None:
                raise
    return view_page(experiment_id, view[0], "TABLE")

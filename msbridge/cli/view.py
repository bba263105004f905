"""``msbridge view RUN_DIR``: start the run's viewers on 127.0.0.1, print their URLs, stop them on Ctrl-C.

A run dir (it holds ``run.json``) opens on that run, on its loss: MLflow in its
model-training view on the run's charts (loss first), TensorBoard on the run's own
event files with the training curves pinned first, MindInsight on the run's dashboard.
An experiment dir opens on every run in it. A sweep's experiment dir (or a trial's run dir) also opens
optuna-dashboard on the study, from its ``optuna.db`` (``--optuna URL``: another storage, PostgreSQL's).
With no flag, every viewer the run has a sink (or a study) for is started;
``--mlflow``/``--tensorboard``/``--mindinsight``/``--optuna`` pick some. One line each says what is
starting; one line each, as it answers, its URL and how long it took. A run tracked on an MLflow server (``http://...``) gets that
server's URL; nothing is started for it. On Ctrl-C (SIGINT), SIGTERM or SIGHUP
every server is stopped with every process it started.

Example:
    $ msbridge view msbridge_runs/msbridge-demo/tiny-lm-lr0.003-20250101-120000
    $ msbridge view msbridge_runs/msbridge-demo --tensorboard
    $ msbridge view msbridge_runs/demo-sweep --optuna
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ..adapters._tracker_facts import VIEWED_SINKS
from ..adapters.mlflow_tracker.run.view import MAX_RUNS, MODEL_TRAINING_QUERY, compared_view, loss_first_view, view_page
from ..adapters.mindinsight_sink import rank_dir
from ..adapters.mlflow_sink import RUN_ID_TAG
from ..errors import MsbridgeError
from ..masking import mask_text
from ..names import GLOBAL_LOSS, GRAD_NORM, LOSS, LR, MFU, SAMPLES_PER_S, TOKENS_SEEN
from ..paths import recorded_experiment_dir, safe_component
from ..run.metadata import RUN_JSON
from ..sinks.registry import store_defaults, with_store_defaults
from ..sinks.runlog import rank_file
from .viewers import (
    OPTUNA_MISSING,
    Viewer,
    build_mindinsight,
    mindinsight_missing,
    mindinsight_venv,
    mindinsight_viewer,
    mlflow_viewer,
    optuna_viewer,
    tensorboard_viewer,
)

#: The sinks' viewers, then the sweep's: optuna-dashboard on the study (``OPTUNA_DB`` in the experiment dir).
VIEWERS = VIEWED_SINKS + ("optuna",)
OPTUNA_DB = "optuna.db"
#: What each viewer is, in the line that says it is starting.
SERVERS = {"mlflow": "MLflow's server (mlflow server)", "tensorboard": "TensorBoard",
           "mindinsight": "MindInsight (mindinsight start)", "optuna": "optuna-dashboard"}
TENSORBOARD_PINNED = (LOSS, GLOBAL_LOSS, GRAD_NORM, LR, SAMPLES_PER_S, MFU, TOKENS_SEEN)
STORE_KEYS = ("tracking_uri", "logdir", "summary_base_dir")
#: After a viewer's URL, once it answers: the seconds since the viewers were started.
ANSWERED = "(answered after {:.0f} s)"


@dataclass
class Target:
    """What to show: a run (or an experiment dir), and where each of its trackers keeps its data.

    Example:
        >>> target = find_target("msbridge_runs/msbridge-demo/run-1")
        >>> target.stores["tensorboard"]
        '/abs/msbridge_runs/msbridge-demo/tensorboard/run-1'
    """

    path: str
    experiment: Optional[str] = None
    run_id: Optional[str] = None  # msbridge's run id (the MLflow tag), None for an experiment dir
    stores: Dict[str, str] = field(default_factory=dict)  # viewer -> tracking URI or directory
    pages: Dict[str, str] = field(default_factory=dict)  # viewer -> page to open, when not its front page
    run_dir: Optional[str] = None  # the run (an experiment dir's newest) whose log names what is recorded
    study: Optional[str] = None  # the Optuna study of a sweep (its ``sweep_id``)


def _read_json(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise MsbridgeError(f"{path} cannot be read: {exc}") from None


def _absolute(store: str, cwd: str) -> str:
    """A store path the run's config gave relative to the training's working directory, made absolute."""
    if store.startswith("sqlite:///"):
        return "sqlite:///" + os.path.normpath(os.path.join(cwd, os.path.expanduser(store[len("sqlite:///"):])))
    return store if "://" in store else os.path.normpath(os.path.join(cwd, os.path.expanduser(store)))


def _store_options(meta: Dict[str, Any], run_dir: str) -> Dict[str, Dict[str, Any]]:
    """Each viewed sink's options as the run used them: stores defaulted to its experiment dir, absolute."""
    sinks = (meta.get("config") or {}).get("sinks") or {}
    experiment_dir, cwd = recorded_experiment_dir(meta, run_dir), meta.get("cwd") or os.getcwd()
    out = {}
    for name in (n for n in VIEWERS if n in sinks):
        options = with_store_defaults(name, sinks[name] or {}, experiment_dir)
        out[name] = {k: _absolute(v, cwd) if k in STORE_KEYS and isinstance(v, str) else v for k, v in options.items()}
    return out


def _run_target(run_dir: str) -> Target:
    meta = _read_json(os.path.join(run_dir, RUN_JSON))
    config = meta.get("config") or {}
    run_name = meta.get("run_name") or os.path.basename(run_dir)
    options = _store_options(meta, run_dir)
    target = Target(run_dir, (options.get("mlflow") or {}).get("experiment") or config.get("experiment"),
                    meta.get("run_id"), run_dir=run_dir)
    if "mlflow" in options:
        target.stores["mlflow"] = options["mlflow"]["tracking_uri"]
    if "tensorboard" in options:  # the run's own event files (mindformers' own dir when it shared its writer)
        logdir = options["tensorboard"]["logdir"]
        where = ((meta.get("sinks") or {}).get("tensorboard") or {}).get("where", "")
        found = [d for d in (where, os.path.join(logdir, safe_component(run_name))) if d and os.path.isdir(d)]
        target.stores["tensorboard"] = found[0] if found else logdir
    if "mindinsight" in options:
        base = options["mindinsight"]["summary_base_dir"]
        target.stores["mindinsight"] = base
        train_id = "./" + os.path.basename(rank_dir(base, run_name, 0))
        target.pages["mindinsight"] = "/#/train-manage/training-dashboard?" + urllib.parse.urlencode({"id": train_id})
    _add_study(target, config.get("sweep_id"), recorded_experiment_dir(meta, run_dir))
    return target


def _add_study(target: Target, sweep_id: Optional[str], experiment_dir: str) -> None:
    """The sweep's study (its ``sweep_id``, else the experiment's name) and its default storage, ``optuna.db`` in
    the experiment dir (``msbridge sweep`` names the study, the experiment and the ``sweep_id`` alike)."""
    target.study = sweep_id
    db = os.path.join(experiment_dir, OPTUNA_DB)
    if os.path.isfile(db):
        target.study = sweep_id or target.experiment
        target.stores["optuna"] = "sqlite:///" + db


def _experiment_target(path: str) -> Target:
    runs = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, RUN_JSON)))
    config = (_read_json(os.path.join(path, runs[-1], RUN_JSON)).get("config") or {}) if runs else {}
    mlflow_options = (config.get("sinks") or {}).get("mlflow") or {}
    target = Target(path, mlflow_options.get("experiment") or config.get("experiment"),
                    run_dir=os.path.join(path, runs[-1]) if runs else None)
    for name, options in store_defaults(path).items():
        store = next(iter(options.values()))
        if os.path.exists(store[len("sqlite:///"):] if store.startswith("sqlite:///") else store):
            target.stores[name] = store
    _add_study(target, config.get("sweep_id"), path)
    if not runs and not target.stores:
        raise MsbridgeError(f"{path} is neither a run dir (no {RUN_JSON}) nor an experiment dir (no run dirs, "
                            "no mlflow.db, tensorboard/ or summary/ in it)")
    return target


def find_target(path: str) -> Target:
    """The run (a dir holding run.json) or the experiment dir at ``path``."""
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise MsbridgeError(f"{path} is not a directory; give a run dir (it holds {RUN_JSON}) or an experiment dir")
    if os.path.isfile(os.path.join(path, RUN_JSON)):
        return _run_target(path)
    return _experiment_target(path)


def _request(url: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _mlflow_ids(api: str, experiment: str, run_id: Optional[str]) -> "tuple[str, Optional[str]]":
    """The MLflow experiment id, and the MLflow run id of msbridge's run ``run_id`` (None when not found)."""
    query = urllib.parse.urlencode({"experiment_name": experiment})
    exp_id = _request(f"{api}/experiments/get-by-name?{query}")["experiment"]["experiment_id"]
    if not run_id:
        return exp_id, None
    found = _request(f"{api}/runs/search", {"experiment_ids": [exp_id], "max_results": 1,
                                             "filter": f"tags.`{RUN_ID_TAG}` = '{run_id}'",
                                             "run_view_type": "ALL"}).get("runs", [])
    return exp_id, found[0]["info"]["run_id"] if found else None


def _share(api: str, exp_id: str, view: "tuple[str, str]", mode: str = "") -> str:
    """Write ``view`` (``(tag key, JSON)``) to the experiment, the way MLflow's Share button does; its page."""
    key, value = view
    _request(f"{api}/experiments/set-experiment-tag", {"experiment_id": exp_id, "key": key, "value": value})
    return view_page(exp_id, key, mode)


def _compared(api: str, exp_id: str) -> Optional["tuple[str, str]"]:
    """The experiment's runs as ``(params, tags)`` for ``compared_view`` (its sweep view, or None)."""
    runs = _request(f"{api}/runs/search", {"experiment_ids": [exp_id], "max_results": MAX_RUNS}).get("runs", [])
    pairs = [({p["key"]: p["value"] for p in run.get("data", {}).get("params", [])},
              {t["key"]: t["value"] for t in run.get("data", {}).get("tags", [])}) for run in runs]
    return compared_view(pairs)


def mlflow_pages(base_url: str, experiment: Optional[str], run_id: Optional[str],
                 charts: bool = False) -> Dict[str, str]:
    """Pages on the MLflow server at ``base_url``, in its model-training view: ``run`` (the run's page, else
    the experiment's runs; "/" if neither is found) and, with ``charts``, ``charts``: the runs' charts with the
    loss first. When the experiment holds two runs or more, also ``sweep``: the runs compared in a table, best
    first (``mlflow_tracker.run.view.sweep_view``), and ``charts`` is that view's charts (the objective against the swept
    params first). Each is a saved view written to the experiment as a tag.

    Example:
        >>> mlflow_pages("http://127.0.0.1:5000", "tiny-lm", "0ca42c...", charts=True)["charts"]
        '/#/experiments/1/runs?viewStateShareKey=msbridge-e36a...&compareRunsMode=CHART&workflowType=machine_learning'
    """
    if not experiment:
        return {"run": "/"}
    api = base_url.rstrip("/") + "/api/2.0/mlflow"
    try:
        exp_id, mlflow_run = _mlflow_ids(api, experiment, run_id)
        runs = f"/#/experiments/{exp_id}/runs"
        run_page = f"{runs}/{mlflow_run}" if mlflow_run else runs
        pages = {"run": f"{run_page}?{MODEL_TRAINING_QUERY}"}
        if charts:
            sweep = _compared(api, exp_id)
            if sweep is None:
                pages["charts"] = _share(api, exp_id, loss_first_view(mlflow_run), "CHART")
            else:
                pages["sweep"] = _share(api, exp_id, sweep, "TABLE")
                pages["charts"] = _share(api, exp_id, sweep, "CHART")
        return pages
    except (OSError, ValueError, KeyError):
        return {"run": "/"}


def optuna_page(base_url: str, study: Optional[str]) -> str:
    """optuna-dashboard's page of ``study`` (found by name in its ``/api/studies``); its list of studies else."""
    try:
        studies = _request(base_url + "/api/studies")["study_summaries"]
        found = [s["study_id"] for s in studies if s.get("study_name") == study]
    except (OSError, ValueError, KeyError, TypeError):
        found = []
    return f"/dashboard/studies/{found[0]}" if found else "/dashboard"


def recorded_names(run_dir: Optional[str], lines: int = 5) -> List[str]:
    """The metric names of the first metrics line of a run's rank 0 log (the first ``lines`` lines only)."""
    if run_dir is None:
        return []
    try:
        with open(rank_file(run_dir, 0), encoding="utf-8") as fh:
            for _, line in zip(range(lines), fh):
                record = json.loads(line)
                if record.get("type") == "metrics":
                    return list(record.get("values") or {})
    except (OSError, ValueError, TypeError):
        pass
    return []


def tensorboard_page(names: Sequence[str] = ()) -> str:
    """TensorBoard's Time Series with the training curves pinned above every group (its ``pinnedCards`` query;
    it sorts its groups by name otherwise: health and hparams before train): those of ``TENSORBOARD_PINNED``
    the run records, or the loss when that is not known."""
    tags = [tag for tag in TENSORBOARD_PINNED if tag in names] or [LOSS]
    cards = [{"plugin": "scalars", "tag": tag} for tag in tags]
    return "/?" + urllib.parse.urlencode({"pinnedCards": json.dumps(cards, separators=(",", ":"))}) + "#timeseries"


def _line(name: str, text: str) -> None:
    print(f"  {name:<13}: {text}", flush=True)


def _store_exists(name: str, store: str) -> bool:
    if name in ("mlflow", "optuna") and "://" in store:
        return not store.startswith("sqlite:///") or os.path.isfile(store[len("sqlite:///"):])
    return os.path.isdir(store)


def _viewer(name: str, target: Target, scratch: str, build: bool = False) -> "Viewer | str | None":
    """The server for ``name``; the URL of a tracking server the run used (printed); else None, said why."""
    store = target.stores.get(name)
    if store is None:
        _line(name, f"not started: {target.path} has no {name} sink")
        return None
    if name == "mlflow" and store.startswith(("http://", "https://")):
        url = mask_text(store.rstrip("/") + mlflow_pages(store, target.experiment, target.run_id)["run"])
        _line(name, f"{url} (the run's tracking server; nothing started)")
        return url
    if not _store_exists(name, store):
        _line(name, f"not started: nothing was recorded at {mask_text(store)}")
        return None
    if name == "mlflow":
        return mlflow_viewer(store, scratch)
    if name == "optuna":
        viewer = optuna_viewer(store, scratch)
        if viewer is None:
            _line(name, OPTUNA_MISSING)
        return viewer
    if name == "tensorboard":
        viewer = tensorboard_viewer(store, scratch)
        viewer.page = tensorboard_page(recorded_names(target.run_dir))
        return viewer
    venv = mindinsight_venv() or (build_mindinsight() if build else None)
    if venv is None:
        _line(name, mindinsight_missing(build_failed=build))
        return None
    return mindinsight_viewer(venv, store, scratch, target.pages.get("mindinsight", "/"))


class _Stop:
    """A signal handler that only notes the signal: the main loop stops the servers."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signum = signum


def _start(viewer: Viewer, store: str) -> None:
    """Start ``viewer``, saying first what it is, its address and what it reads: one line."""
    _line(viewer.name, f"starting {SERVERS.get(viewer.name, viewer.name)} on {viewer.base_url} for "
                       f"{mask_text(store)}; its page follows when it answers")
    viewer.start()


def _wait_ready(viewers: List[Viewer], target: Target, stop: _Stop, timeout: float) -> List[Viewer]:
    """Print each viewer's URL as it answers, with how long it took; the ones that did."""
    pending, ready = list(viewers), []
    began = time.monotonic()
    deadline = began + timeout
    while pending and stop.signum is None:
        for viewer in list(pending):
            state = viewer.poll_ready()
            if state is None and time.monotonic() < deadline:
                continue
            pending.remove(viewer)
            if state:
                pages = {}
                if viewer.name == "mlflow":
                    pages = mlflow_pages(viewer.base_url, target.experiment, target.run_id, charts=True)
                    viewer.page = pages.get("sweep", pages.get("charts", pages["run"]))
                if viewer.name == "optuna":
                    viewer.page = optuna_page(viewer.base_url, target.study)
                _line(viewer.name, f"{viewer.url} {ANSWERED.format(time.monotonic() - began)}")
                for name in [n for n in ("charts", "run") if n in pages and pages[n] != viewer.page]:
                    _line(f"mlflow {name}", viewer.base_url + pages[name])
                ready.append(viewer)
            elif state is False:
                _line(viewer.name, f"did not start ({viewer.exit_text()})")
            else:
                _line(viewer.name, f"did not answer within {timeout:.0f} s ({viewer.exit_text()})")
                viewer.terminate()
        time.sleep(0.2)
    return ready


def _serve(viewers: List[Viewer], stop: _Stop) -> int:
    """Wait for a stop signal; 0 then, 1 if every server ended on its own first."""
    print("[msbridge] serving on 127.0.0.1 only; Ctrl-C stops them", flush=True)
    running = list(viewers)
    while stop.signum is None:
        for viewer in [v for v in running if not v.alive()]:
            running.remove(viewer)
            _line(viewer.name, f"stopped on its own ({viewer.exit_text()})")
        if not running:
            return 1
        time.sleep(0.5)
    return 0


def _stop_all(viewers: List[Viewer]) -> None:
    for viewer in viewers:
        viewer.terminate()
    deadline = time.monotonic() + 10
    left = [viewer.name for viewer in viewers if not viewer.wait_gone(deadline)]
    if left:
        print(f"[msbridge] could not stop {', '.join(left)}: processes survived SIGKILL", flush=True)
    elif viewers:
        print(f"[msbridge] stopped {', '.join(viewer.name for viewer in viewers)}", flush=True)


def cmd_view(args: argparse.Namespace) -> int:
    """Start the viewers, print their URLs, wait for Ctrl-C, stop them all."""
    target = find_target(args.path)
    if isinstance(args.optuna, str):  # --optuna URL: the study's storage (a sweep on PostgreSQL)
        target.stores["optuna"] = args.optuna
        target.study = target.study or target.experiment
    wanted = [name for name in VIEWERS if getattr(args, name)] or [name for name in VIEWERS if name in target.stores]
    if not wanted:
        raise MsbridgeError(f"{target.path} has no tracker to view (no mlflow, tensorboard or mindinsight sink, "
                            "no Optuna study); "
                            f"msbridge plot {target.path} draws its jsonl")
    stop = _Stop()
    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    scratch = tempfile.mkdtemp(prefix="msbridge-view-")
    started: List[Viewer] = []
    try:
        print(f"[msbridge] view {target.path}", flush=True)
        made = [_viewer(name, target, scratch, args.build_mindinsight) for name in wanted]
        for viewer in made:
            if isinstance(viewer, Viewer):
                _start(viewer, target.stores[viewer.name])
                started.append(viewer)
        ready = _wait_ready(started, target, stop, args.timeout) if started else []
        if stop.signum is not None:
            return 0
        if not ready:
            return 0 if not started and any(isinstance(v, str) for v in made) else 1
        return _serve(ready, stop)
    finally:
        _stop_all(started)
        shutil.rmtree(scratch, ignore_errors=True)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def add_view_command(sub: "argparse._SubParsersAction") -> None:
    """Register ``view`` on the ``msbridge`` subcommand parser.

    Example:
        >>> add_view_command(argparse.ArgumentParser().add_subparsers())
    """
    view = sub.add_parser("view", help="start a run's viewers (MLflow, TensorBoard, MindInsight, optuna-dashboard) "
                                       "on 127.0.0.1 "
                                       "and print their URLs; Ctrl-C stops them")
    view.add_argument("path", help="a run dir (it holds run.json) or an experiment dir")
    for name in VIEWED_SINKS:
        view.add_argument(f"--{name}", action="store_true", help=f"start {name} (default: every viewer the run has)")
    view.add_argument("--optuna", nargs="?", const=True, default=False, metavar="STORAGE",
                      help="start optuna-dashboard on the sweep's study (pip install 'msbridge[sweep]'); STORAGE: "
                           "its Optuna storage when not the experiment dir's optuna.db, e.g. postgresql://...")
    view.add_argument("--build-mindinsight", action="store_true",
                      help="build MindInsight's venv first when it is missing (bash .ci/mindinsight_venv.sh)")
    view.add_argument("--timeout", type=float, default=180.0,
                      help="seconds each viewer may take to answer before it is given up (default 180)")
    view.set_defaults(func=cmd_view)

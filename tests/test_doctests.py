"""Every docstring example in msbridge runs as a doctest, so an example cannot go stale unnoticed.

The modules are discovered (every ``.py`` file of ``msbridge/`` and ``adapters/`` that holds a ``>>>``), never
listed by hand: a new module's examples run the day it is added. An example that cannot run here is named in
``SKIP`` with the reason; a ``SKIP`` entry that names no example fails, so the list cannot outlive its reasons.
"""
from __future__ import annotations

import doctest
import importlib
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Where each importable package's files are (``adapters/`` is installed as ``msbridge.adapters``).
PACKAGES = {"msbridge": ROOT / "msbridge", "msbridge.adapters": ROOT / "adapters"}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# Why an example does not run here (each SKIP entry names one of these).
TRAINS = "trains or builds a MindSpore network (a model, data, a compiled step): that module's own tests run it"
LIVE_RUN = "a sketch of a call inside a live run: it names objects only a run has (a window, a run, a dispatcher)"
RUN_DIR = "reads a run directory or an MLflow store that only a real run leaves"
WRITES_OUTSIDE = "writes under an absolute path (/runs, /tmp/...) outside the test's own directory"
STARTS_PROCESS = "starts a server, a child process or a thread that outlives the example"
DISTRIBUTED = "needs the ranks of a distributed job (mindspore.communication, msrun)"
DEVICE = "needs an Ascend device or npu-smi"
MINDFORMERS = "needs mindformers' Trainer, a model or its callbacks"
THIS_PROCESS = "changes the test process itself (its signal handlers, the msbridge logger)"
MACHINE = "prints a figure of this machine and moment (CPU seconds, RSS, the time)"
YAML_FILE = "reads a YAML file that the example does not write"
YAML_LINES = "YAML after >>> (a config sketch, not Python)"
SERVER = "asks a running server (MLflow at 127.0.0.1:5000)"
GUIDE = "names the extension guide's own classes (docs/extending.md: tests/docs runs them)"

#: Doctest name -> why its examples do not run here. A name is a module (its own docstring), a
#: ``module.Qualified.name``, or ``module.*`` (every example in the module).
SKIP: Dict[str, str] = {
    "msbridge": TRAINS,
    "msbridge.adapters._diskwait": WRITES_OUTSIDE,
    "msbridge.adapters._diskwait.WaitsForSpace": LIVE_RUN,
    "msbridge.adapters.mlflow_tracker.client.process": STARTS_PROCESS,
    "msbridge.adapters.mlflow_tracker.store.rows.*": RUN_DIR,
    "msbridge.adapters.mlflow_tracker.store.local": RUN_DIR,
    "msbridge.adapters.mlflow_tracker.run.models": LIVE_RUN,
    "msbridge.adapters.mlflow_tracker.run.sweep": LIVE_RUN,
    "msbridge.adapters._tensorboard_files": WRITES_OUTSIDE,
    "msbridge.adapters.jsonl_sink": LIVE_RUN,
    "msbridge.adapters.jsonl_sink.JsonlSink": YAML_LINES,
    "msbridge.adapters.mindinsight_sink": LIVE_RUN,
    "msbridge.adapters.mindinsight_sink.MindInsightSink": YAML_LINES,
    "msbridge.adapters.mlflow_sink": YAML_LINES,
    "msbridge.adapters.mlflow_sink.MlflowSink": LIVE_RUN,
    "msbridge.adapters.tensorboard_sink": LIVE_RUN,
    "msbridge.adapters.tensorboard_sink.TensorBoardSink": TRAINS,
    "msbridge.alerts.delivery.*": STARTS_PROCESS,
    "msbridge.alerts.outbox": WRITES_OUTSIDE,
    "msbridge.alerts.sink.*": LIVE_RUN,
    "msbridge.bench.costs": LIVE_RUN,
    "msbridge.bench.hookclock.*": TRAINS,
    "msbridge.bench.peers.*": TRAINS,
    "msbridge.bench.probes": MACHINE,
    "msbridge.bench.sidebyside": LIVE_RUN,
    "msbridge.bench.servers.*": STARTS_PROCESS,
    "msbridge.callback.*": TRAINS,
    "msbridge.capture.budget": LIVE_RUN,
    "msbridge.capture.cb_params": LIVE_RUN,
    "msbridge.capture.checkpoints": LIVE_RUN,
    "msbridge.capture.collective.*": DISTRIBUTED,
    "msbridge.capture.histograms": TRAINS,
    "msbridge.capture.histograms.ParamHistograms": TRAINS,
    "msbridge.capture.host_buffer": TRAINS,
    "msbridge.capture.host_buffer.StepBuffer": TRAINS,
    "msbridge.capture.internals.*": TRAINS,
    "msbridge.capture.lr": TRAINS,
    "msbridge.capture.memory": DEVICE,
    "msbridge.capture.memory.MemoryReader": MACHINE,
    "msbridge.capture.npu_smi": DEVICE,
    "msbridge.capture.param_norms.*": TRAINS,
    "msbridge.capture.ring_cell.*": TRAINS,
    "msbridge.capture.ring_reader.*": TRAINS,
    "msbridge.capture.system_sampler": DEVICE,
    "msbridge.capture.train_step.*": TRAINS,
    "msbridge.capture.window.StepSource": TRAINS,
    "msbridge.cli.view.Target": RUN_DIR,
    "msbridge.cli.view.mlflow_pages": SERVER,
    "msbridge.cli.viewers": STARTS_PROCESS,
    "msbridge.config.compose": YAML_FILE,
    "msbridge.config.keys.Provenance": YAML_FILE,
    "msbridge.config.load.load_config": YAML_FILE,
    "msbridge.config.mindformers_check": LIVE_RUN,
    "msbridge.config.mindformers_entry": LIVE_RUN,
    "msbridge.config.prepare": YAML_FILE,
    "msbridge.demo": TRAINS,
    "msbridge.eval_hooks.*": LIVE_RUN,
    "msbridge.functional.*": TRAINS,
    "msbridge.health.detectors.grad_norm_spike": LIVE_RUN,
    "msbridge.health.detectors.loss_spike": LIVE_RUN,
    "msbridge.health.detectors.plateau": LIVE_RUN,
    "msbridge.health.detectors.throughput_drop": LIVE_RUN,
    "msbridge.health.runner": LIVE_RUN,
    "msbridge.health.runner.Verdict": LIVE_RUN,
    "msbridge.masking.MaskingFilter": THIS_PROCESS,
    "msbridge.metrics.cross_rank": LIVE_RUN,
    "msbridge.metrics.cross_rank.Agreement": LIVE_RUN,
    "msbridge.metrics.cross_rank.Reducer": LIVE_RUN,
    "msbridge.metrics.cross_rank.make_reducer": LIVE_RUN,
    "msbridge.metrics.rank_health": LIVE_RUN,
    "msbridge.metrics.rank_health.Blame": LIVE_RUN,
    "msbridge.metrics.rank_timing": LIVE_RUN,
    "msbridge.metrics.rank_timing.StepTimer": LIVE_RUN,
    "msbridge.metrics.rank_timing.StragglerWatch": LIVE_RUN,
    "msbridge.metrics.spread.OutlierWatch": LIVE_RUN,
    "msbridge.mindformers.attention.*": MINDFORMERS,
    "msbridge.mindformers.evaluation": MINDFORMERS,
    "msbridge.mindformers.forward": MINDFORMERS,
    "msbridge.mindformers.monitor.*": MINDFORMERS,
    "msbridge.mindformers.pipeline": MINDFORMERS,
    "msbridge.mindformers.pynative": MINDFORMERS,
    "msbridge.mindformers.registration": MINDFORMERS,
    "msbridge.mindformers.ring_wrapper.*": MINDFORMERS,
    "msbridge.offline.compare": RUN_DIR,
    "msbridge.offline.diagnose.*": RUN_DIR,
    "msbridge.offline.diagnose_dist": RUN_DIR,
    "msbridge.offline.diagnose_perf": RUN_DIR,
    "msbridge.offline.layer_norms": RUN_DIR,
    "msbridge.offline.plot.*": RUN_DIR,
    "msbridge.offline.replay": RUN_DIR,
    "msbridge.offline.report": RUN_DIR,
    "msbridge.offline.report.Report": LIVE_RUN,
    "msbridge.offline.series": RUN_DIR,
    "msbridge.run.metadata": LIVE_RUN,
    "msbridge.run.outcome.RunOutcome": LIVE_RUN,
    "msbridge.run.plan": LIVE_RUN,
    "msbridge.run.rank_sync.*": MACHINE,
    "msbridge.run.ranks": WRITES_OUTSIDE,
    "msbridge.run.signals": THIS_PROCESS,
    "msbridge.run.signals.SignalGuard": THIS_PROCESS,
    "msbridge.run.watchdog.*": LIVE_RUN,
    "msbridge.sinks.columns.*": RUN_DIR,
    "msbridge.sinks.dispatch.*": LIVE_RUN,
    "msbridge.sinks.runlog": RUN_DIR,
    "msbridge.sinks.runlog.read_from": RUN_DIR,
    "msbridge.sinks.host.*": LIVE_RUN,
    "msbridge.sinks.calls": LIVE_RUN,
    "msbridge.testing": GUIDE,
    "msbridge.testing.Driven": GUIDE,
    "msbridge.plugins": GUIDE,
}


def _modules() -> List[str]:
    found = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts or ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if package == "msbridge" and parts[:1] == ("adapters",):
                continue
            found.append(".".join((package, *parts)))
    return found


MODULES = _modules()


def _covers(key: str, name: str) -> bool:
    return name == key or (key.endswith(".*") and (name == key[:-2] or name.startswith(key[:-1])))


def _skip_reason(name: str) -> str:
    return next((why for key, why in SKIP.items() if _covers(key, name)), "")


def _doctests(module_name: str) -> List[doctest.DocTest]:
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(module, module_name) if t.examples and t.name.startswith(module_name)]


def test_the_modules_are_discovered():
    assert len(MODULES) > 50 and "msbridge.names" in MODULES and "msbridge.adapters.jsonl_sink" in MODULES


def test_every_skip_names_an_example():
    names = {t.name for m in MODULES for t in _doctests(m)}
    stale = [key for key in SKIP if not any(_covers(key, n) for n in names)]
    assert not stale, f"SKIP entries that name no docstring example (remove them): {stale}"


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name, tmp_path, monkeypatch):  # what an example registers: conftest.py
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    found = _doctests(module_name)
    tests = [t for t in found if not _skip_reason(t.name)]
    if not tests:
        reasons = "; ".join(sorted({_skip_reason(t.name) for t in found}))
        pytest.skip(f"every example of {module_name} is in SKIP: {reasons}")
    failed = _run(tests)
    assert not failed, "".join(failed)


def _run(tests: List[doctest.DocTest]) -> List[str]:
    """The failure reports of ``tests`` (none: every example printed what it shows)."""
    runner = doctest.DocTestRunner(optionflags=FLAGS, verbose=False)  # not from "-v" in sys.argv
    failed: List[str] = []
    for test in tests:
        result = runner.run(test, out=failed.append)
        assert result.attempted > 0, test.name
    return failed

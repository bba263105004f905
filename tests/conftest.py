"""Shared test setup: quiet MindSpore, keep the checkout clean."""
from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("GLOG_v", "3")
# `import mindformers` (at collection, in the checkout) creates ./output/log unless told where to log; one folder
# per pytest-xdist worker (PYTEST_XDIST_WORKER: gw0, gw1, gw2), never two processes rotating the same log files. A
# worker inherits the controller's LOG_MF_PATH, so ours is set again; one the user set is kept.
_MF_LOG = os.path.join(tempfile.gettempdir(), "msbridge-tests-mindformers-log")
if os.environ.get("LOG_MF_PATH", _MF_LOG).startswith(_MF_LOG):
    os.environ["LOG_MF_PATH"] = os.path.join(_MF_LOG, os.environ.get("PYTEST_XDIST_WORKER", "main"))

import msbridge  # noqa: E402,F401,I001  (first: it picks the protobuf runtime MindSpore needs)
import pytest  # noqa: E402
from helpers.alone import Turns  # noqa: E402


_TURNS = pytest.StashKey[Turns]()  # this worker's turns on the machine (tests/helpers/alone.py)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked ``alone`` has the machine to itself, its fixtures' setup and teardown
    included, and keeps it for a next test marked ``alone`` (tests/helpers/alone.py); every other test shares it
    with the other workers'."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    if _TURNS not in item.config.stash:
        shared = item.config._tmp_path_factory.getbasetemp().parent  # the controller's basetemp: gw0/.., gw1/..
        item.config.stash[_TURNS] = Turns(str(shared))
    with item.config.stash[_TURNS].test(_alone(item), next_alone=nextitem is not None and _alone(nextitem)):
        yield


def _alone(item):
    return item.get_closest_marker("alone") is not None


@pytest.fixture(scope="session")
def mlflow_store_template(tmp_path_factory):
    """MLflow's store template in the user's cache, made before a test starts CPU-bound processes: a machine's very
    first sqlite store is made by MLflow's own migrations (seconds of CPU, once per MLflow version,
    ``mlflow_tracker.store.template``), and the tests beside busy processes measure every later run. On a fresh
    machine (a clean CI cache), the first of them would otherwise pay for it."""
    from msbridge.adapters.mlflow_tracker.store.template import copy_template

    assert copy_template(str(tmp_path_factory.mktemp("template") / "mlflow.db"))


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """Every test runs in its own directory: nothing (./output/log, mlflow.db ...) lands in the checkout."""
    monkeypatch.chdir(tmp_path)
    yield


def _msbridges_own(cls):
    """A class msbridge's own modules define (not one an example defines in a copy of their namespace)."""
    module = sys.modules.get(cls.__module__)
    return cls.__module__.startswith("msbridge.") and getattr(module, cls.__qualname__, None) is cls


@pytest.fixture(autouse=True)
def _plugins_forgotten():
    """What a test registers (a plug-in it installs, an example's sink or check) is gone after it, and so is what
    loading plug-ins said: the next test sees only msbridge's own. msbridge's own stay registered, even those first
    imported during the test (their decorator runs once per process)."""
    from msbridge import plugins
    from msbridge.health.detectors.base import DETECTORS
    from msbridge.sinks import registry

    tables = (registry._REGISTERED, DETECTORS)
    before = [dict(table) for table in tables]
    said, failed = set(plugins._SAID), dict(plugins._FAILED)
    yield
    for table, saved in zip(tables, before):
        for name, cls in list(table.items()):
            if saved.get(name) is not cls and not _msbridges_own(cls):
                del table[name]
        table.update({name: cls for name, cls in saved.items() if name not in table})
    plugins._SAID.clear()
    plugins._SAID.update(said)
    plugins._FAILED.clear()
    plugins._FAILED.update(failed)


@pytest.fixture
def persistent(monkeypatch, tmp_path):
    """Treat the test's tmp dir as a persistent disk (it is under /tmp, which msbridge warns about)."""
    from msbridge.config import directories as pathcheck

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\n")
    monkeypatch.setattr(pathcheck, "VOLATILE_ROOTS", ())
    monkeypatch.setattr(pathcheck, "MOUNTS_FILE", str(mounts))
    return mounts

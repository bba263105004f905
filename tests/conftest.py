"""Shared test setup: quiet MindSpore, keep the checkout clean."""
from __future__ import annotations

import os
import tempfile

os.environ.setdefault("GLOG_v", "3")
# `import mindformers` (at collection, in the checkout) creates ./output/log unless told where to log.
os.environ.setdefault("LOG_MF_PATH", os.path.join(tempfile.gettempdir(), "msbridge-tests-mindformers-log"))

import msbridge  # noqa: E402,F401,I001  (first: it picks the protobuf runtime MindSpore needs)
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """Every test runs in its own directory: nothing (./output/log, mlflow.db ...) lands in the checkout."""
    monkeypatch.chdir(tmp_path)
    yield


@pytest.fixture
def persistent(monkeypatch, tmp_path):
    """Treat the test's tmp dir as a persistent disk (it is under /tmp, which msbridge warns about)."""
    from msbridge.config import directories as pathcheck

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\n")
    monkeypatch.setattr(pathcheck, "VOLATILE_ROOTS", ())
    monkeypatch.setattr(pathcheck, "MOUNTS_FILE", str(mounts))
    return mounts

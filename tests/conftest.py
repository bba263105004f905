"""Shared test setup: quiet MindSpore, keep the checkout clean."""
from __future__ import annotations

import os

os.environ.setdefault("GLOG_v", "3")

import msbridge  # noqa: E402,F401  (first: it picks the protobuf runtime MindSpore needs)
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """Every test runs in its own directory: nothing (./output/log, mlflow.db ...) lands in the checkout."""
    monkeypatch.chdir(tmp_path)
    yield

"""A throwaway PostgreSQL cluster and an ``mlflow server`` on it, as pytest fixtures.

Import the fixtures into a test module (``from helpers.postgres import pg_mlflow, postgres``).
The cluster (``msbridge.bench.servers.PostgresCluster``: ``initdb`` in a temp dir, 127.0.0.1 only,
a free port, as the ``postgres`` user when the tests run as root) is one per test session; each
module that asks for ``pg_mlflow`` gets a database and a server of its own, stopped after it.
Without PostgreSQL installed (``bash .ci/postgres.sh``) the tests that need it are skipped, and
fail under CI (``CI`` set), where ``.ci/run`` installs it.

Example:
    >>> def test_x(pg_mlflow):
    ...     MlflowClient(pg_mlflow.uri).search_experiments()
"""
from __future__ import annotations

import itertools
import os

import pytest

from msbridge.bench.servers import MlflowServer, PostgresCluster, postgres_bindir

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def postgres():
    """A running ``PostgresCluster``, stopped (and its directory removed) at the end of the session."""
    if postgres_bindir() is None:
        message = "PostgreSQL is not installed: bash .ci/postgres.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with PostgresCluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pg_mlflow(postgres, tmp_path_factory):
    """``mlflow server --backend-store-uri postgresql+psycopg://...`` on a database of this module's."""
    database = postgres.create_database(f"mlflow_{next(_databases)}")
    with MlflowServer(str(tmp_path_factory.mktemp("mlflow-pg")), backend_uri=database) as server:
        yield server

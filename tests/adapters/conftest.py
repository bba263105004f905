"""Fixtures the MLflow adapter's test files share."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def shared_sqlite(tmp_path_factory):
    """One sqlite store for the module: creating its tables takes seconds."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow-sqlite')}/mlflow.db"
    MlflowClient(uri).search_experiments()  # creates the tables
    return uri

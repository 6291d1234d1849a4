"""Fixtures of the tracker tests: an MLflow store whose tables are made once per session (MLflow takes 5 to
15 s to make them on 2 busy cores), copied for each test that needs a store of its own."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory):
    mlflow = pytest.importorskip("mlflow")
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # makes the tables
    return path


@pytest.fixture
def mlflow_store(mlflow_template, tmp_path):
    """A fresh, empty MLflow store of this test's own: its tracking URI."""
    path = tmp_path / "store" / "mlflow.db"
    path.parent.mkdir()
    shutil.copyfile(mlflow_template, path)
    return f"sqlite:///{path}"

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


@pytest.fixture(autouse=True)
def no_user_settings(monkeypatch, tmp_path):
    """No tracker setting of the machine's environment reaches a test; wandb's own files go under the test's folder."""
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_ENTITY",
                 "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))  # wandb-core's own debug logs
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))

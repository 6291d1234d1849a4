"""A tracker whose store fails mid-run: the call raises an ordinary Exception (the caller warns once and drops
the tracker), never a process exit and never a hang. Each case runs in a process of its own whose files may
not grow past what they hold (RLIMIT_FSIZE 0, as a full disk or a quota: a write fails with EFBIG)."""

from __future__ import annotations

import pytest
from helpers.trackers import attempt

from vit_train.trackers.base import reason

pytest.importorskip("mlflow")
pytest.importorskip("wandb")




def test_mlflow_store_full_raises_from_log(tmp_path, mlflow_store):
    code, out = attempt({"tracker": "mlflow", "settings": {"tracking_uri": mlflow_store},
                         "run_dir": str(tmp_path / "run"), "first": 1, "last": 3, "end": "full_log"}, timeout=180)
    assert code == 0, out  # the process went on after the failed calls
    assert out["log"]["raised"][:2] == ["MlflowException", "Exception"], out
    assert "disk I/O error" in out["log"]["message"] or "database or disk is full" in out["log"]["message"]
    assert out["close"]["raised"] is not None and "Exception" in out["close"]["raised"]


def test_wandb_store_full_raises(tmp_path):
    code, out = attempt({"tracker": "wandb", "run_dir": str(tmp_path / "run"), "first": 1, "last": 3,
                         "end": "full_log"}, timeout=180)
    assert code == 0, out
    raised = [c for c in (out["log"]["raised"], out["close"]["raised"]) if c is not None]
    assert raised != [] and all("Exception" in classes for classes in raised), out


def test_wandb_files_unwritten_are_found_at_close(tmp_path):
    """W&B's core process drops rows it cannot write without telling `log()` (measured: every call returns, the
    file holds its header only); `close` reads the files back and raises."""
    code, out = attempt({"tracker": "wandb", "run_dir": str(tmp_path / "run"), "first": 1, "last": 3,
                         "end": "core_full"}, timeout=180)
    assert code == 0, out
    assert out["log"]["raised"] is None
    assert out["close"]["raised"][:3] == ["OSError", "Exception", "BaseException"], out
    assert "hold 0 of the 7 rows this attempt sent (the first missing: train at step 1)" in out["close"]["message"]


def test_wandb_core_process_gone_raises_from_log(tmp_path):
    """wandb raises ConnectionResetError or its MailboxClosedError, whichever notices first: both Exceptions."""
    code, out = attempt({"tracker": "wandb", "run_dir": str(tmp_path / "run"), "first": 1, "last": 3,
                         "end": "core_dead"}, timeout=180)
    assert code == 0, out
    assert "Exception" in out["log"]["raised"], out
    assert out["close"]["raised"] is not None and "Exception" in out["close"]["raised"]


def test_reason_names_the_full_disk_on_one_line():
    from sqlalchemy.exc import OperationalError

    try:
        try:
            import sqlite3

            raise sqlite3.OperationalError("disk I/O error")
        except Exception as inner:
            raise OperationalError("INSERT INTO metrics ...", {}, inner) from inner
    except Exception as error:
        assert reason(error) == "OperationalError: disk I/O error"


def test_mlflow_server_unreachable_raises_from_start(tmp_path, monkeypatch):
    """A tracking URI nobody answers: an MlflowException once MLflow's retries are spent (set to none here; by
    default 7 with backoff, minutes: docs/logging.md)."""
    import socket

    from helpers.trackers import make_start, make_tracker

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed again below: nothing listens there
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    tracker = make_tracker("mlflow", tracking_uri=f"http://127.0.0.1:{port}")
    with pytest.raises(Exception) as failed:  # noqa: B017 (the kind is what the test asks: an Exception, not an exit)
        tracker.start(make_start(tmp_path))
    assert type(failed.value).__name__ == "MlflowException"
    assert reason(failed.value) == "ConnectionRefusedError: [Errno 111] Connection refused"

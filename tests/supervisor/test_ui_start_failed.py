"""Issue 40.1 in the web UI: a model whose port is held by another process shows its
state ``start_failed`` and the error naming the port and the holder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mortred_twisted.http.supervisor_api import STATIC

from .test_ui_node import CATALOG, run_ui

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")

ERROR = (
    "cannot listen on 127.0.0.1:18121: address in use by pid 4242: "
    "python3 -m http.server 18121; not started"
)


def test_the_status_table_shows_start_failed_with_its_error(tmp_path: Path) -> None:
    status = {
        "servers": [
            {"id": "FAKE_ASYNC", "kind": "model", "category": "fake", "state": "start_failed",
             "ready": False, "pid": None, "restart_count": 0, "last_exit": None,
             "error": ERROR},
        ]
    }  # fmt: skip
    ui = run_ui(
        tmp_path,
        {
            "GET /api/v1/status": {"status": 200, "body": status},
            "GET /api/v1/catalog": {"status": 200, "body": CATALOG},
        },
    )
    row = next(r["text"] for r in ui["rows"] if r["id"] == "FAKE_ASYNC")
    assert row[1] == "start_failed" and row[2] == "no" and row[5] == ERROR
    css = (STATIC / "style.css").read_text()
    assert ".state-start_failed" in css  # drawn like failed

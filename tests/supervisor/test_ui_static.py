"""The web UI ships as plain static files: present, linked, and syntactically valid JS."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from mortred_twisted.http.supervisor_api import STATIC


def test_index_links_existing_assets() -> None:
    """Every /ui/ asset index.html references is shipped."""
    html = (STATIC / "index.html").read_text()
    assets = re.findall(r'(?:src|href)="/ui/([^"]+)"', html)
    assert set(assets) == {"app.js", "style.css"}
    for name in assets:
        assert (STATIC / name).is_file()


def test_ui_has_the_panels_the_api_serves() -> None:
    """The page holds the servers, logs and try-it panels, and app.js calls the API."""
    html = (STATIC / "index.html").read_text()
    for element in ('id="servers"', 'id="logs"', 'id="try-form"', 'id="try-mode"'):
        assert element in html
    js = (STATIC / "app.js").read_text()
    for path in ("/api/v1/status", "/api/v1/catalog", "/api/v1/infer", "/logs?"):
        assert path in js


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_app_js_parses() -> None:
    """app.js is valid JavaScript (node --check)."""
    subprocess.run(["node", "--check", str(STATIC / "app.js")], check=True)


def test_jobs_page_is_wired_and_never_parses_server_html() -> None:
    """The jobs panel exists, app.js uses the jobs routes, and nothing in app.js turns
    strings into HTML or puts the token in a URL."""
    html = (STATIC / "index.html").read_text()
    for element in ('id="jobs-model"', 'id="jobs-list"', 'id="jobs-form"', 'id="jobs-output"'):
        assert element in html
    js = (STATIC / "app.js").read_text()
    for needle in ('"/events"', '"DELETE"', "getReader()", "text/event-stream"):
        assert needle in js
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "new EventSource",
    ):
        assert sink not in js, sink
    assert "token=${" not in js and "?token=" not in js

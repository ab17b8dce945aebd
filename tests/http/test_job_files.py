"""``GET /jobs/{id}/files/{name}`` in memory (issue 26 item 3): an SDK job's result
names its files by URL and the route serves them (type, length, ETag, 304, ranges,
416, retention in Cache-Control, 404/409); ``Prefer: return=inline`` and
``output_files = "inline"`` put them inline instead; the sync path stays inline."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from typing import Any

import pytest
from twisted.internet.defer import maybeDeferred
from twisted.internet.task import Clock

from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.job_files import Unsatisfiable, parse_range, prefers_inline
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.registry import create_model
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads
from tests.support.memory_http import MemoryClient

MODEL = "tests.e2e.sdk_models.files_model:Pack"


def make_app(**server: Any) -> tuple[ModelServerApp, Clock, HandThreads, MemoryClient]:
    doc = {
        "server": {"id": "F", "worker_nums": 1, "async_enabled": True, **server},
        "model": {"type": MODEL},
    }
    config = build_server_config(doc, env={})
    clock, threads = Clock(), HandThreads()
    runtime = ModelRuntime(
        config, clock=clock, threads=threads, metrics=ServerMetrics(), build_model=create_model,
        io_threads=maybeDeferred,  # a failure is a failed Deferred, as from a thread
    )  # fmt: skip
    runtime.load_models()
    threads.step()
    app = ModelServerApp(runtime)
    return app, clock, threads, MemoryClient(ModelPortFactory.for_app(app, clock))


@pytest.fixture
def served() -> Any:
    app, clock, threads, stub = make_app()
    yield app, clock, threads, stub
    app.runtime.close_store()


def call(
    stub: MemoryClient, method: str, url: str, body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, bytes]:  # fmt: skip
    kwargs: dict[str, Any] = {"headers": dict(headers or {})}
    if body is not None:
        kwargs["data"] = json.dumps(body).encode()
        kwargs["headers"]["Content-Type"] = "application/json"
    d = stub.request(method, "http://localhost" + url, **kwargs)
    stub.flush()
    responses: list = []
    d.addCallback(responses.append)
    assert responses, f"{method} {url} did not answer"
    content: list = []
    responses[0].content().addCallback(content.append)
    stub.flush()
    return responses[0].code, responses[0].headers, content[0]


def run_job(
    app: ModelServerApp, clock: Clock, threads: HandThreads, stub: MemoryClient,
    params: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """Submit, run and read the result of one job: (job id, the result's data)."""
    code, _h, body = call(stub, "POST", "/jobs", {"params": params or {}}, headers)
    assert code == 202, body
    job = json.loads(body)["job_id"]
    clock.advance(0)
    clock.advance(0)
    threads.drain()
    clock.advance(0)
    code, _h, body = call(stub, "GET", f"/jobs/{job}/result")
    assert code == 200, body
    return job, json.loads(body)["data"]


def header(headers: Any, name: str) -> str | None:
    values = headers.getRawHeaders(name)
    return values[0] if values else None


def test_a_jobs_files_are_named_by_url_and_served(served: Any) -> None:
    """The result names each file by URL with its type, size and sha256; the route
    answers its bytes with Content-Type, Content-Length, the sha256 ETag and a
    Cache-Control no longer than the job's retention."""
    app, clock, threads, stub = served
    job, data = run_job(app, clock, threads, stub, {"n": 2, "size": 50})
    assert data["count"] == 2
    picture = data["picture"]
    assert picture["url"] == f"/jobs/{job}/files/picture.png"
    assert "base64" not in picture
    assert [n["url"] for n in data["notes"]] == [
        f"/jobs/{job}/files/notes-0.txt",
        f"/jobs/{job}/files/notes-1.txt",
    ]
    code, headers, body = call(stub, "GET", picture["url"])
    assert code == 200
    assert body.startswith(b"\x89PNG") and len(body) == picture["size"]
    assert hashlib.sha256(body).hexdigest() == picture["sha256"]
    assert header(headers, "Content-Type") == "image/png"
    assert header(headers, "Content-Length") == str(len(body))
    assert header(headers, "ETag") == f'"{picture["sha256"]}"'
    assert header(headers, "Accept-Ranges") == "bytes"
    cache = header(headers, "Cache-Control")
    assert cache is not None and cache.startswith("private, max-age=")
    assert 0 < int(cache.rsplit("=", 1)[1]) <= app.config.async_job_ttl // 1000
    code, _h, note = call(stub, "GET", data["notes"][1]["url"])
    assert code == 200 and note == (b"note 1 " * 50)[:50]


def test_if_none_match_and_ranges(served: Any) -> None:
    """A matching If-None-Match is a 304; single ranges are 206 with Content-Range
    (an end past the file is cut); a start past the end is 416; several ranges or an
    If-Range naming another version give the whole file."""
    app, clock, threads, stub = served
    _job, data = run_job(app, clock, threads, stub, {"n": 1, "size": 100})
    note = data["notes"][0]
    url, etag = note["url"], f'"{note["sha256"]}"'
    whole = (b"note 0 " * 100)[:100]
    code, _h, body = call(stub, "GET", url, headers={"If-None-Match": etag})
    assert (code, body) == (304, b"")
    code, _h, _b = call(stub, "GET", url, headers={"If-None-Match": '"other"'})
    assert code == 200
    cases = {
        "bytes=0-9": (206, whole[:10], "bytes 0-9/100"),
        "bytes=90-": (206, whole[90:], "bytes 90-99/100"),
        "bytes=-5": (206, whole[95:], "bytes 95-99/100"),
        "bytes=95-99999999999999999": (206, whole[95:], "bytes 95-99/100"),
        "bytes=0-1,5-6": (200, whole, None),
    }
    for value, (status, expected, content_range) in cases.items():
        code, headers, body = call(stub, "GET", url, headers={"Range": value})
        assert (code, body) == (status, expected), value
        assert header(headers, "Content-Range") == content_range, value
        assert header(headers, "Content-Length") == str(len(expected)), value
    code, headers, _b = call(stub, "GET", url, headers={"Range": "bytes=100-"})
    assert code == 416 and header(headers, "Content-Range") == "bytes */100"
    code, _h, body = call(stub, "GET", url, headers={"Range": "bytes=0-9", "If-Range": '"x"'})
    assert (code, body) == (200, whole)


def test_unknown_files_jobs_and_unfinished_jobs(served: Any) -> None:
    """An unknown name or job is a 404; a job not done yet is a 409."""
    app, clock, threads, stub = served
    job, _data = run_job(app, clock, threads, stub)
    assert call(stub, "GET", f"/jobs/{job}/files/nope.png")[0] == 404
    assert call(stub, "GET", "/jobs/job_0000/files/picture.png")[0] == 404
    code, _h, body = call(stub, "POST", "/jobs", {"params": {}})
    pending = json.loads(body)["job_id"]
    code, _h, body = call(stub, "GET", f"/jobs/{pending}/files/picture.png")
    assert code == 409, body


def test_prefer_return_inline_puts_the_files_in_the_result(served: Any) -> None:
    """With ``Prefer: return=inline`` a job's files come back as base64, none stored."""
    app, clock, threads, stub = served
    job, data = run_job(app, clock, threads, stub, {"n": 1}, {"Prefer": "return=inline"})
    picture = data["picture"]
    assert "url" not in picture
    assert base64.b64decode(picture["base64"]).startswith(b"\x89PNG")
    assert not os.path.exists(os.path.join(app.runtime.result_files.root, job))


def test_output_files_inline_is_the_servers_choice() -> None:
    """``output_files = "inline"``: every job's files inline."""
    app, clock, threads, stub = make_app(output_files="inline")
    try:
        _job, data = run_job(app, clock, threads, stub, {"n": 1})
        assert "base64" in data["notes"][0] and "url" not in data["notes"][0]
    finally:
        app.runtime.close_store()


def test_the_sync_path_stays_inline(served: Any) -> None:
    """``POST /infer`` answers its files inline."""
    _app, clock, threads, stub = served
    d = stub.request(
        "POST", "http://localhost/infer", data=b'{"params": {"n": 1}}',
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    stub.flush()
    threads.drain()
    clock.advance(0)
    stub.flush()
    responses: list = []
    d.addCallback(responses.append)
    content: list = []
    responses[0].content().addCallback(content.append)
    stub.flush()
    data = json.loads(content[0])["data"]
    assert "base64" in data["picture"] and "url" not in data["picture"]


def test_the_private_root_goes_at_close(served: Any) -> None:
    """The memory store's result files live in the process's own directory, removed
    when the store closes."""
    app, clock, threads, stub = served
    run_job(app, clock, threads, stub)
    root = app.runtime.result_files.root
    assert os.listdir(root)
    app.runtime.close_store()
    assert not os.path.exists(root)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("bytes=0-0", (0, 0)), ("bytes=3-1", None), ("items=0-1", None),
     ("bytes=-", None), ("bytes=" + "9" * 30 + "-", None)],
)  # fmt: skip
def test_parse_range(value: str | None, expected: Any) -> None:
    """Ranges we do not read mean the whole file; nothing overflows."""
    assert parse_range(value, 10) == expected


def test_parse_range_unsatisfiable() -> None:
    """A start at or past the end, or a zero suffix, is unsatisfiable."""
    for value in ("bytes=10-", "bytes=-0", "bytes=99999999999999999-"):
        with pytest.raises(Unsatisfiable):
            parse_range(value, 10)


def test_prefers_inline() -> None:
    """``return=inline`` among other preferences counts; other values do not."""
    assert prefers_inline(b"return=inline")
    assert prefers_inline(b"respond-async, return=inline")
    assert not prefers_inline(b"return=minimal")
    assert not prefers_inline(None)


def test_maintain_removes_the_files_of_expired_jobs(served: Any) -> None:
    """Past async_job_ttl the job goes at the next upkeep, and its files with it."""
    app, clock, threads, stub = served
    job, data = run_job(app, clock, threads, stub)
    root = app.runtime.result_files.root
    assert os.listdir(root) == [job]
    clock.advance(app.config.async_job_ttl / 1000.0 + 1)
    app.runtime.maintain()
    assert os.listdir(root) == []
    assert call(stub, "GET", data["picture"]["url"])[0] == 404


def test_where_result_files_live(tmp_path: Any) -> None:
    """Memory store: a private directory (None here); Redis: <root>/var/results/<id>,
    or result_files_dir/<id> (each id its own, so sweeps never meet)."""
    from pathlib import Path

    def runtime(**server: Any) -> ModelRuntime:
        doc = {"server": {"id": "F", "async_enabled": True, **server}, "model": {"type": MODEL}}
        config = build_server_config(doc, env={}, root=tmp_path)
        return ModelRuntime(config, clock=Clock(), threads=HandThreads())

    assert runtime().result_files_dir() is None
    assert runtime(job_store="redis").result_files_dir() == Path(tmp_path) / "var/results/F"
    shared = runtime(job_store="redis", result_files_dir="shared").result_files_dir()
    assert shared == Path(tmp_path) / "shared/F"
    assert runtime(result_files_dir="shared").result_files_dir() == Path(tmp_path) / "shared/F"


def test_output_files_is_checked() -> None:
    """An unknown output_files value stops the server at load."""
    from mortred_twisted.config.errors import ConfigErrors

    with pytest.raises(ConfigErrors, match="output_files"):
        build_server_config({"server": {"id": "F", "output_files": "s3"}, "model": {}}, env={})


def test_preference_applied_says_prefer_return_inline_was_honoured(served: Any) -> None:
    """A submit with ``Prefer: return=inline`` is answered 202 with
    ``Preference-Applied: return=inline`` (RFC 7240); one without has none."""
    _app, _clock, _threads, stub = served
    prefer = {"Prefer": "respond-async, return=inline"}
    code, headers, _ = call(stub, "POST", "/jobs", {"params": {"n": 1}}, prefer)
    assert code == 202 and header(headers, "Preference-Applied") == "return=inline"
    code, headers, _ = call(stub, "POST", "/jobs", {"params": {"n": 1}})
    assert code == 202 and header(headers, "Preference-Applied") is None
    code, headers, _ = call(
        stub, "POST", "/jobs", {"params": {"n": 1}}, {"Prefer": "return=minimal"}
    )
    assert code == 202 and header(headers, "Preference-Applied") is None


def test_a_replay_reports_the_preference_its_job_was_admitted_with(served: Any) -> None:
    """The same Idempotency-Key and body with the same Prefer replays the job (and
    says the preference applies); with another Prefer it is a conflict (422), so a
    replay never claims a preference its job did not have."""
    _app, _clock, _threads, stub = served
    body = {"params": {"n": 1}}
    inline = {"Idempotency-Key": "k-inline", "Prefer": "return=inline"}
    code, _h, first = call(stub, "POST", "/jobs", body, inline)
    assert code == 202
    code, headers, again = call(stub, "POST", "/jobs", body, inline)
    assert code == 202 and header(headers, "Idempotent-Replayed") == "true"
    assert header(headers, "Preference-Applied") == "return=inline"
    assert json.loads(again)["job_id"] == json.loads(first)["job_id"]
    code, _h, refused = call(stub, "POST", "/jobs", body, {"Idempotency-Key": "k-inline"})
    assert code == 422, refused
    plain = {"Idempotency-Key": "k-plain"}
    assert call(stub, "POST", "/jobs", body, plain)[0] == 202
    code, _h, _ = call(stub, "POST", "/jobs", body, {**plain, "Prefer": "return=inline"})
    assert code == 422


def test_the_sync_path_reports_the_preference_applied(served: Any) -> None:
    """``POST /infer`` with ``Prefer: return=inline`` says it applied (it is always
    inline); without it, no header."""
    _app, clock, threads, stub = served
    for prefer, expected in (("return=inline", "return=inline"), (None, None)):
        headers = {"Content-Type": "application/json", **({"Prefer": prefer} if prefer else {})}
        d = stub.request(
            "POST", "http://localhost/infer", data=b'{"params": {"n": 1}}', headers=headers
        )
        stub.flush()
        threads.drain()
        clock.advance(0)
        stub.flush()
        responses: list = []
        d.addCallback(responses.append)
        assert responses[0].code == 200
        assert header(responses[0].headers, "Preference-Applied") == expected


def test_a_builtin_model_does_not_report_the_preference() -> None:
    """A built-in model has no result files: the preference changes nothing there
    and the 202 does not claim it applied."""
    config = build_server_config(
        {"server": {"id": "B", "worker_nums": 1, "async_enabled": True},
         "model": {"type": "fake"}}, env={},
    )  # fmt: skip
    clock, threads = Clock(), HandThreads()
    runtime = ModelRuntime(config, clock=clock, threads=threads, metrics=ServerMetrics())
    runtime.load_models()
    threads.step()
    stub = MemoryClient(ModelPortFactory.for_app(ModelServerApp(runtime), clock))
    body = {"images": [base64.b64encode(b"x").decode()]}
    code, headers, answer = call(stub, "POST", "/jobs", body, {"Prefer": "return=inline"})
    assert code == 202, answer
    assert header(headers, "Preference-Applied") is None


def test_the_gateway_forwards_prefer_on_a_submit_only() -> None:
    """Through the gateway a submit's (and a sync call's) ``Prefer`` reaches the
    model; a poll does not forward it."""
    from tests.gateway.test_gateway_app import AUTH, Harness

    h = Harness()
    prefer = {**AUTH, "Prefer": "return=inline"}
    assert h.call("POST", "/v1/models/ASYNC/jobs", headers=prefer, data=b"{}")[0].code == 202
    assert h.model.seen[-1].headers["prefer"] == "return=inline"
    h.call("GET", "/v1/models/ASYNC/jobs/job_known", headers=prefer)
    assert "prefer" not in h.model.seen[-1].headers


@pytest.mark.parametrize("failing", ["lookup", "open_range"])
def test_a_store_that_fails_is_a_503_not_a_half_answer(
    served: Any, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The store's lookup or read raising OSError (an object store down) answers
    503 with Retry-After and a JSON error, without the file's ETag or range."""
    app, clock, threads, stub = served
    job, _data = run_job(app, clock, threads, stub, {"n": 1})

    def down(*_a: Any) -> Any:
        raise ConnectionRefusedError("store down")

    monkeypatch.setattr(app.runtime.result_files, failing, down)
    code, headers, body = call(
        stub, "GET", f"/jobs/{job}/files/picture.png", headers={"Range": "bytes=0-3"}
    )
    assert code == 503, body
    assert json.loads(body)["code"] == 65 and header(headers, "Retry-After") == "1"
    assert header(headers, "ETag") is None and header(headers, "Content-Range") is None
    assert header(headers, "Content-Type").startswith("application/json")


def test_a_file_never_runs_as_a_page_and_a_304_has_no_length(served: Any) -> None:
    """Issue 37.4: every file answer is sandboxed (CSP ``sandbox``) and ``nosniff``;
    an HTML or script file (a type a model may copy from an upload) is an
    attachment, a PNG or plain text is inline; a 304 carries no Content-Length
    (RFC 9110 8.6: only the 200's would be allowed)."""
    app, clock, threads, stub = served
    job, data = run_job(app, clock, threads, stub, {"n": 1, "size": 10})
    store = app.runtime.result_files
    store.put(job, "page.html", b"<script>alert(localStorage)</script>", "text/html")
    store.put(job, "app.js", b"alert(1)", "text/javascript; charset=utf-8")
    store.put(job, "pic.svg", b"<svg onload='alert(1)'/>", "image/svg+xml")
    expected = {
        "page.html": 'attachment; filename="page.html"',
        "app.js": 'attachment; filename="app.js"',
        "pic.svg": 'attachment; filename="pic.svg"',
        "picture.png": None,
        "notes-0.txt": None,
    }
    for name, disposition in expected.items():
        code, headers, _b = call(stub, "GET", f"/jobs/{job}/files/{name}")
        assert code == 200, name
        assert header(headers, "Content-Security-Policy") == "sandbox", name
        assert header(headers, "X-Content-Type-Options") == "nosniff", name
        assert header(headers, "Content-Disposition") == disposition, name
    etag = f'"{data["picture"]["sha256"]}"'
    code, headers, body = call(
        stub, "GET", f"/jobs/{job}/files/picture.png", headers={"If-None-Match": etag}
    )
    assert (code, body) == (304, b"") and header(headers, "Content-Length") is None


@pytest.mark.parametrize("name", ["picture.png\n", "picture.png\r", "picture.png\r\n"])
def test_a_name_with_a_trailing_newline_is_not_a_file(served: Any, name: str) -> None:
    """Issue 37.4: ``check_name`` matched ``$`` before a final newline (the URL
    carries it percent-encoded)."""
    from urllib.parse import quote

    from mortred_twisted.stores.result_files import BadFileName, check_name

    app, clock, threads, stub = served
    job, _data = run_job(app, clock, threads, stub, {"n": 1})
    with pytest.raises(BadFileName):
        check_name(name)
    code, _h, _b = call(stub, "GET", f"/jobs/{job}/files/{quote(name)}")
    assert code == 404

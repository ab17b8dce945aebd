"""The typed submission of the native door (issue 35 item 1) and what hangs on it:
``Idempotency-Key`` compares the *parsed* request (a multipart retry with a new
boundary replays; another file or field is a conflict), each submit header is read
once, and ``/result`` of a cancelled job says it was cancelled (issue 36 item 4)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from PIL import Image as PILImage
from twisted.internet.defer import maybeDeferred
from twisted.internet.task import Clock

from mortred_twisted.config.server import build_server_config
from mortred_twisted.http.envelope import parse_envelope, parse_form_envelope
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.http.protocols.submission import RequestHead
from mortred_twisted.jobs.idempotency import submission_fingerprint
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.models.registry import create_model
from mortred_twisted.runtime.model_runtime import ModelRuntime
from tests.fakes.threads import HandThreads
from tests.support.memory_http import MemoryClient

MODEL = "tests.e2e.sdk_models.models:Sharpen"


def png(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (4, 4), colour).save(out, format="PNG")
    return out.getvalue()


def form(boundary: str, fields: dict[str, str], files: dict[str, bytes]) -> tuple[bytes, str]:
    """A multipart body as curl writes it, with the given boundary."""
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    for name, data in files.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
            f'filename="{name}.png"\r\nContent-Type: image/png\r\n\r\n'.encode()
            + data
            + b"\r\n"
        )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), (
        f"multipart/form-data; boundary={boundary}"
    )


def fp_of_form(boundary: str, fields: dict[str, str], files: dict[str, bytes]) -> str:
    body, ctype = form(boundary, fields, files)
    jf: dict[str, Any] = {}
    parsed = parse_form_envelope(body, ctype, "rid", jf)
    return submission_fingerprint(parsed.images, parsed.params, {**jf, "text_params": True})


def test_the_fingerprint_is_of_the_parsed_request_not_its_bytes() -> None:
    """Two boundaries, one request: one fingerprint. Another file, another field value,
    another file name or another job field: another fingerprint. JSON spacing and
    key order do not count; the req_id does not either."""
    red, blue = png((255, 0, 0)), png((0, 0, 255))
    one = fp_of_form("------------------------a1", {"steps": "2"}, {"image": red})
    assert one == fp_of_form("------------------------b2", {"steps": "2"}, {"image": red})
    assert one == fp_of_form("x", {"steps": "2", "req_id": "other"}, {"image": red})
    assert one != fp_of_form("x", {"steps": "2"}, {"image": blue})
    assert one != fp_of_form("x", {"steps": "3"}, {"image": red})
    assert one != fp_of_form("x", {"steps": "2", "priority": "high"}, {"image": red})
    a = parse_envelope(b'{"params": {"a": 1, "b": [1, 2]}}', "r", {}, images_required=False)
    b = parse_envelope(b'{"params":{"b":[1,2],"a":1},"req_id":"z"}', "r", {}, images_required=False)
    c = parse_envelope(b'{"params":{"b":[2,1],"a":1}}', "r", {}, images_required=False)
    fps = [submission_fingerprint(p.images, p.params, {}) for p in (a, b, c)]
    assert fps[0] == fps[1] != fps[2]
    # Images count by content: one more image, or another, is another request.
    assert submission_fingerprint([b"x"], {}, {}) != submission_fingerprint([b"y"], {}, {})
    assert submission_fingerprint([b"x"], {}, {}) != submission_fingerprint([b"x", b"x"], {}, {})


def make_app() -> tuple[ModelServerApp, Clock, HandThreads, MemoryClient]:
    doc = {
        "server": {"id": "S", "worker_nums": 1, "async_enabled": True},
        "model": {"type": MODEL, "pass_s": 0},
    }
    config = build_server_config(doc, env={})
    clock, threads = Clock(), HandThreads()
    runtime = ModelRuntime(
        config, clock=clock, threads=threads, metrics=ServerMetrics(), build_model=create_model,
        io_threads=maybeDeferred,
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
    stub: MemoryClient, method: str, url: str, data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, bytes]:  # fmt: skip
    kwargs: dict[str, Any] = {"headers": dict(headers or {})}
    if data is not None:
        kwargs["data"] = data
    d = stub.request(method, "http://localhost" + url, **kwargs)
    stub.flush()
    responses: list = []
    d.addCallback(responses.append)
    assert responses, f"{method} {url} did not answer"
    content: list = []
    responses[0].content().addCallback(content.append)
    stub.flush()
    return responses[0].code, responses[0].headers, content[0]


def post_form(
    stub: MemoryClient, boundary: str, fields: dict[str, str], files: dict[str, bytes],
    key: str,
) -> tuple[int, Any, dict[str, Any]]:  # fmt: skip
    body, ctype = form(boundary, fields, files)
    code, headers, raw = call(
        stub, "POST", "/jobs", body, {"Content-Type": ctype, "Idempotency-Key": key}
    )
    return code, headers, json.loads(raw)


def test_a_multipart_retry_with_a_new_boundary_replays_its_job(served: Any) -> None:
    """curl picks a new boundary per request: the same key and the same form replay the
    first job (Idempotent-Replayed); another picture or field with that key is 422."""
    _app, _clock, _threads, stub = served
    red = png((255, 0, 0))
    code, headers, first = post_form(stub, "curl-boundary-1", {"steps": "2"}, {"image": red}, "k1")
    assert code == 202 and not headers.hasHeader(b"Idempotent-Replayed"), first
    code, headers, again = post_form(stub, "curl-boundary-2", {"steps": "2"}, {"image": red}, "k1")
    assert code == 202, again
    assert headers.getRawHeaders(b"Idempotent-Replayed") == [b"true"]
    assert again["job_id"] == first["job_id"]
    blue = png((0, 0, 255))
    code, _h, refused = post_form(stub, "curl-boundary-3", {"steps": "2"}, {"image": blue}, "k1")
    assert code == 422 and "Idempotency-Key" in refused["error"]
    code, _h, refused = post_form(stub, "curl-boundary-4", {"steps": "3"}, {"image": red}, "k1")
    assert code == 422
    # A key that is not visible ASCII is still a 400 before anything is parsed.
    body, ctype = form("b", {"steps": "2"}, {"image": red})
    bad = call(stub, "POST", "/jobs", body, {"Content-Type": ctype, "Idempotency-Key": "a b"})
    assert bad[0] == 400


def test_result_of_a_cancelled_job_says_it_was_cancelled(served: Any) -> None:
    """``/result`` of a cancelled job is 409 (code 64, docs/api.md) saying the job was
    cancelled, not that it is unfinished; a pending job's still says not finished."""
    _app, clock, _threads, stub = served
    red = png((255, 0, 0))
    ids = []
    for boundary in ("one", "two"):
        body, ctype = form(boundary, {"steps": "2"}, {"image": red})
        code, _h, raw = call(stub, "POST", "/jobs", body, {"Content-Type": ctype})
        assert code == 202, raw
        ids.append(json.loads(raw)["job_id"])
    clock.advance(0)  # the first takes the only worker; the second stays pending
    code, _h, raw = call(stub, "GET", f"/jobs/{ids[1]}/result")
    assert code == 409 and json.loads(raw)["error"] == "job not finished (state: pending)"
    assert call(stub, "DELETE", f"/jobs/{ids[1]}")[0] == 200
    code, _h, raw = call(stub, "GET", f"/jobs/{ids[1]}/result")
    doc = json.loads(raw)
    assert code == 409 and doc["code"] == 64
    assert doc["error"] == "job was cancelled (state: cancelled): it has no result"


class CountingHeaders:
    """Headers that count each name looked up."""

    def __init__(self, headers: Any) -> None:
        self.headers = headers
        self.looked_up: dict[bytes, int] = {}

    def getRawHeaders(self, name: bytes, default: Any = None) -> Any:
        key = name.lower()
        self.looked_up[key] = self.looked_up.get(key, 0) + 1
        return self.headers.getRawHeaders(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.headers, name)


def test_a_submit_reads_each_of_its_headers_once(served: Any) -> None:
    """The native door builds its head once: request id, content type, Prefer,
    Idempotency-Key and the principal headers are each looked up once per submit."""
    app, _clock, _threads, _stub = served
    from twisted.web.test.requesthelper import DummyRequest

    body, ctype = form("b", {"steps": "2"}, {"image": png((1, 2, 3))})
    request = DummyRequest([b"jobs"])
    request.method = b"POST"
    request.content = io.BytesIO(body)
    for name, value in (
        (b"Content-Type", ctype.encode()), (b"X-Request-ID", b"rid-1"),
        (b"Idempotency-Key", b"k"), (b"Prefer", b"respond-async"),
    ):  # fmt: skip
        request.requestHeaders.setRawHeaders(name, [value])
    counting = CountingHeaders(request.requestHeaders)
    request.requestHeaders = counting
    raw = app.jobs.submit_job(request)
    assert request.responseCode == 202, raw
    assert isinstance(RequestHead.read(counting), RequestHead)  # the test's own read
    for name in (b"x-request-id", b"content-type", b"prefer", b"idempotency-key"):
        assert counting.looked_up[name] == 2, (name, counting.looked_up)  # once + the test's

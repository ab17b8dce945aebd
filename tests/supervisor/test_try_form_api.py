"""The try-it form's supervisor routes, in memory: a model's OpenAPI document relayed
as it is (what the form is built from), and ``multipart/form-data`` submits (an SDK
model's inputs as parts) passed on byte for byte to the model's sync route or
``/jobs``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from klein import Klein

from .test_supervisor_api import AUTH, Harness

pytestmark = pytest.mark.filterwarnings("ignore:Using readBody with a transport")

#: A document that mentions job paths: the relay must not rewrite them.
OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "t", "x-mortred-model": {"name": "Sharpen", "inputs": []}},
    "paths": {"/jobs/{job_id}": {"get": {}}},
    "components": {"schemas": {"Request": {"properties": {"params": {"type": "object"}}}}},
}
BOUNDARY = "----mortredform"
FORM = (
    f"--{BOUNDARY}\r\n"
    'Content-Disposition: form-data; name="image"; filename="a.png"\r\n'
    "Content-Type: image/png\r\n\r\n"
    "\x89PNG-bytes\r\n"
    f"--{BOUNDARY}\r\n"
    'Content-Disposition: form-data; name="steps"\r\n\r\n'
    "3\r\n"
    f"--{BOUNDARY}--\r\n"
).encode("latin-1")
FORM_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


class SdkModel:
    """A model port's routes the form uses; records what reached it."""

    def __init__(self, openapi_status: int = 200) -> None:
        self.seen: list[dict[str, Any]] = []
        self.openapi_status = openapi_status

    def resource(self) -> Any:
        app = Klein()
        model = self

        def record(request: Any) -> None:
            model.seen.append({
                "method": request.method.decode(),
                "path": request.path.decode(),
                "content_type": (request.getHeader(b"content-type") or b"").decode(),
                "authorization": (request.getHeader(b"authorization") or b"").decode(),
                "body": request.content.read(),
            })  # fmt: skip

        @app.route("/openapi.json", methods=["GET"])
        def openapi(request: Any) -> bytes:
            record(request)
            request.setResponseCode(model.openapi_status)
            request.setHeader(b"Content-Type", b"application/json")
            if model.openapi_status != 200:
                return b'{"code": 503, "msg": "model not ready"}'
            return json.dumps(OPENAPI).encode()

        @app.route("/jobs", methods=["POST"])
        def submit(request: Any) -> bytes:
            record(request)
            request.setResponseCode(202)
            request.setHeader(b"Content-Type", b"application/json")
            return json.dumps({"job_id": "job_f", "state": "pending", "poll_url": "/jobs/job_f",
                               "result_url": "/jobs/job_f/result"}).encode()  # fmt: skip

        @app.route("/mortred/fake/infer", methods=["POST"])
        def infer(request: Any) -> bytes:
            record(request)
            request.setHeader(b"Content-Type", b"application/json")
            return b'{"code": 0, "msg": "success", "data": {"name": "output.png"}}'

        return app.resource()


def test_the_model_openapi_document_is_relayed_as_it_is() -> None:
    """GET /api/v1/models/A/openapi.json answers the model's document byte for byte
    (job paths inside it are not rewritten), as JSON that is not cached."""
    m = SdkModel()
    h = Harness(m.resource())
    code, body, headers = h.call("GET", "/api/v1/models/A/openapi.json", headers=AUTH)
    assert code == 200 and json.loads(body) == OPENAPI
    assert headers.getRawHeaders("content-type")[0].startswith("application/json")
    assert headers.getRawHeaders("cache-control") == ["no-store"]
    assert m.seen[-1]["method"] == "GET" and m.seen[-1]["path"] == "/openapi.json"


def test_the_openapi_relay_needs_the_token_and_a_known_model() -> None:
    """No token: 401 (the model is not asked); an unknown id: 404; a model that
    answers 503 (not ready) is answered 503."""
    m = SdkModel()
    h = Harness(m.resource())
    assert h.call("GET", "/api/v1/models/A/openapi.json")[0] == 401
    assert m.seen == []
    code, body, _ = h.call("GET", "/api/v1/models/NOPE/openapi.json", headers=AUTH)
    assert code == 404 and "unknown server: NOPE" in json.loads(body)["error"]
    m.openapi_status = 503
    assert h.call("GET", "/api/v1/models/A/openapi.json", headers=AUTH)[0] == 503


@pytest.mark.parametrize(
    ("query", "path", "status"),
    [("server_id=A&async=1", "/jobs", 202), ("server_id=A", "/mortred/fake/infer", 200)],
)
def test_a_form_submit_reaches_the_model_byte_for_byte(query: str, path: str, status: int) -> None:
    """POST /api/v1/infer?server_id=A[&async=1] with a multipart body: the model's
    /jobs (or sync route) gets the same bytes and Content-Type (boundary included),
    with the internal token; a job's URLs come back under /api/v1/jobs/A/."""
    m = SdkModel()
    h = Harness(m.resource())
    code, body, _ = h.call(
        "POST", f"/api/v1/infer?{query}", headers={**AUTH, "Content-Type": FORM_TYPE}, data=FORM
    )
    assert code == status
    seen = m.seen[-1]
    assert (seen["method"], seen["path"]) == ("POST", path)
    assert seen["content_type"] == FORM_TYPE and seen["body"] == FORM
    assert seen["authorization"] == "Bearer internal"
    if status == 202:
        assert json.loads(body)["poll_url"] == "/api/v1/jobs/A/job_f"


def test_form_submits_are_judged_from_the_head() -> None:
    """Other content types are 415 before the body; a form without the token is 401
    and one naming an unknown model 404, and neither reaches a model."""
    m = SdkModel()
    h = Harness(m.resource())
    code, body, _ = h.call(
        "POST", "/api/v1/infer", headers={**AUTH, "Content-Type": "text/plain"}, data=b"x"
    )
    assert code == 415 and "multipart/form-data" in json.loads(body)["error"]
    form = {"Content-Type": FORM_TYPE}
    assert h.call("POST", "/api/v1/infer?server_id=A", headers=form, data=FORM)[0] == 401
    code, body, _ = h.call(
        "POST", "/api/v1/infer?server_id=NOPE&async=1", headers={**AUTH, **form}, data=FORM
    )
    assert code == 404 and "unknown server: NOPE" in json.loads(body)["error"]
    assert m.seen == []

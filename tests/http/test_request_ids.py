"""X-Request-ID on every JSON answer of a model port (docs/api.md): every route and
error, the early 413 and the framing refusals, through the real Site in memory."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from mortred_twisted.http.answers import header_value
from mortred_twisted.http.model_port import ModelPortFactory
from tests.http.test_model_server_app import make_app
from tests.security.wire import Answer, parse_answers

TOKEN = "t0k"
IMG = base64.b64encode(b"pixels").decode()
ENVELOPE = json.dumps({"images": [IMG]}).encode()


class Port:
    """A model port in memory: the app behind its HTTP server (a 1000-byte body
    limit), requests over fresh StringTransport connections, model threads stepped
    by hand."""

    def __init__(self) -> None:
        self.app, self.clock, self.threads, _ = make_app(auth_token=TOKEN, request_size_limit=0.001)
        self.site = ModelPortFactory.for_app(self.app, Clock())

    def send(self, raw: bytes, run: bool = False) -> Answer:
        proto = self.site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(raw)
        while run and not transport.value():  # sync inference: run the model call
            self.clock.advance(0)
            self.threads.step()
        answers = parse_answers(transport.value())
        assert len(answers) == 1, transport.value()
        return answers[0]

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        auth: bool = True,
        run: bool = False,
        **headers: str,
    ) -> Answer:
        lines = [f"{method} {path} HTTP/1.1", "Host: x"]
        if auth:
            lines.append(f"Authorization: Bearer {TOKEN}")
        if body:
            lines.append("Content-Type: application/json")
        lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        return self.send(("\r\n".join(lines) + "\r\n\r\n").encode() + body, run)

    def job(self) -> str:
        doc = json.loads(self.request("POST", "/jobs", ENVELOPE).body)
        return doc["job_id"]


def calls(port: Port) -> list[tuple[str, Any]]:
    """(name, a function of extra headers -> Answer) for every route and error."""
    done = port.job()
    port.clock.advance(0)
    port.threads.step()
    pending = port.job()  # submitted, not yet run
    r = port.request
    return [
        ("result 409", lambda **h: r("GET", f"/jobs/{pending}/result", **h)),
        ("healthz", lambda **h: r("GET", "/healthz", **h)),
        ("ready", lambda **h: r("GET", "/ready", **h)),
        ("openapi", lambda **h: r("GET", "/openapi.json", **h)),
        ("infer 200", lambda **h: r("POST", "/infer", ENVELOPE, run=True, **h)),
        ("infer 400", lambda **h: r("POST", "/infer", b"{nope", **h)),
        ("infer 401", lambda **h: r("POST", "/infer", ENVELOPE, auth=False, **h)),
        ("infer 405", lambda **h: r("GET", "/infer", **h)),
        ("infer 415", lambda **h: r("POST", "/infer", auth=True, **h)),
        ("infer 422", lambda **h: r("POST", "/infer", b'{"images": []}', **h)),
        ("infer 413", lambda **h: r("POST", "/infer", b"x" * 2000, **h)),
        ("submit 202", lambda **h: r("POST", "/jobs", ENVELOPE, **h)),
        ("submit 401", lambda **h: r("POST", "/jobs", ENVELOPE, auth=False, **h)),
        ("submit 413", lambda **h: r("POST", "/jobs", b"x" * 2000, **h)),
        ("submit 422", lambda **h: r("POST", "/jobs", b'{"nope": 1}', **h)),
        ("status 200", lambda **h: r("GET", f"/jobs/{done}", **h)),
        ("status 401", lambda **h: r("GET", f"/jobs/{done}", auth=False, **h)),
        ("status 404", lambda **h: r("GET", "/jobs/job_nope", **h)),
        ("wait 200", lambda **h: r("GET", f"/jobs/{done}/wait?timeout=0", **h)),
        ("wait 400", lambda **h: r("GET", f"/jobs/{done}/wait?timeout=-1", **h)),
        ("result 200", lambda **h: r("GET", f"/jobs/{done}/result", **h)),
        ("result 404", lambda **h: r("GET", "/jobs/job_nope/result", **h)),
        ("list 200", lambda **h: r("GET", "/jobs", **h)),
        ("cancel 404", lambda **h: r("DELETE", "/jobs/job_nope", **h)),
        ("unknown 404", lambda **h: r("GET", "/nope", **h)),
        ("healthz 405", lambda **h: r("POST", "/healthz", ENVELOPE, **h)),
        ("framing 400", lambda **h: port.send(b"GET /healthz HTTP/1.1\r\n\r\n")),
        ("framing 417", lambda **h: r("GET", "/healthz", Expect="nope", **h)),
    ]


@pytest.mark.parametrize("given", [None, "rid-7", "☃"], ids=["absent", "ascii", "snowman"])
def test_every_json_answer_carries_a_request_id(given: str | None) -> None:
    """Every JSON answer has X-Request-ID: an envelope's req_id, else the client's
    (percent-encoded if not visible ASCII) when it sent one, else a generated one."""
    port = Port()
    seen: dict[str, int] = {}
    for name, call in calls(port):
        extra = {} if given is None else {"X_Request_ID": given}
        if name.startswith("framing 400"):
            extra = {}  # that request is refused before any header is read
        answer = call(**extra)
        seen[name] = answer.status
        assert answer.headers["content-type"].startswith("application/json"), name
        rid = answer.headers.get("x-request-id", "")
        assert rid and rid.isascii(), (name, answer.head)
        doc = json.loads(answer.body)
        if isinstance(doc, dict) and {"req_id", "code", "msg"} <= set(doc):  # an envelope
            assert rid == header_value(doc["req_id"]).decode(), name
        elif extra:
            assert rid == header_value(given or "").decode(), name
    assert seen["infer 200"] == 200 and seen["submit 413"] == 413 and seen["framing 417"] == 417

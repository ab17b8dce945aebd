"""The client's credentials go to the configured origin only (issue 30.5): a job URL
a server returns (``poll_url``, ``result_url``) that names another origin, absolute
or ``//``-relative, is followed without the token or the caller's extra headers.

The sync client runs against two real HTTP servers on loopback: the front it was
configured with, whose 202 names a second ("foreign") server, and that server,
which records what it receives. Before the fix the token reached the foreign one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from mortred_client import Client
from mortred_client.protocol import Call, for_origin
from mortred_client.twisted import TwistedClient
from twisted.internet import defer, task
from twisted.web.http_headers import Headers

TOKEN = "secret-token"


class Recorder(BaseHTTPRequestHandler):
    """Answers every request from ``server.answer(path, port)``; records heads."""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._serve()

    def _serve(self) -> None:
        server: Any = self.server
        server.seen.append((self.command, self.path, dict(self.headers.items())))
        status, doc = server.answer(self.path)
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def serve(answer: Any) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.seen = []  # type: ignore[attr-defined]
    server.answer = answer  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def foreign() -> Iterator[ThreadingHTTPServer]:
    """The server a hostile front points its job URLs at."""
    server = serve(lambda path: (200, {"job_id": "job_1", "state": "running"}))
    yield server
    server.shutdown()
    server.server_close()


def front_naming(link: str) -> ThreadingHTTPServer:
    """A front whose submit answers 202 with ``poll_url`` ``link``."""
    admitted = {"job_id": "job_1", "state": "pending", "poll_url": link}
    return serve(lambda path: (202, admitted))


@pytest.mark.parametrize("shape", ["absolute", "network-path"])
def test_a_job_url_on_another_origin_gets_no_token(
    foreign: ThreadingHTTPServer, shape: str
) -> None:
    """submit() then status(): the foreign server is asked without Authorization
    (before: ``Bearer secret-token`` reached it); the front still gets it."""
    port = foreign.server_address[1]
    link = f"http://127.0.0.1:{port}/steal" if shape == "absolute" else f"//127.0.0.1:{port}/steal"
    front = front_naming(link)
    try:
        base = f"http://127.0.0.1:{front.server_address[1]}"
        client = Client(base, TOKEN)
        job = client.submit(b"hi")
        assert job.status().state == "running"
    finally:
        front.shutdown()
        front.server_close()
    ((_, path, headers),) = foreign.seen  # type: ignore[attr-defined]
    assert path == "/steal" and "authorization" not in {name.lower() for name in headers}
    ((_, _, sent),) = front.seen  # type: ignore[attr-defined]
    assert sent["Authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    ("link", "credentials"),
    [
        ("/v1/models/M/jobs/job_1", True),
        ("http://front:8080/v1/models/M/jobs/job_1", True),
        ("HTTP://FRONT:8080/x", True),
        ("http://front/x", False),  # port 80, not 8080
        ("https://front:8080/x", False),
        ("http://front:8080@evil/x", False),
        ("//evil/x", False),
        ("http://evil/x", False),
    ],
)
def test_for_origin_keeps_credentials_for_the_configured_origin_only(
    link: str, credentials: bool
) -> None:
    """Scheme, host and port must all match the base URL's (default ports count)."""
    call = Call(
        "GET", link,
        headers=(("Accept", "application/json"), ("Authorization", "Bearer t"), ("X-K", "v")),
    )  # fmt: skip
    url, headers = for_origin("http://front:8080/prefix", call)
    names = {name for name, _ in headers}
    assert ("Authorization" in names) is credentials and ("X-K" in names) is credentials
    assert "Accept" in names and url.lower().startswith(("http://", "https://"))


def test_the_default_port_is_the_same_origin() -> None:
    """``http://front`` and ``http://front:80`` are one origin."""
    call = Call("GET", "http://front:80/x", headers=(("Authorization", "Bearer t"),))
    assert for_origin("http://front", call)[1] == call.headers


def test_the_twisted_client_sends_no_token_to_another_origin() -> None:
    """The Twisted client follows a foreign poll URL without Authorization."""

    class Response:
        code = 200
        headers = Headers({b"content-type": [b"application/json"]})

        def content(self) -> defer.Deferred[bytes]:
            return defer.succeed(b'{"job_id":"job_1","state":"running"}')

    sent: list[tuple[str, Headers]] = []

    class Http:
        def request(self, method: str, url: str, **kw: Any) -> defer.Deferred[Any]:
            sent.append((url, kw["headers"]))
            return defer.succeed(Response())

    clock = task.Clock()
    client = TwistedClient(
        "http://front", TOKEN, model="M", reactor=clock, http=Http(),  # type: ignore[arg-type]
        wall=clock.seconds, rng=lambda: 0.0,
    )  # fmt: skip
    for link in ("http://evil/steal", "//evil/steal", "/v1/models/M/jobs/job_1"):
        client.job(link).status()
    foreign = [h.getRawHeaders(b"authorization") for u, h in sent if "evil" in u]
    own = [h.getRawHeaders(b"authorization") for u, h in sent if "evil" not in u]
    assert [u for u, _ in sent][:2] == ["http://evil/steal", "http://evil/steal"]
    assert foreign == [None, None] and own == [[f"Bearer {TOKEN}".encode()]]

"""``peer_resp_timeout``: how long a model port's connection may wait on its client.

It plays the part of Workflow's ``peer_response_timeout`` in the C++ server (the
bound on each read or write towards the client): twisted.web's channel timeout,
armed while the server waits for the client's bytes and off while it handles a
request. Real model-server processes on 127.0.0.1, with the timeout set to 1 s.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.support.servers import RunningServer, model_server

TIMEOUT_S = 1


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    env = {"MORTRED_PEER_RESP_TIMEOUT": str(TIMEOUT_S)}
    with model_server("conf/server/fake/fake_async.toml", env=env) as srv:
        yield srv


def _read_answer(sock: socket.socket) -> bytes:
    """One HTTP answer with a Content-Length body, read off a keep-alive socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before the answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        body += chunk
    return head + b"\r\n\r\n" + body


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(
    server: RunningServer,
) -> None:
    """A client that sends nothing more after an answer is disconnected once
    peer_resp_timeout has passed, not before."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _read_answer(sock).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        assert sock.recv(1) == b"", "the server sent bytes instead of closing"
        # The server cannot close earlier than its timeout (a lower bound, no race).
        assert time.monotonic() - idle_from >= TIMEOUT_S * 0.9


def test_a_request_being_handled_is_not_cut_by_the_timeout(server: RunningServer) -> None:
    """A long-poll that outlasts peer_resp_timeout (the job runs 2.5 s) still answers,
    on the same connection, because the timeout is off while a request is handled."""
    code, doc = server.json("POST", "/jobs", {"images": ["eA=="], "params": {"delay_ms": 2500}})
    assert code == 202, doc
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            f"GET /jobs/{doc['job_id']}/wait?timeout=20000 HTTP/1.1\r\n"
            "Host: localhost\r\n\r\n".encode()
        )
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 200")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["state"] == "done"

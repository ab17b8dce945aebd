"""Per-client rate limits on a model port behind the gateway: the gateway names each
client in X-Mortred-Client-IP (with the internal token), and nobody else can."""

from __future__ import annotations

import json
import socket

import pytest

from tests.security.conftest import Target
from tests.security.wire import Answer, parse_answers, read_until_closed

pytestmark = pytest.mark.slow

ENVELOPE = json.dumps({"images": ["aGk="], "params": {"delay_ms": 0}}).encode()


def submit(t: Target, source: str, **headers: str) -> Answer:
    """One POST of a valid job from loopback address ``source``."""
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    request = (
        b"POST " + t.post_path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + t.auth
        + extra.encode() + b"Content-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(ENVELOPE) + ENVELOPE
    )  # fmt: skip
    with socket.create_connection(
        ("127.0.0.1", t.port), timeout=10, source_address=(source, 0)
    ) as s:
        s.sendall(request)
        raw, _ = read_until_closed(s, 10)
    (answer,) = parse_answers(raw)
    return answer


def test_clients_behind_the_gateway_have_their_own_buckets(processes: dict[str, Target]) -> None:
    """Two clients of one gateway are limited apart on the model (one would otherwise
    spend the other's budget): the second POST of one is 429, the other's first is 202."""
    gw = processes["gateway"]
    assert submit(gw, "127.0.0.3").status == 202
    second = submit(gw, "127.0.0.3")
    assert second.status == 429 and b"rate limit exceeded" in second.body
    assert submit(gw, "127.0.0.4").status == 202


def test_a_client_cannot_name_itself(processes: dict[str, Target]) -> None:
    """Through the gateway a client's own X-Mortred-Client-IP is replaced by its real
    address; straight to the model port without the internal token it is a 401."""
    gw = processes["gateway"]
    assert submit(gw, "127.0.0.5", X_Mortred_Client_IP="192.0.2.1").status == 202
    assert submit(gw, "127.0.0.5", X_Mortred_Client_IP="192.0.2.2").status == 429
    model = processes["model"]
    no_token = Target("model", model.port, model.post_path, b"", model.process)
    assert submit(no_token, "127.0.0.6", X_Mortred_Client_IP="192.0.2.3").status == 401

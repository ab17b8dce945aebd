"""Per-client rate limits on a model port behind the gateway: the gateway names each
client in X-Mortred-Client-IP (with the internal token), and nobody else can."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.security.conftest import (
    GATEWAY_TOKEN,
    INTERNAL_TOKEN,
    MODEL,
    MODEL_QPS,
    GatewayProcess,
    Target,
)
from tests.security.wire import Answer, parse_answers, read_until_closed
from tests.support.servers import model_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Target]]:
    """A model with a per-client rate limit (one POST per client every 5 s, so each
    bucket runs dry at once) and a gateway in front of it."""
    env = {"MORTRED_AUTH_TOKEN": INTERNAL_TOKEN, "MORTRED_RATE_LIMIT_QPS": str(MODEL_QPS)}
    with model_server(f"conf/server/fake/{MODEL.lower()}.toml", env=env) as srv:
        gateway = GatewayProcess(tmp_path_factory.mktemp("rate-limited"), srv.port)
        try:
            gateway.wait_listening()
            model_auth = b"Authorization: Bearer " + INTERNAL_TOKEN.encode() + b"\r\n"
            gateway_auth = b"Authorization: Bearer " + GATEWAY_TOKEN.encode() + b"\r\n"
            yield {
                "model": Target("model", srv.port, b"/jobs", model_auth, srv.process),
                "gateway": Target(
                    "gateway", gateway.port, f"/v1/models/{MODEL}/jobs".encode(),
                    gateway_auth, gateway.process,
                ),
            }  # fmt: skip
        finally:
            gateway.stop()


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


def test_clients_behind_the_gateway_have_their_own_buckets(limited: dict[str, Target]) -> None:
    """Two clients of one gateway are limited apart on the model (one would otherwise
    spend the other's budget): the second POST of one is 429, the other's first is 202."""
    gw = limited["gateway"]
    assert submit(gw, "127.0.0.3").status == 202
    second = submit(gw, "127.0.0.3")
    assert second.status == 429 and b"rate limit exceeded" in second.body
    assert submit(gw, "127.0.0.4").status == 202


def test_a_client_cannot_name_itself(limited: dict[str, Target]) -> None:
    """Through the gateway a client's own X-Mortred-Client-IP is replaced by its real
    address; straight to the model port without the internal token it is a 401."""
    gw = limited["gateway"]
    assert submit(gw, "127.0.0.5", X_Mortred_Client_IP="192.0.2.1").status == 202
    assert submit(gw, "127.0.0.5", X_Mortred_Client_IP="192.0.2.2").status == 429
    model = limited["model"]
    no_token = Target("model", model.port, model.post_path, b"", model.process)
    assert submit(no_token, "127.0.0.6", X_Mortred_Client_IP="192.0.2.3").status == 401


def test_a_client_over_its_rate_limit_is_refused_from_the_head(limited: dict[str, Target]) -> None:
    """A client that spent its token announces a 15 MB job with Expect: 100-continue:
    429 + Retry-After from the head, no 100 Continue, closed, no body byte read
    (before: the body was read and parsed in full on the reactor thread, then 429)."""
    model = limited["model"]
    assert submit(model, "127.0.0.7").status == 202
    head = (
        b"POST /jobs HTTP/1.1\r\nHost: x\r\n" + model.auth
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n" % (15 * 1024 * 1024)
        + b"Expect: 100-continue\r\n\r\n"
    )  # fmt: skip
    with socket.create_connection(
        ("127.0.0.1", model.port), timeout=10, source_address=("127.0.0.7", 0)
    ) as s:
        s.sendall(head)
        raw, closed = read_until_closed(s, 10)
    assert closed and raw.startswith(b"HTTP/1.1 429 "), raw[:200]
    assert b"100 Continue" not in raw
    (answer,) = parse_answers(raw)
    assert int(answer.headers["retry-after"]) >= 1 and b"rate limit exceeded" in answer.body

"""The job API beyond the seed through the gateway, in memory as production pairs it
(gateway server → GatewayApp → lean pool → a fake model over iosim): cancel, listing,
callers, Idempotency-Key, and live event streams."""

from __future__ import annotations

import json

from twisted.internet.error import ConnectionLost
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from mortred_twisted.gateway.apikeys import ApiKey, hash_key

from .test_gateway_app import AUTH, Client, Harness

JOB = "/v1/models/ASYNC/jobs"
ALICE = {"Authorization": "Bearer alice-key"}
BOB = {"Authorization": "Bearer bob-key"}
ADMIN = {"Authorization": "Bearer admin-key"}
KEYS = [
    ApiKey("alice", hash_key("alice-key")),
    ApiKey("bob", hash_key("bob-key")),
    ApiKey("admin", hash_key("admin-key"), scope="all"),
]


def test_cancel_is_forwarded_and_its_urls_rewritten() -> None:
    """DELETE on a job URL reaches the model as DELETE /jobs/{job}; 202 and 200 views
    come back with gateway URLs, 409 and 404 pass through."""
    h = Harness()
    r, body = h.call("DELETE", f"{JOB}/job_known", headers=AUTH)
    doc = json.loads(body)
    assert r.code == 202 and doc["cancel_requested"] is True
    assert doc["poll_url"] == f"{JOB}/job_known"
    assert doc["result_url"] == f"{JOB}/job_known/result"
    assert (h.model.seen[-1].method, h.model.seen[-1].path) == ("DELETE", "/jobs/job_known")
    r, body = h.call("DELETE", f"{JOB}/job_pending", headers=AUTH)
    assert r.code == 200 and json.loads(body)["poll_url"] == f"{JOB}/job_pending"
    assert h.call("DELETE", f"{JOB}/job_done", headers=AUTH)[0].code == 409
    assert h.call("DELETE", f"{JOB}/job_nope", headers=AUTH)[0].code == 404
    r, body = h.call("GET", "/metrics", headers=AUTH)
    assert 'mortred_gateway_requests_total{route="jobs_cancel",status="202"} 1.0' in body.decode()


def test_wrong_methods_name_every_route_of_the_path() -> None:
    """405's Allow lists both routes of a path (POST and GET on …/jobs, GET and DELETE
    on a job); the events route takes GET only; nothing reaches the model."""
    h = Harness()
    r, _ = h.call("DELETE", JOB, headers=AUTH)
    assert r.code == 405 and r.headers.getRawHeaders("allow") == ["POST, GET"]
    r, _ = h.call("PUT", f"{JOB}/job_known", headers=AUTH, data=b"{}")
    assert r.code == 405 and r.headers.getRawHeaders("allow") == ["GET, DELETE"]
    r, _ = h.call("DELETE", f"{JOB}/job_known/events", headers=AUTH)
    assert r.code == 405 and r.headers.getRawHeaders("allow") == ["GET"]
    assert h.model.seen == []


def test_listing_forwards_only_its_own_query_keys_and_rewrites_each_job() -> None:
    """GET …/jobs forwards state, limit and cursor (first value each, re-encoded) and
    nothing else; every listed job's URLs are gateway URLs."""
    h = Harness()
    r, body = h.call(
        "GET", f"{JOB}?state=pending,running&x=%2F..&limit=5&state=done&cursor=c12", headers=AUTH
    )
    assert r.code == 200
    assert h.model.seen[-1].path == "/jobs?state=pending%2Crunning&limit=5&cursor=c12"
    doc = json.loads(body)
    assert [j["poll_url"] for j in doc["jobs"]] == [f"{JOB}/job_b", f"{JOB}/job_a"]
    assert doc["jobs"][0]["result_url"] == f"{JOB}/job_b/result"
    h.call("GET", JOB, headers=AUTH)
    assert h.model.seen[-1].path == "/jobs"


def test_each_api_key_is_its_own_caller_and_spoofed_headers_are_dropped() -> None:
    """Every job route names the API key to the model (key:<name>); an `all` key adds
    the scope; a client's own X-Mortred-Principal headers never reach the model."""
    h = Harness(keys=KEYS)
    spoof = {"X-Mortred-Principal": "key:admin", "X-Mortred-Principal-Scope": "all"}
    calls = [
        ("POST", JOB, b"{}"),
        ("GET", f"{JOB}/job_known", None),
        ("GET", f"{JOB}/job_known/result", None),
        ("DELETE", f"{JOB}/job_known", None),
        ("GET", JOB, None),
    ]
    for method, path, data in calls:
        h.call(method, path, headers={**ALICE, **spoof}, data=data)
        seen = h.model.seen[-1].headers
        assert seen["x-mortred-principal"] == "key:alice", (method, path)
        assert "x-mortred-principal-scope" not in seen, (method, path)
    h.call("GET", JOB, headers=ADMIN)
    seen = h.model.seen[-1].headers
    assert (seen["x-mortred-principal"], seen["x-mortred-principal-scope"]) == ("key:admin", "all")
    h.call("GET", JOB, headers=AUTH)  # the gateway's own token: one caller, every job
    seen = h.model.seen[-1].headers
    assert (seen["x-mortred-principal"], seen["x-mortred-principal-scope"]) == (
        "gateway-token",
        "all",
    )
    h.call("POST", "/v1/models/ASYNC/infer", headers=ALICE, data=b"{}")  # not a job route
    assert "x-mortred-principal" not in h.model.seen[-1].headers


def test_idempotency_key_is_forwarded_on_submit_per_key_and_the_replay_is_marked() -> None:
    """Idempotency-Key reaches the model on a submit (scoped there by the caller the
    gateway names), Idempotent-Replayed comes back; a poll never forwards it."""
    h = Harness(keys=KEYS)
    idem = {"Idempotency-Key": "order-42"}
    r, _ = h.call("POST", JOB, headers={**ALICE, **idem}, data=b"{}")
    assert r.code == 202 and r.headers.getRawHeaders("idempotent-replayed") is None
    assert h.model.seen[-1].headers["idempotency-key"] == "order-42"
    r, _ = h.call("POST", JOB, headers={**ALICE, **idem}, data=b"{}")
    assert r.headers.getRawHeaders("idempotent-replayed") == ["true"]
    r, _ = h.call("POST", JOB, headers={**BOB, **idem}, data=b"{}")  # another caller's key
    assert r.headers.getRawHeaders("idempotent-replayed") is None
    h.call("GET", f"{JOB}/job_known", headers={**ALICE, **idem})
    assert "idempotency-key" not in h.model.seen[-1].headers


def test_cancel_and_listing_go_to_another_replica_after_a_refusal() -> None:
    """With two replicas and one refusing connections, a cancel and a listing are
    answered by the other (the job store is shared)."""
    h = Harness(replicas=2)
    h.refused.add(("127.0.0.1", 18100))
    for _ in range(2):  # whichever replica the round robin picks first
        assert h.call("DELETE", f"{JOB}/job_known", headers=AUTH)[0].code == 202
        assert h.call("GET", JOB, headers=AUTH)[0].code == 200
    client = Client(h)
    client.send("GET", f"{JOB}/job_known/events", AUTH)
    assert b"retry: 2000" in client.transport.value()


def chunks(raw: bytes) -> tuple[bytes, list[bytes], bool]:
    """(head, chunk payloads, ended) of a chunked answer read so far."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    payloads, ended = [], False
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            ended = True
            break
        payloads.append(rest[:size])
        rest = rest[size + 2 :]
    return head, payloads, ended


def open_stream(h: Harness, headers: dict[str, str] | None = None) -> tuple[Client, object]:
    client = Client(h)
    client.send("GET", f"{JOB}/job_known/events", {**AUTH, **(headers or {})})
    assert len(h.model.streams) == 1
    return client, h.model.streams[0][0]


def test_events_reach_the_client_record_by_record_as_they_come() -> None:
    """The head and the model's first bytes come at once (chunked, no Content-Length);
    a record split across writes is sent whole once complete, with gateway URLs; the
    answer ends when the model's does; Last-Event-ID is forwarded; the upstream
    connection is not pooled and nothing is left in flight."""
    h = Harness()
    client, upstream = open_stream(h, {"Last-Event-ID": "7"})
    assert h.model.seen[-1].headers["last-event-id"] == "7"
    assert h.model.seen[-1].headers["x-mortred-principal"] == "gateway-token"
    head, parts, ended = chunks(client.transport.value())
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
    assert b"text/event-stream" in head and b"X-Accel-Buffering: no" in head
    assert parts == [b"retry: 2000\n\n"] and not ended
    record = (
        b'id: 1\nevent: state\ndata: {"job_id":"job_known","state":"running",'
        b'"poll_url":"/jobs/job_known","result_url":"/jobs/job_known/result"}\n\n'
    )
    upstream.write(record[:40])  # type: ignore[attr-defined]
    h.flush()
    assert chunks(client.transport.value())[1] == parts  # nothing half a record
    upstream.write(record[40:])  # type: ignore[attr-defined]
    h.flush()
    _, parts, ended = chunks(client.transport.value())
    assert len(parts) == 2 and not ended
    assert b'"poll_url":"/v1/models/ASYNC/jobs/job_known"' in parts[1]
    assert b'"result_url":"/v1/models/ASYNC/jobs/job_known/result"' in parts[1]
    upstream.write(b'id: 2\nevent: done\ndata: {"state":"done"}\n\n')  # type: ignore[attr-defined]
    h.model.streams[0][1].callback(b"")
    h.flush()
    _, parts, ended = chunks(client.transport.value())
    assert ended and parts[-1].startswith(b"id: 2\nevent: done")
    assert h.app.metrics.hot.inflight == 0
    assert h.upstream.idle_count("127.0.0.1", 18100) == 0
    assert not h.clock.getDelayedCalls()  # the stream's silence timer is gone too
    client.send("GET", f"{JOB}/job_known", AUTH)  # the connection serves the next request
    assert client.transport.value().count(b"HTTP/1.1 200") == 2


def test_a_client_that_leaves_mid_stream_releases_the_upstream_stream() -> None:
    """A client hanging up mid-stream aborts the dedicated upstream connection: the
    model's stream is cancelled, nothing is pooled, in flight or scheduled."""
    h = Harness()
    client, _ = open_stream(h)
    client.proto.connectionLost(Failure(ConnectionLost("client went away")))
    h.flush()
    assert h.model.streams_closed == ["job_known"]
    assert h.app.metrics.hot.inflight == 0
    assert h.upstream.idle_count("127.0.0.1", 18100) == 0
    assert not h.clock.getDelayedCalls()


def test_an_upstream_that_breaks_off_cuts_the_clients_stream() -> None:
    """The model's connection lost mid-stream: the client's answer is cut (connection
    closed without the final chunk), not ended as if complete."""
    h = Harness()
    client, upstream = open_stream(h)
    upstream.channel.transport.loseConnection()  # type: ignore[attr-defined]
    h.flush()
    _, parts, ended = chunks(client.transport.value())
    assert parts == [b"retry: 2000\n\n"] and not ended
    assert client.transport.disconnecting
    assert h.app.metrics.hot.inflight == 0


def test_an_answer_that_is_not_a_stream_is_passed_whole() -> None:
    """Events of an unknown job: the model's 404 JSON comes back with a Content-Length."""
    h = Harness()
    r, body = h.call("GET", f"{JOB}/job_nope/events", headers=AUTH)
    assert r.code == 404 and json.loads(body) == {"error": "job not found: job_nope"}
    assert h.app.metrics.hot.inflight == 0


def test_http10_client_gets_the_stream_unframed_then_a_close() -> None:
    """An HTTP/1.0 client gets the records without chunk framing and the connection
    closes at the stream's end."""
    h = Harness()
    client = Client(h)
    auth = f"Authorization: {AUTH['Authorization']}\r\n".encode()
    client.proto.dataReceived(b"GET " + JOB.encode() + b"/job_known/events HTTP/1.0\r\n" + auth
                              + b"\r\n")  # fmt: skip
    h.flush()
    h.model.streams[0][0].write(b"event: done\ndata: {}\n\n")
    h.model.streams[0][1].callback(b"")
    h.flush()
    raw = client.transport.value()
    assert b"Connection: close" in raw and b"Transfer-Encoding" not in raw
    assert raw.endswith(b"retry: 2000\n\nevent: done\ndata: {}\n\n")
    assert client.transport.disconnecting


def test_shutdown_ends_a_stream_in_progress_at_once() -> None:
    """drain() (SIGTERM) does not wait for an event stream, which lasts as long as its
    job: the client's answer ends complete, and the model's stream is released."""
    h = Harness()
    client, _ = open_stream(h)
    h.server.drain()
    h.flush()
    _, parts, ended = chunks(client.transport.value())
    assert parts == [b"retry: 2000\n\n"] and ended
    assert client.transport.disconnecting
    assert h.model.streams_closed == ["job_known"]
    assert h.app.metrics.hot.inflight == 0


def test_a_silent_upstream_stream_is_cut_after_the_idle_limit() -> None:
    """An upstream stream that sends nothing (not even the model's 15 s pings) for
    max(recv timeout, 60 s) is given up: the upstream connection is aborted and the
    client's answer cut; a byte before the limit restarts it."""
    h = Harness(recv_timeout_s=5.0)
    client, upstream = open_stream(h)
    h.clock.advance(59)
    upstream.write(b": ping\n\n")  # type: ignore[attr-defined]
    h.flush()
    h.clock.advance(59)
    h.flush()
    assert not client.transport.disconnecting
    h.clock.advance(1)
    h.flush()
    _, parts, ended = chunks(client.transport.value())
    assert parts == [b"retry: 2000\n\n", b": ping\n\n"] and not ended
    assert client.transport.disconnecting
    assert h.model.streams_closed == ["job_known"]
    assert h.app.metrics.hot.inflight == 0


def test_a_stream_whose_head_never_comes_is_504() -> None:
    """The model accepts the events request but sends no head within the receive
    timeout: 504, like any other route."""
    h = Harness(recv_timeout_s=2.0)
    h.sites[("127.0.0.1", 18100)] = Factory.forProtocol(Protocol)  # reads, never answers
    client = Client(h)
    client.send("GET", f"{JOB}/job_known/events", AUTH)
    assert client.answer() is None
    h.clock.advance(2.0)
    h.flush()
    answer = client.answer()
    assert answer is not None and answer[0].code == 504
    assert h.app.metrics.hot.inflight == 0

"""The gateway as a real process: key reload on SIGHUP, limits, timeouts, disconnects.

One control plane with ``FAKE_ASYNC`` and a gateway whose ``upstream_recv_timeout_ms``
is 1.5 s (so the 504 path is quick) and whose key file the tests rewrite.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.gateway.apikeys import hash_key

from .plane import ControlPlane, control_plane, wait_until

pytestmark = pytest.mark.slow

MODEL = "FAKE_ASYNC"
JOBS = f"/v1/models/{MODEL}/jobs"
BODY = {"images": ["aGk="], "params": {"delay_ms": 4000}}


def key_file(path: Path, *keys: tuple[str, str, float]) -> None:
    path.write_text(
        "".join(
            f'[[keys]]\nname = "{name}"\nsha256 = "{hash_key(key)}"\nrate_limit_qps = {qps}\n'
            for name, key, qps in keys
        )
    )


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    tmp: Path = tmp_path_factory.mktemp("gwproc")
    key_file(tmp / "api_keys.toml", ("old", "key-old", 0), ("slow", "key-slow", 1))
    env = {"MORTRED_METRICS_TOKEN": "metrics"}
    with control_plane(tmp, [MODEL], env=env, recv_timeout_ms=1500) as cp:
        cp.tmp = tmp  # type: ignore[attr-defined]
        cp.wait_ready(["gateway", MODEL])
        yield cp


def metric(plane: ControlPlane, name: str) -> float:
    code, _, body, _ = plane.gw("GET", "/metrics", token="metrics")
    assert code == 200
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def test_api_key_and_rate_limit(plane: ControlPlane) -> None:
    """A key from conf/api_keys.toml works; a 1 qps key gets 429 with Retry-After."""
    assert plane.gw("GET", f"{JOBS}/job_x", token="key-old")[0] == 404  # routed: model's 404
    plane.gw("GET", f"{JOBS}/job_x", token="key-slow")
    code, headers, _, _ = plane.gw("GET", f"{JOBS}/job_x", token="key-slow")
    assert code == 429 and headers["retry-after"] == "1"


def test_sighup_reloads_keys_without_dropping_requests(plane: ControlPlane) -> None:
    """After SIGHUP the new key works and the removed one is 401; a wait in flight survives."""
    _, _, body, _ = plane.gw("POST", JOBS, body=BODY, token="key-old")  # its own job
    job = json.loads(body)["job_id"]
    result: list[int] = []
    waiter = threading.Thread(
        target=lambda: result.append(
            plane.gw("GET", f"{JOBS}/{job}/wait?timeout=1000", token="key-old")[0]
        )
    )
    waiter.start()
    # The wait must be in flight (forwarded) before the reload, or it races it.
    wait_until(lambda: metric(plane, "mortred_gateway_inflight_requests") >= 1, 10, "in flight")
    key_file(plane.tmp / "api_keys.toml", ("new", "key-new", 0))  # type: ignore[attr-defined]
    os.kill(plane.status()["gateway"]["pid"], signal.SIGHUP)
    wait_until(lambda: plane.gw("GET", f"{JOBS}/job_x", token="key-new")[0] == 404, 10, "reload")
    assert plane.gw("GET", f"{JOBS}/job_x", token="key-old")[0] == 401
    waiter.join(10)
    assert result == [200]
    assert plane.status()["gateway"]["restart_count"] == 0


def test_body_over_limit_is_413_without_forwarding(plane: ControlPlane) -> None:
    """A Content-Length over request_size_limit_mb is refused right after the headers,
    and counted in the gateway's metrics."""
    with socket.create_connection(("127.0.0.1", plane.gw_port), timeout=10) as s:
        s.sendall(
            f"POST {JOBS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer e2e-gateway-token\r\n"
            "Content-Type: application/json\r\nContent-Length: 20000000\r\n\r\n".encode()
        )
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413")
    refused = 'mortred_gateway_requests_total{route="refused",status="413"}'
    assert metric(plane, refused) >= 1


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """``count`` (status, body) answers from a keep-alive socket (Content-Length framed)."""
    buf, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(buf) < length:
            buf += sock.recv(65536)
        answers.append((int(head.split(b" ")[1]), buf[:length]))
        buf = buf[length:]
    return answers


def test_pipelined_and_chunked_requests_on_one_connection(plane: ControlPlane) -> None:
    """Over a real socket: a chunked submit, a poll and a 404 sent back to back in one
    write are answered in order on the same keep-alive connection, and the chunked
    body reaches the model whole (the job runs)."""
    auth = "Authorization: Bearer e2e-gateway-token\r\nHost: x\r\n"
    body = json.dumps({"images": ["aGk="], "params": {"delay_ms": 10}}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7])
                       for i in range(0, len(body), 7)) + b"0\r\n\r\n"  # fmt: skip
    with socket.create_connection(("127.0.0.1", plane.gw_port), timeout=10) as s:
        s.sendall(
            f"POST {JOBS} HTTP/1.1\r\n{auth}Content-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode() + chunked
            + f"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            f"GET {JOBS}/job_nope HTTP/1.1\r\n{auth}\r\n".encode()
        )  # fmt: skip
        (submit, submitted), (health, _), (missing, _) = read_answers(s, 3)
        assert (submit, health, missing) == (202, 200, 404)
        job = json.loads(submitted)["job_id"]
        s.sendall(f"GET {JOBS}/{job}/wait?timeout=10000 HTTP/1.1\r\n{auth}\r\n".encode())
        ((status, view),) = read_answers(s, 1)
    assert status == 200 and json.loads(view)["state"] == "done"


def test_a_smuggled_request_is_refused_after_the_answers_before_it(plane: ControlPlane) -> None:
    """Over a real socket: a poll, a chunked submit whose chunk size is written 0x2a
    (CVE-2022-24801's shape) and a canary, in one write. The poll is answered, then
    the refusal (400), then the connection closes: the canary is never answered."""
    auth = "Authorization: Bearer e2e-gateway-token\r\nHost: x\r\n"
    smuggled = (
        f"POST {JOBS} HTTP/1.1\r\n{auth}Content-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0x2a\r\n".encode()
        + b'{"images":["aGk="],"params":{"x":"12345"}}\r\n0\r\n\r\n'
    )
    canary = b"GET /healthz HTTP/1.1\r\nHost: canary\r\n\r\n"
    with socket.create_connection(("127.0.0.1", plane.gw_port), timeout=10) as s:
        s.sendall(f"GET {JOBS}/job_nope HTTP/1.1\r\n{auth}\r\n".encode() + smuggled + canary)
        (poll, _), (refused, body) = read_answers(s, 2)
        rest = b""
        while chunk := s.recv(65536):  # until the gateway closes
            rest += chunk
    assert (poll, refused, rest) == (404, 400, b"")
    assert b"chunk size" in body


def test_413_reaches_a_client_that_keeps_uploading(plane: ControlPlane) -> None:
    """A client that sends its whole over-limit body without waiting (no Expect) still
    reads the 413: the gateway stops reading but drains before closing, instead of
    resetting the connection under the client's upload."""
    head = (
        f"POST {JOBS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer e2e-gateway-token\r\n"
        "Content-Type: application/json\r\nContent-Length: 20000000\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", plane.gw_port), timeout=10) as s:
        s.sendall(head)
        try:
            for _ in range(64):  # 4 MiB more, sent while the 413 is already on its way
                s.sendall(b"x" * 65536)
        except OSError:
            pass  # the gateway may stop taking bytes: the answer must still be readable
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413"), reply


def test_large_body_is_forwarded_whole(plane: ControlPlane) -> None:
    """A body far over one socket write (sent upstream with its head in one write)
    reaches the model intact: an invalid base64 image at its very end is the model's 422."""
    good = base64.b64encode(os.urandom(300_000)).decode()
    code, _, body, _ = plane.gw("POST", JOBS, body={"images": [good], "params": {"delay_ms": 10}})
    assert code == 202, body
    code, _, body, _ = plane.gw("POST", JOBS, body={"images": [good + "!"]})
    assert code == 422 and b"base64" in body.lower(), body


def test_upstream_slower_than_recv_timeout_is_504(plane: ControlPlane) -> None:
    """A wait budget above upstream_recv_timeout_ms is cut by the gateway with 504."""
    code, _, body, _ = plane.gw("POST", JOBS, body=BODY)
    job = json.loads(body)["job_id"]
    code, _, body, took = plane.gw("GET", f"{JOBS}/{job}/wait?timeout=30000")
    assert code == 504 and took >= 1.5 * 0.95  # not before the gateway's deadline
    # ... and at that deadline, not the job's end (4 s) or the 30 s wait budget:
    code, _, body, _ = plane.gw("GET", f"{JOBS}/{job}")
    assert code == 200 and json.loads(body)["state"] in ("pending", "running"), body


def test_client_disconnect_cancels_upstream(plane: ControlPlane) -> None:
    """A client that hangs up during a long wait releases the gateway's upstream request."""
    cancelled = 'mortred_gateway_requests_total{route="jobs_wait",status="499"}'
    cut = 'mortred_gateway_requests_total{route="jobs_wait",status="504"}'
    cancelled_before, cut_before = metric(plane, cancelled), metric(plane, cut)
    _, _, body, _ = plane.gw("POST", JOBS, body=BODY)
    job = json.loads(body)["job_id"]
    with socket.create_connection(("127.0.0.1", plane.gw_port), timeout=10) as s:
        s.sendall(
            f"GET {JOBS}/{job}/wait?timeout=60000 HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer e2e-gateway-token\r\n\r\n".encode()
        )
        wait_until(lambda: metric(plane, "mortred_gateway_inflight_requests") >= 1, 10, "in flight")
    wait_until(lambda: metric(plane, "mortred_gateway_inflight_requests") == 0, 30, "cancel")
    # The hang-up itself ended the forward (499), not the 1.5 s upstream deadline (504).
    assert metric(plane, cancelled) == cancelled_before + 1
    assert metric(plane, cut) == cut_before


def test_stopped_model_is_503_then_back(plane: ControlPlane) -> None:
    """With the model stopped the gateway answers 503; after start it routes again."""
    assert plane.api("POST", f"/api/v1/servers/{MODEL}/stop")[0] == 202
    wait_until(lambda: plane.status()[MODEL]["state"] == "stopped", 30, "stopped")
    code, _, body, _ = plane.gw("GET", f"{JOBS}/job_x")
    assert code == 503 and MODEL in json.loads(body)["error"]
    assert plane.api("POST", f"/api/v1/servers/{MODEL}/start")[0] == 202
    plane.wait_ready([MODEL])
    assert plane.gw("GET", f"{JOBS}/job_x")[0] == 404


def test_logs_follow_and_files(plane: ControlPlane) -> None:
    """The model's log is served by offset and written under log_dir."""
    code, _, body, _ = plane.api("GET", f"/api/v1/servers/{MODEL}/logs?offset=0&limit=1000")
    page: dict[str, Any] = json.loads(body)
    assert code == 200 and any("[supervisor] started pid" in x for x in page["lines"])
    assert (plane.log_dir / f"{MODEL}.log").stat().st_size > 0


def test_concurrent_clients_leave_nothing_behind(plane: ControlPlane) -> None:
    """32 keep-alive clients at once, mixing polls, 404s, pipelined pairs, submits and
    hang-ups in the middle of a long-poll: every request that was not abandoned is
    answered in order, and afterwards the gateway has no request in flight and no
    client connection open but the metrics scrape's own."""
    code, _, body, _ = plane.gw("POST", JOBS, body={"images": ["aGk="], "params": {"delay_ms": 0}})
    assert code == 202, body
    done = json.loads(body)["job_id"]
    assert plane.gw("GET", f"{JOBS}/{done}/wait?timeout=10000")[0] == 200
    code, _, body, _ = plane.gw(
        "POST", JOBS, body={"images": ["aGk="], "params": {"delay_ms": 4000}}
    )
    assert code == 202, body
    slow = json.loads(body)["job_id"]  # still running while clients hang up on its wait
    auth = "Authorization: Bearer e2e-gateway-token\r\nHost: x\r\n"
    poll = f"GET {JOBS}/{done} HTTP/1.1\r\n{auth}\r\n".encode()
    missing = f"GET {JOBS}/job_missing HTTP/1.1\r\n{auth}\r\n".encode()
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    small = json.dumps({"images": ["aGk="], "params": {"delay_ms": 0}}).encode()
    submit = (
        f"POST {JOBS} HTTP/1.1\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {len(small)}\r\n\r\n"
    ).encode() + small
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", plane.gw_port), timeout=30) as s:
                for r in range(24):
                    kind = (i + r) % 4
                    if kind == 0:
                        s.sendall(poll)
                        assert [c for c, _ in read_answers(s, 1)] == [200]
                    elif kind == 1:
                        s.sendall(missing)
                        assert [c for c, _ in read_answers(s, 1)] == [404]
                    elif kind == 2:
                        s.sendall(poll + health + missing)  # pipelined
                        assert [c for c, _ in read_answers(s, 3)] == [200, 200, 404]
                    elif r % 8 == 3:
                        s.sendall(submit)
                        assert read_answers(s, 1)[0][0] in (202, 429)  # 429: queue full
                    else:
                        s.sendall(poll)
                        assert read_answers(s, 1)[0][0] == 200
                if i % 4 == 0:  # hang up while a long-poll is being forwarded
                    s.sendall(
                        f"GET {JOBS}/{slow}/wait?timeout=60000 HTTP/1.1\r\n{auth}\r\n".encode()
                    )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in threads)

    def settled() -> bool:
        return (
            metric(plane, "mortred_gateway_inflight_requests") == 0
            and metric(plane, "mortred_gateway_open_connections") == 1
        )

    wait_until(settled, 15, "no request in flight and no connection left open")


def test_gateway_restart_lets_a_long_poll_finish(plane: ControlPlane) -> None:
    """A supervisor restart of the gateway (SIGTERM) while a long-poll is being
    forwarded: the gateway stops listening, lets the wait finish with its 200, then
    exits and comes back."""
    code, _, body, _ = plane.gw(
        "POST", JOBS, body={"images": ["aGk="], "params": {"delay_ms": 800}}
    )
    assert code == 202, body
    job = json.loads(body)["job_id"]
    answer: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answer.append(plane.gw("GET", f"{JOBS}/{job}/wait?timeout=1200"))
    )
    waiter.start()
    wait_until(lambda: metric(plane, "mortred_gateway_inflight_requests") >= 1, 10, "the wait")
    old_pid = plane.status()["gateway"]["pid"]
    assert plane.api("POST", "/api/v1/servers/gateway/restart")[0] == 202
    waiter.join(30)
    ((status, _, body, _),) = answer
    assert status == 200 and json.loads(body)["state"] == "done", body

    def back() -> bool:
        gw = plane.status().get("gateway", {})
        return bool(gw.get("ready")) and gw.get("pid") not in (None, old_pid)

    wait_until(back, 30, "a new gateway process, ready")
    assert plane.gw("GET", "/healthz", token=None)[0] == 200

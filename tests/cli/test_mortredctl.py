"""mortredctl against a scripted HTTP server (stdlib, in a thread): output and exit codes."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from mortred_twisted.cli.mortredctl import main

STATUS = {
    "servers": [
        {
            "id": "gateway",
            "kind": "gateway",
            "state": "running",
            "ready": True,
            "pid": 10,
            "restart_count": 0,
            "last_exit": None,
            "error": None,
        },
        {
            "id": "DDPM",
            "kind": "model",
            "state": "failed",
            "ready": False,
            "pid": None,
            "restart_count": 5,
            "last_exit": {"text": "exited with code 1"},
            "error": "crash loop: 5 restarts in 60 s",
        },
    ]
}


class Scripted(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str, Any]] = []
    headers: list[dict[str, str]] = []
    polls = 0

    def log_message(self, *args: Any) -> None:
        pass

    def reply(self, code: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        auth = self.headers.get("Authorization", "")
        Scripted.seen.append((method, self.path, auth, body))
        Scripted.headers.append(dict(self.headers))
        if auth not in ("Bearer mgmt", "Bearer gw"):
            return self.reply(401, {"error": "unauthorized"})
        p = self.path
        if p == "/api/v1/status":
            return self.reply(200, STATUS)
        if p == "/api/v1/servers/DDPM/restart":
            return self.reply(202, {"id": "DDPM", "state": "stopped", "pid": None})
        if p.startswith("/api/v1/servers/DDPM/logs"):
            return self.reply(200, {"lines": ["a", "b"], "next_offset": 2})
        if p == "/api/v1/infer":
            return self.reply(202 if body.get("async") else 200,
                              {"job_id": "job_1", "state": "pending",
                               "poll_url": "/api/v1/jobs/DDPM/job_1"})  # fmt: skip
        if p.startswith("/v1/models/DDPM/jobs/job_1/wait") or p.startswith(
            "/api/v1/jobs/DDPM/job_1/wait"
        ):
            Scripted.polls += 1
            state = "done" if Scripted.polls >= 3 else "running"
            return self.reply(200, {"job_id": "job_1", "state": state,
                                    "elapsed_ms": 100 * Scripted.polls})  # fmt: skip
        if p.endswith("/job_4/result"):
            return self.reply(409, {"error": "job not finished (state: failed)", "code": 64})
        if p == "/v1/models/DDPM/jobs/job_4":
            return self.reply(200, {"job_id": "job_4", "state": "failed", "error": "boom"})
        if p.endswith("/job_1/result"):
            return self.reply(200, {"code": 0, "msg": "success", "data": {}})
        if method == "DELETE" and p == "/v1/models/DDPM/jobs/job_2":
            return self.reply(202, {"job_id": "job_2", "state": "running",
                                    "cancel_requested": True})  # fmt: skip
        if method == "DELETE" and p == "/v1/models/DDPM/jobs/job_9":
            return self.reply(409, {"error": "job already finished (state: done)"})
        if p.startswith("/v1/models/DDPM/jobs?") and "cursor=c2" in p:
            return self.reply(200, {"jobs": [{"job_id": "job_0", "state": "done"}],
                                    "next_cursor": None})  # fmt: skip
        if p.startswith("/v1/models/DDPM/jobs?"):
            return self.reply(200, {"jobs": [
                {"job_id": "job_3", "state": "pending", "queue_position": 1, "elapsed_ms": 5},
                {"job_id": "job_2", "state": "running", "progress": {"step": 2, "total": 4},
                 "elapsed_ms": 9}], "next_cursor": "c2"})  # fmt: skip
        if p == "/v1/models/DDPM/jobs/job_1/events":
            return self.stream_events()
        if p == "/v1/models/DDPM/jobs" and method == "POST":
            return self.reply(202, {"job_id": "job_1", "state": "pending",
                                    "poll_url": "/v1/models/DDPM/jobs/job_1"})  # fmt: skip
        if p == "/v1/models/DDPM/queue":
            return self.reply(200, {"depth": 3, "pending": 2, "running": 1,
                                    "oldest_wait_ms": 40, "max_queue": 8, "callers": [
                {"caller": "key:alice", "pending": 2, "running": 0, "oldest_wait_ms": 40,
                 "max_pending": 5},
                {"caller": "key:bob", "pending": 0, "running": 1, "oldest_wait_ms": 0,
                 "max_pending": 0}]})  # fmt: skip
        if p == "/api/v1/servers/NOPE/start":
            return self.reply(404, {"error": "unknown server: NOPE"})
        return self.reply(404, {"error": "not found"})

    def stream_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for n, (name, doc) in enumerate([
            ("state", {"job_id": "job_1", "state": "pending"}),
            ("progress", {"job_id": "job_1", "state": "running",
                          "progress": {"step": 1, "total": 2}}),
            ("done", {"job_id": "job_1", "state": "done"}),
        ]):  # fmt: skip
            self.wfile.write(b": ping\n\n")
            self.wfile.write(f"id: {n}\nevent: {name}\ndata: {json.dumps(doc)}\n\n".encode())
            self.wfile.flush()

    def do_GET(self) -> None:
        self.handle_any("GET")

    def do_DELETE(self) -> None:
        self.handle_any("DELETE")

    def do_POST(self) -> None:
        self.handle_any("POST")


@pytest.fixture()
def server() -> Iterator[str]:
    Scripted.seen = []
    Scripted.headers = []
    Scripted.polls = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def run(addr: str, *argv: str, token: str = "mgmt") -> tuple[int, str]:
    out = io.StringIO()
    code = main(["--addr", addr, "--token", token, *argv], out=out)
    return code, out.getvalue()


def test_status_table(server: str) -> None:
    """status prints one row per server with state, readiness and the error."""
    code, text = run(server, "status")
    assert code == 0
    assert "DDPM" in text and "failed" in text and "crash loop" in text and "gateway" in text


def test_restart_and_logs(server: str) -> None:
    """restart POSTs the action; logs prints the lines."""
    assert run(server, "restart", "DDPM")[0] == 0
    assert ("POST", "/api/v1/servers/DDPM/restart", "Bearer mgmt", None) in Scripted.seen
    code, text = run(server, "logs", "DDPM")
    assert code == 0 and text == "a\nb\n"


def test_errors_exit_1_and_usage_exit_2(server: str) -> None:
    """HTTP errors and a wrong token exit 1; a bad command line exits 2."""
    assert run(server, "start", "NOPE")[0] == 1
    assert run(server, "status", token="wrong")[0] == 1
    assert run("http://127.0.0.1:1", "status")[0] == 1
    with pytest.raises(SystemExit) as e:
        main(["bogus"])
    assert e.value.code == 2
    assert run(server, "infer", "DDPM", "--params", "{not json")[0] == 2


def test_jobs_submit_wait_result_via_supervisor(server: str, tmp_path: Any) -> None:
    """submit sends the image as base64; wait long-polls until done; result prints it."""
    img = tmp_path / "x.png"
    img.write_bytes(b"pixels")
    code, text = run(server, "jobs", "submit", "DDPM", "--image", str(img),
                     "--params", '{"timesteps": 10}')  # fmt: skip
    assert code == 0 and json.loads(text)["job_id"] == "job_1"
    body = Scripted.seen[-1][3]
    assert body == {"server_id": "DDPM", "async": True, "images": ["cGl4ZWxz"],
                    "params": {"timesteps": 10}}  # fmt: skip
    code, text = run(server, "jobs", "wait", "/api/v1/jobs/DDPM/job_1", "-q")
    assert code == 0 and json.loads(text)["state"] == "done" and Scripted.polls == 3
    code, text = run(server, "jobs", "result", "/api/v1/jobs/DDPM/job_1")
    assert code == 0 and json.loads(text)["code"] == 0


def test_gateway_job_url_needs_gateway(server: str) -> None:
    """A /v1/models job URL uses the gateway address and token."""
    assert run(server, "jobs", "result", "/v1/models/DDPM/jobs/job_1")[0] == 2
    code, _ = run(server, "--gateway", server, "--gateway-token", "gw",
                  "jobs", "result", "/v1/models/DDPM/jobs/job_1")  # fmt: skip
    assert code == 0 and Scripted.seen[-1][2] == "Bearer gw"


def test_keys_new_prints_matching_hash() -> None:
    """keys new prints a key and an api_keys.toml entry with its sha256."""
    import hashlib
    import tomllib

    out = io.StringIO()
    assert main(["keys", "new", "--name", "ci", "--qps", "5"], out=out) == 0
    first, _, entry = out.getvalue().partition("\n")
    key = first.rsplit(" ", 1)[1]
    doc = tomllib.loads(entry)
    assert doc["keys"][0]["sha256"] == hashlib.sha256(key.encode()).hexdigest()
    assert doc["keys"][0]["rate_limit_qps"] == 5


def gw_run(addr: str, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["--gateway", addr, "--gateway-token", "gw", "--json", *argv], out=out)
    return code, out.getvalue()


def test_jobs_cancel_get_list_through_the_gateway(server: str) -> None:
    """cancel DELETEs the gateway job path; a finished job's 409 exits 1; list shows rows."""
    code, text = gw_run(server, "jobs", "cancel", "job_2", "--model", "DDPM")
    assert code == 0 and json.loads(text)["cancel_requested"] is True
    assert ("DELETE", "/v1/models/DDPM/jobs/job_2", "Bearer gw", None) in Scripted.seen
    assert gw_run(server, "jobs", "cancel", "/v1/models/DDPM/jobs/job_9")[0] == 1
    out = io.StringIO()
    code = main(["--gateway", server, "--gateway-token", "gw", "jobs", "list", "DDPM",
                 "--state", "pending,running", "--limit", "2"], out=out)  # fmt: skip
    assert code == 0
    assert "job_3" in out.getvalue() and "2/4" in out.getvalue() and "--cursor c2" in out.getvalue()
    listed = [s for s in Scripted.seen if s[1].startswith("/v1/models/DDPM/jobs?")]
    assert "state=pending%2Crunning" in listed[0][1] and "limit=2" in listed[0][1]


def test_jobs_watch_follows_the_event_stream_to_the_terminal_event(server: str) -> None:
    """watch reads SSE events as they come (comments skipped) and prints the last status."""
    code, text = gw_run(server, "jobs", "watch", "job_1", "--model", "DDPM", "-q")
    assert code == 0 and json.loads(text)["state"] == "done"


def test_submit_sends_idempotency_key_and_webhook_then_watches(server: str) -> None:
    """submit --wait through the gateway sends the key and webhook, then follows the events."""
    code, text = gw_run(server, "jobs", "submit", "DDPM", "--idempotency-key", "k-1",
                        "--webhook", "https://hooks.example.com/x", "--webhook-events",
                        "completed", "--wait", "-q")  # fmt: skip
    assert code == 0 and '"state": "done"' in text
    posted = [s for s in Scripted.seen if s[0] == "POST" and s[1] == "/v1/models/DDPM/jobs"]
    assert posted[0][3]["webhook"] == "https://hooks.example.com/x"
    assert posted[0][3]["webhook_events_filter"] == ["completed"]
    assert any(h.get("Idempotency-Key") == "k-1" for h in Scripted.headers)


def test_jobs_list_all_follows_every_page(server: str) -> None:
    """jobs list --all follows next_cursor to the last page and prints every job."""
    code, text = gw_run(server, "jobs", "list", "DDPM", "--all", "--limit", "2")
    assert code == 0
    assert [j["job_id"] for j in json.loads(text)["jobs"]] == ["job_3", "job_2", "job_0"]
    assert [s[1] for s in Scripted.seen] == [
        "/v1/models/DDPM/jobs?limit=2",
        "/v1/models/DDPM/jobs?limit=2&cursor=c2",
    ]


def test_result_of_a_failed_job_exits_1_with_its_error(server: str, capsys: Any) -> None:
    """jobs result of a failed job exits 1 and says how it ended."""
    code, _ = gw_run(server, "jobs", "result", "/v1/models/DDPM/jobs/job_4/result")
    assert code == 1
    assert "job job_4 ended failed: boom" in capsys.readouterr().err


def test_gateway_submit_sends_a_generated_idempotency_key(server: str) -> None:
    """Without --idempotency-key, a gateway submit still carries a generated key, so
    the client may retry it."""
    assert gw_run(server, "jobs", "submit", "DDPM")[0] == 0
    assert Scripted.headers[-1].get("Idempotency-Key", "").startswith("mc-")


def test_queue_shows_the_models_queue_per_caller(server: str) -> None:
    """queue GETs /v1/models/<id>/queue and prints the totals and one row per caller."""
    out = io.StringIO()
    code = main(["--gateway", server, "--gateway-token", "gw", "queue", "DDPM"], out=out)
    text = out.getvalue()
    assert code == 0 and "depth 3/8" in text and "oldest wait 40 ms" in text
    assert "key:alice" in text and "key:bob" in text
    assert ("GET", "/v1/models/DDPM/queue", "Bearer gw", None) in Scripted.seen

"""Issue 40 end to end: the control plane trusts only its own children.

Real processes and sockets on 127.0.0.1: a supervisor (``twistd -n
mortred-supervisor``) with its gateway and model children, and a *squatter*, a
plain HTTP server in this test process that answers 200 ``{"ready": true}`` to
every request and records what it received. Checked: a held port is a failed start
(``start_failed`` with the port, "address in use" and the holder), the squatter
never passes for the child and never receives a request through the gateway, nor
the internal token; no child outlives a supervisor killed with SIGKILL at several
points of a child's start; and the same with replicas on the Redis store, where a
replica's port is taken after its process died.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.config.catalog import build_catalog, discover
from mortred_twisted.config.control import load_control_config
from mortred_twisted.supervisor.ports import port_free
from mortred_twisted.supervisor.process import model_spec
from tests.control.plane import API_TOKEN, GW_TOKEN, ControlPlane, pid_alive
from tests.e2e.test_fleet import IMG, MODEL, two_free_ports
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAKE = "FAKE_ASYNC"
BODY = {"images": ["aGVsbG8="], "params": {"delay_ms": 10}}


class Squatter:
    """Another process's server on a port: 200 to everything, every request kept."""

    def __init__(self, port: int) -> None:
        seen: list[tuple[str, str, dict[str, str]]] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                seen.append(
                    (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                body = b'{"ready": true, "code": 0}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def authorized(self) -> list[tuple[str, str]]:
        """Requests that carried any Authorization header (a token)."""
        return [(m, p) for m, p, h in self.seen if "authorization" in h]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def squatter(port: int) -> Iterator[Squatter]:
    s = Squatter(port)
    try:
        yield s
    finally:
        s.close()


def _start(
    tmp: Path,
    lines: list[str],
    env: dict[str, str],
    ports: dict[str, int],
    before: Callable[[Path], Any] | None = None,
) -> ControlPlane:
    conf = tmp / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "mortred.toml").write_text("\n".join(lines) + "\n")
    if before is not None:
        before(conf / "mortred.toml")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
    child_env.update(
        PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", MORTRED_API_TOKEN=API_TOKEN,
        MORTRED_GATEWAY_AUTH_TOKEN=GW_TOKEN, **env,
    )  # fmt: skip
    cmd = [
        sys.executable, "-m", "mortred_twisted.supervisor.launch", "-n", "--pidfile=",
        "--logfile=-", "mortred-supervisor", "--config", str(conf / "mortred.toml"),
    ]  # fmt: skip
    process = subprocess.Popen(
        cmd, cwd=str(tmp), env=child_env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return ControlPlane(process, ports["api"], ports["gateway"], ports, tmp / "logs")


@contextmanager
def plane(
    tmp: Path,
    port: int,
    *,
    env: dict[str, str] | None = None,
    policy: str = "on-failure",
    before: Callable[[Path], Any] | None = None,
) -> Iterator[ControlPlane]:
    """FAKE_ASYNC alone on ``port`` (the shipped catalog, others disabled);
    ``before(config path)`` runs once the config is written, before the start."""
    ports = {"api": free_port(), "gateway": free_port(), FAKE: port}
    entries, problems = discover(ROOT / "conf" / "server", ROOT)
    assert not problems
    lines = [
        "[supervisor]",
        f'catalog_dir = "{ROOT / "conf" / "server"}"',
        f"api_port = {ports['api']}",
        f'log_dir = "{tmp / "logs"}"',
        "probe_interval_ms = 100",
        "stop_grace_s = 10",
        "[gateway]",
        f"port = {ports['gateway']}",
        f'api_keys = "{tmp / "api_keys.toml"}"',
    ]
    for e in entries:
        lines.append(f"[servers.{e.id}]")
        if e.id == FAKE:
            lines += [f"port = {port}", f'restart_policy = "{policy}"']
        else:
            lines.append("enabled = false")
    cp = _start(tmp, lines, env or {}, ports, before)
    try:
        yield cp
    finally:
        cp.stop()


def state_of(cp: ControlPlane, sid: str) -> dict[str, Any]:
    doc = cp.status().get(sid.split("@")[0], {})
    if "@" in sid:
        return next((r for r in doc.get("replicas", []) if r["id"] == sid), {})
    return doc


def wait_state(cp: ControlPlane, sid: str, check: Any, what: str) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        if cp.process.poll() is not None:
            raise AssertionError("supervisor exited:\n" + "".join(cp.output[-60:]))
        s = state_of(cp, sid)
        return s if s and check(s) else None

    try:
        return wait_until(ok, 90, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {state_of(cp, sid)}") from None


def mortredctl_status(cp: ControlPlane) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mortred_twisted.cli.mortredctl", "--addr",
         f"http://127.0.0.1:{cp.api_port}", "--token", API_TOKEN, "status"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_port_held_by_another_process_is_a_failed_start_with_no_traffic_and_no_token(
    tmp_path: Path,
) -> None:
    port = free_port()
    with squatter(port) as sq, plane(tmp_path, port) as cp:
        s = wait_state(cp, FAKE, lambda s: s["state"] == "start_failed", "start_failed")
        assert f"127.0.0.1:{port}" in s["error"] and "address in use" in s["error"]
        assert f"pid {os.getpid()}" in s["error"]  # the holder, named
        assert not s["ready"] and s["pid"] is None
        wait_until(lambda: any("autostart finished" in line for line in cp.output), 60, "autostart")
        done = next(line for line in cp.output if "autostart finished" in line)
        assert f"'{FAKE}': False" in done
        assert "start_failed" in mortredctl_status(cp)
        wait_state(cp, "gateway", lambda s: s["ready"], "gateway ready")
        code, _, body, _ = cp.gw("POST", f"/v1/models/{FAKE}/jobs", body=BODY)
        assert code == 503, body
        assert "not ready (start_failed)" in json.loads(body)["error"]
        code, _, body, _ = cp.gw("POST", f"/v1/models/{FAKE}/infer", body=BODY)
        assert code == 503, body
        assert sq.seen == []  # nothing reached it: no request, no token


def test_a_squatter_that_answers_ready_is_never_taken_for_the_child(tmp_path: Path) -> None:
    """The child is held before it binds (a test gate in its launcher); the squatter
    takes the port then and answers the supervisor's /ready with 200. The supervisor
    does not take that answer (no proof of the spawn key), the gateway sends it
    nothing, and once released the child cannot bind: start_failed."""
    port = free_port()
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "other").touch()  # the gateway goes on
    with plane(tmp_path, port, env={"MORTRED_TEST_LAUNCH_GATE": str(gate)}) as cp:
        wait_state(cp, FAKE, lambda s: s["pid"], "child spawned")
        with squatter(port) as sq:
            s = wait_state(
                cp, FAKE, lambda s: "answered by another process" in (s["error"] or ""), "impostor"
            )
            assert s["state"] == "starting" and not s["ready"]
            wait_state(cp, "gateway", lambda s: s["ready"], "gateway ready")
            code, _, body, _ = cp.gw("POST", f"/v1/models/{FAKE}/jobs", body=BODY)
            assert code == 503, body
            probes = [(m, p, h) for m, p, h in sq.seen]
            assert probes and all(p == "/ready" for _, p, _ in probes)
            assert all("x-mortred-challenge" in h for _, _, h in probes)
            assert sq.authorized() == []
            (gate / str(port)).touch()  # the child goes on, and cannot listen
            s = wait_state(cp, FAKE, lambda s: s["state"] == "start_failed", "start_failed")
            assert "address in use" in s["error"] and f"127.0.0.1:{port}" in s["error"]
            assert (s["last_exit"] or {}).get("code") == 75
            assert sq.authorized() == []


def test_a_leftover_of_an_earlier_run_is_stopped_and_its_port_used(tmp_path: Path) -> None:
    """A model server running exactly the command this supervisor would spawn on the
    port (what a killed supervisor leaves behind) is stopped at start, and the
    supervisor's own child takes the port."""
    port = free_port()
    leftover: list[subprocess.Popen[str]] = []

    def run_leftover(config: Path) -> None:
        control = load_control_config(config)
        entry = build_catalog(control).get(FAKE)
        assert entry is not None
        spec = model_spec(entry, control, "", {"PATH": os.environ.get("PATH", "")})
        env = {**os.environ, **spec.env, "MORTRED_PARENT_DEATH_SIGNAL": "0"}
        proc = subprocess.Popen(
            spec.argv, cwd=spec.cwd, env=env, stdout=subprocess.DEVNULL, text=True
        )
        leftover.append(proc)

        def listening() -> bool:
            assert proc.poll() is None, "the leftover did not start"
            return not port_free("127.0.0.1", port)

        wait_until(listening, 60, "the leftover listening")

    try:
        with plane(tmp_path, port, before=run_leftover) as cp:
            s = wait_state(cp, FAKE, lambda s: s["ready"], "our child ready")
            assert leftover[0].wait(30) is not None  # stopped by the supervisor
            assert s["pid"] != leftover[0].pid
            line = f"stopping a leftover of an earlier run (pid {leftover[0].pid}"
            log = tmp_path / "logs" / f"{FAKE}.log"
            wait_until(lambda: line in log.read_text(), 30, "the leftover named in the log")
            wait_state(cp, "gateway", lambda s: s["ready"], "gateway ready")
            code, _, body, _ = cp.gw("POST", f"/v1/models/{FAKE}/jobs", body=BODY)
            assert code == 202, body
    finally:
        for p in leftover:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _children(cp: ControlPlane) -> list[int]:
    pids: list[int] = []
    for s in cp.status().values():
        pids += [r["pid"] for r in s.get("replicas", [s]) if r.get("pid")]
    return pids


@pytest.mark.parametrize("point", ["before_death_signal", "just_spawned", "ready"])
def test_no_child_outlives_a_supervisor_killed_during_its_start(tmp_path: Path, point: str) -> None:
    """SIGKILL to the supervisor: before the child asked for its parent-death signal
    (held at the launcher's test gate, released after the kill: it finds its parent
    gone and exits), right after the spawn (the child is still importing), and once
    ready. Every child is gone within a few seconds."""
    port = free_port()
    env: dict[str, str] = {}
    gate = tmp_path / "gate"
    if point == "before_death_signal":
        gate.mkdir()
        (gate / "other").touch()
        env["MORTRED_TEST_LAUNCH_GATE"] = str(gate)
    with plane(tmp_path, port, env=env) as cp:
        if point == "ready":
            cp.wait_ready([FAKE, "gateway"])
        else:
            wait_state(cp, FAKE, lambda s: s["pid"], "child spawned")
        pids = wait_until(lambda: _children(cp) if len(_children(cp)) == 2 else None, 60, "pids")
        assert all(pid_alive(p) for p in pids) or point == "just_spawned"
        cp.process.send_signal(signal.SIGKILL)
        cp.process.wait(10)
        if point == "before_death_signal":
            (gate / str(port)).touch()
        wait_until(lambda: not any(pid_alive(p) for p in pids), 30, f"children {pids} gone")


@contextmanager
def replicas_plane(
    tmp: Path, redis: RedisServer, before: Callable[[int], Any] | None = None
) -> Iterator[tuple[ControlPlane, int]]:
    """FAKE_REPLICAS with 2 replicas on the Redis store; restart policy 'no', so a
    replica killed by the test stays down and its port can be taken. ``before(port)``
    runs before the supervisor starts (``port``: replica 1's)."""
    ports = {"api": free_port(), "gateway": free_port()}
    port = two_free_ports(avoid=(ports["api"], ports["gateway"]))
    ports[MODEL] = port
    lines = [
        "[supervisor]",
        f'catalog_dir = "{ROOT / "conf" / "replicas" / "server"}"',
        f"api_port = {ports['api']}",
        f'log_dir = "{tmp / "logs"}"',
        "probe_interval_ms = 100",
        "[gateway]",
        f"port = {ports['gateway']}",
        f'api_keys = "{tmp / "api_keys.toml"}"',
        f"[servers.{MODEL}]",
        f"port = {port}",
        "replicas = 2",
        'restart_policy = "no"',
    ]
    if before is not None:
        before(port)
    cp = _start(tmp, lines, {"MORTRED_REDIS_URL": redis.url}, ports)
    try:
        yield cp, port
    finally:
        cp.stop()


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def _bind_when_free(port: int) -> Squatter:
    def attempt() -> Squatter | None:
        try:
            return Squatter(port)
        except OSError:
            return None

    return wait_until(attempt, 30, f"port {port} free")


def test_replicas_on_redis_a_port_taken_after_its_replica_died_gets_nothing(
    tmp_path: Path, redis: RedisServer
) -> None:
    """Both replicas serve; replica 2 is SIGKILLed and a squatter takes its port at
    once. Every submit through the gateway goes to replica 1 and is answered; the
    squatter receives nothing (the gateway withdrew its trust when the process
    ended, before it could be taken), and the supervisor reports replica 2's port as
    held when asked to start it again."""
    with replicas_plane(tmp_path, redis) as (cp, port):
        cp.wait_ready([MODEL, "gateway"])
        wait_state(cp, MODEL, lambda s: s["ready_replicas"] == 2, "2 replicas ready")
        body = {"images": [IMG], "params": {"delay_ms": 5}}
        code, _, text, _ = cp.gw("POST", f"/v1/models/{MODEL}/jobs", body=body)
        assert code == 202, text
        victim = state_of(cp, f"{MODEL}@2")["pid"]
        os.kill(victim, signal.SIGKILL)
        sq = _bind_when_free(port + 1)
        try:
            for _ in range(6):
                code, _, text, _ = cp.gw("POST", f"/v1/models/{MODEL}/jobs", body=body)
                assert code == 202, text
                job = json.loads(text)["job_id"]
                code, _, text, _ = cp.gw("GET", f"/v1/models/{MODEL}/jobs/{job}/wait?timeout=20000")
                assert code == 200 and json.loads(text)["state"] == "done", text
            assert sq.seen == []
            code, _, text, _ = cp.api("POST", f"/api/v1/servers/{MODEL}@2/start")
            assert code == 202, text
            s = wait_state(
                cp, f"{MODEL}@2", lambda s: s["state"] == "start_failed", "replica 2 refused"
            )
            assert f"127.0.0.1:{port + 1}" in s["error"] and "address in use" in s["error"]
            assert sq.authorized() == []
        finally:
            sq.close()


def test_replicas_on_redis_a_replica_port_held_at_start_is_refused_and_gets_nothing(
    tmp_path: Path, redis: RedisServer
) -> None:
    """Replica 2's port is held (by a server that answers /ready 200) before the
    supervisor starts: replica 2 is start_failed naming the holder, replica 1 serves
    every job through the gateway, and the squatter receives nothing."""
    held: list[Squatter] = []
    try:
        with replicas_plane(tmp_path, redis, lambda p: held.append(Squatter(p + 1))) as (
            cp,
            port,
        ):
            s = wait_state(
                cp, f"{MODEL}@2", lambda s: s["state"] == "start_failed", "replica 2 refused"
            )
            assert f"127.0.0.1:{port + 1}" in s["error"] and f"pid {os.getpid()}" in s["error"]
            wait_state(cp, f"{MODEL}@1", lambda s: s["ready"], "replica 1 ready")
            wait_state(cp, "gateway", lambda s: s["ready"], "gateway ready")
            body = {"images": [IMG], "params": {"delay_ms": 5}}
            for _ in range(6):
                code, _, text, _ = cp.gw("POST", f"/v1/models/{MODEL}/jobs", body=body)
                assert code == 202, text
                job = json.loads(text)["job_id"]
                code, _, text, _ = cp.gw("GET", f"/v1/models/{MODEL}/jobs/{job}/wait?timeout=20000")
                assert code == 200 and json.loads(text)["state"] == "done", text
            assert held[0].seen == []
    finally:
        for sq in held:
            sq.close()

"""Issue 40 in a real model-server process: a port it cannot bind is a failed start
(non-zero exit, the reason logged, nothing loaded), and ``/ready`` proves the
spawn key it was given."""

from __future__ import annotations

import socket

from mortred_twisted.supervisor.child_contract import (
    EXIT_CANNOT_LISTEN,
    SPAWN_KEY_ENV,
    new_challenge,
    new_spawn_key,
    proves,
)
from tests.support.servers import model_server

CONFIG = "conf/server/fake/fake_async.toml"


def test_a_port_held_by_another_process_is_a_non_zero_exit_with_the_reason() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with model_server(CONFIG, env={"MORTRED_LISTEN_PORT": str(port)}, wait_ready=False) as srv:
            code = srv.process.wait(60)
            srv._reader.join(10)
    log = "".join(srv.log)
    assert code == EXIT_CANNOT_LISTEN, log
    assert f"cannot listen on 127.0.0.1:{port}" in log
    assert "Address already in use" in log
    assert "worker(s)" not in log  # no model was loaded


def test_ready_answers_the_challenge_with_the_proof_of_its_spawn_key() -> None:
    key = new_spawn_key()
    with model_server(CONFIG, env={SPAWN_KEY_ENV: key}) as srv:
        challenge = new_challenge()
        status, headers, _ = srv.request(
            "GET", "/ready", headers={"X-Mortred-Challenge": challenge.decode()}
        )
        assert status == 200
        assert proves(key, challenge, headers["x-mortred-proof"].encode())
        # Without a challenge, or with an oversized one, nothing is proven.
        _, headers, _ = srv.request("GET", "/ready")
        assert "x-mortred-proof" not in headers
        _, headers, _ = srv.request("GET", "/ready", headers={"X-Mortred-Challenge": "x" * 129})
        assert "x-mortred-proof" not in headers

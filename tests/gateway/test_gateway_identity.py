"""Issue 40.2 for the gateway child: its ``/healthz`` (the supervisor's readiness
probe of it) proves the spawn key it was given, and only on a challenge."""

from __future__ import annotations

from mortred_twisted.supervisor.child_contract import new_challenge, new_spawn_key, proves

from .test_gateway_app import Harness


def test_healthz_answers_the_challenge_with_the_proof_of_the_spawn_key() -> None:
    h = Harness()
    key = new_spawn_key()
    h.app.spawn_key = key
    challenge = new_challenge()
    response, _ = h.call("GET", "/healthz", headers={"X-Mortred-Challenge": challenge.decode()})
    answer = response.headers.getRawHeaders(b"x-mortred-proof")
    assert response.code == 200 and answer and proves(key, challenge, answer[0])
    response, _ = h.call("GET", "/healthz")  # no challenge: nothing proven
    assert response.headers.getRawHeaders(b"x-mortred-proof") is None
    response, _ = h.call("GET", "/healthz", headers={"X-Mortred-Challenge": "x" * 500})
    assert response.headers.getRawHeaders(b"x-mortred-proof") is None


def test_an_unsupervised_gateway_proves_nothing() -> None:
    h = Harness()
    response, _ = h.call("GET", "/healthz", headers={"X-Mortred-Challenge": "abc"})
    assert response.code == 200 and response.headers.getRawHeaders(b"x-mortred-proof") is None

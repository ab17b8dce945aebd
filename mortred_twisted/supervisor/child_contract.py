"""What a supervised child and its supervisor agree on (pure; stdlib only).

This module is imported first by the child's launcher, before twistd and the rest
of the code base, so it imports nothing but the standard library.

**Identity.** At each spawn the supervisor draws a secret, the *spawn key*, and puts
it in the child's environment (:data:`SPAWN_KEY_ENV`; never inherited further: it
is one of the variables :mod:`~mortred_twisted.supervisor.process` strips). A
readiness probe carries a fresh random *challenge* (:data:`CHALLENGE_HEADER`); the
child answers with ``HMAC-SHA256(spawn key, challenge)`` (:data:`PROOF_HEADER`).
Another process on the child's port knows neither the key nor (since the
challenge changes at every probe) any earlier proof, so it cannot pass for the
child; the key never travels on the wire.

**Parent.** The supervisor's pid is in :data:`SUPERVISOR_PID_ENV`. The launcher
asks the kernel for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``), *then*
checks that its parent is still that pid, and exits at once if not (the parent
died before the request: the kernel would never send the signal). Together they
leave no window in which a child can outlive its supervisor unnoticed.

**Exit codes.** A model server that cannot listen on its port exits with
:data:`EXIT_CANNOT_LISTEN` after logging the reason; the supervisor reports that
start as ``start_failed`` (it does not restart it: the port is someone else's).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import signal
import sys
import time
from collections.abc import Mapping

#: The per-spawn secret (urlsafe base64 text), in the child's environment only.
SPAWN_KEY_ENV = "MORTRED_SPAWN_KEY"
#: The pid the child must have as its parent (the supervisor).
SUPERVISOR_PID_ENV = "MORTRED_SUPERVISOR_PID"
#: "1": the launcher sets the parent-death signal and checks the parent.
PARENT_DEATH_ENV = "MORTRED_PARENT_DEATH_SIGNAL"
#: Testing only: a directory; the launcher waits for the file ``<dir>/<its listen
#: port>`` (``<dir>/other`` for a child without one, the gateway) to exist before
#: it asks for the parent-death signal, so a test can kill the supervisor inside
#: that window, or take the port before the child binds it.
LAUNCH_GATE_ENV = "MORTRED_TEST_LAUNCH_GATE"

CHALLENGE_HEADER = b"x-mortred-challenge"
PROOF_HEADER = b"x-mortred-proof"
#: The longest challenge a child answers (a probe sends 32 hex digits).
MAX_CHALLENGE = 128

#: A model server's exit status when it cannot listen on its port (EX_UNAVAILABLE
#: of sysexits.h is 69; this is distinct from every code twistd or Python uses).
EXIT_CANNOT_LISTEN = 75
#: The launcher's exit status when its parent is not the supervisor any more.
EXIT_ORPHANED = 76


def new_spawn_key() -> str:
    """A fresh spawn key (256 bits)."""
    return secrets.token_urlsafe(32)


def new_challenge() -> bytes:
    """A fresh probe challenge (128 bits as 32 hex digits)."""
    return secrets.token_hex(16).encode("ascii")


def proof(key: str, challenge: bytes) -> bytes:
    """The child's answer to ``challenge``: hex HMAC-SHA256 keyed by the spawn key."""
    return hmac.new(key.encode("utf-8"), challenge, hashlib.sha256).hexdigest().encode("ascii")


def proves(key: str, challenge: bytes, answer: bytes | None) -> bool:
    """True when ``answer`` is the proof of ``challenge`` under ``key`` (constant time)."""
    return answer is not None and hmac.compare_digest(proof(key, challenge), answer.strip())


def answer_challenge(key: str | None, challenge: bytes | None) -> bytes | None:
    """In a child: the proof to send back, or None (no key, no or oversized challenge)."""
    if not key or not challenge or len(challenge) > MAX_CHALLENGE:
        return None
    return proof(key, challenge)


def spawn_key_from(env: Mapping[str, str]) -> str | None:
    return env.get(SPAWN_KEY_ENV) or None


def guard_parent(env: Mapping[str, str] = os.environ) -> None:
    """In a child, first thing: own process group, SIGTERM on the parent's death, and
    exit (:data:`EXIT_ORPHANED`) if the parent is already gone. No-op unless
    :data:`PARENT_DEATH_ENV` is ``"1"``."""
    if env.get(PARENT_DEATH_ENV) != "1":
        return
    with contextlib.suppress(OSError):
        os.setpgrp()
    gate = env.get(LAUNCH_GATE_ENV)
    if gate:
        path = os.path.join(gate, env.get("MORTRED_LISTEN_PORT") or "other")
        while not os.path.exists(path):
            time.sleep(0.01)
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    expected = env.get(SUPERVISOR_PID_ENV, "")
    if expected.isdigit() and os.getppid() != int(expected):
        sys.stderr.write(
            f"mortred: supervisor (pid {expected}) is gone (parent is {os.getppid()}): exiting\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_ORPHANED)

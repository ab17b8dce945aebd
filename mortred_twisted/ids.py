"""Random identifiers: unguessable job ids and request ids (pure: no reactor, HTTP
or torch).

Both are hex digits of ``os.urandom`` bytes, as ``secrets.token_hex`` gives, but the
bytes are read 4 KiB at a time: one ``getrandom`` system call costs ~8 µs on the VMs
we run on, and every job took three (its id, two request ids): ~10 % of the CPU a
job costs the model server end to end. The bytes stay the kernel's CSPRNG output,
each handed out once.

Thread contract: safe from any thread (a lock around the buffer). Fork-safe: a
child process never reuses its parent's unread bytes (the buffer is keyed by pid).
"""

from __future__ import annotations

import os
import threading

_CHUNK = 4096


class RandomBytes:
    """Bytes of ``os.urandom``, read :data:`_CHUNK` at a time, each given once."""

    def __init__(self, chunk: int = _CHUNK) -> None:
        self._chunk = chunk
        self._buffer = b""
        self._at = 0
        self._pid = -1
        self._lock = threading.Lock()

    def take(self, n: int) -> bytes:
        if n > self._chunk:
            return os.urandom(n)
        with self._lock:
            at = self._at
            if at + n > len(self._buffer) or self._pid != os.getpid():
                self._buffer, self._pid, at = os.urandom(self._chunk), os.getpid(), 0
            self._at = at + n
            return self._buffer[at : at + n]


_random = RandomBytes()


def random_hex(nbytes: int) -> str:
    """``nbytes`` random bytes as ``2 * nbytes`` hex digits (``secrets.token_hex``)."""
    return _random.take(nbytes).hex()


def new_job_id() -> str:
    """A fresh, unguessable job id: ``job_`` + 24 hex digits (96 random bits)."""
    return "job_" + random_hex(12)


def new_request_id() -> str:
    """A fresh request id: ``req_`` + 16 hex digits."""
    return "req_" + random_hex(8)

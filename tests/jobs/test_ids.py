"""Random ids: the formats, every byte handed out once (across buffer refills and
threads), and a forked child never reusing its parent's buffered bytes."""

from __future__ import annotations

import os
import re
import threading

from mortred_twisted import ids
from mortred_twisted.ids import RandomBytes, new_job_id, new_request_id


def test_formats() -> None:
    assert re.fullmatch(r"job_[0-9a-f]{24}", new_job_id())
    assert re.fullmatch(r"req_[0-9a-f]{16}", new_request_id())


def test_bytes_are_handed_out_once_across_refills(monkeypatch) -> None:
    reads: list[bytes] = []

    def counting_urandom(n: int) -> bytes:
        chunk = bytes((len(reads) * 7 + i) % 256 for i in range(n))
        reads.append(chunk)
        return chunk

    monkeypatch.setattr(ids.os, "urandom", counting_urandom)
    source = RandomBytes(chunk=32)
    taken = [source.take(12) for _ in range(10)]  # 2 fit per chunk, 8 bytes left over
    assert len(reads) == 5
    assert taken[0] == reads[0][:12] and taken[1] == reads[0][12:24]
    assert taken[2] == reads[1][:12]  # the 8 leftover bytes are never split across ids
    assert source.take(64) != b""  # larger than a chunk: read directly
    assert len(reads) == 6


def test_no_duplicates_across_threads() -> None:
    seen: list[list[str]] = [[] for _ in range(8)]

    def draw(out: list[str]) -> None:
        for _ in range(2000):
            out.append(new_job_id())

    threads = [threading.Thread(target=draw, args=(out,)) for out in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    every = [job for out in seen for job in out]
    assert len(every) == 16000 == len(set(every))


def test_a_forked_child_reads_fresh_bytes(monkeypatch) -> None:
    source = RandomBytes(chunk=4096)
    source.take(12)  # the parent buffered 4 KiB
    parent_next = RandomBytes.__new__(RandomBytes)
    parent_next.__dict__.update(source.__dict__)
    parent_next._lock = threading.Lock()
    monkeypatch.setattr(ids.os, "getpid", lambda: -12345)  # as if in a child process
    child_id = source.take(12)
    monkeypatch.undo()
    assert child_id != parent_next.take(12)
    assert source._pid == -12345 and os.getpid() != -12345

"""A small keep-alive HTTP/1.1 load generator on asyncio (benchmarks only).

Each virtual client holds one persistent connection and sends requests one after
the other; responses must carry ``Content-Length`` (every mortred response does).
Latencies are measured per request with ``time.perf_counter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    received_unix: float

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One persistent HTTP/1.1 connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Response:
        assert self.reader is not None and self.writer is not None
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        received = time.time()
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        hdrs = {}
        for line in header_lines:
            if ":" in line:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        length = int(hdrs.get("content-length", "0"))
        data = await self.reader.readexactly(length) if length else b""
        return Response(status, hdrs, data, received)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()


@dataclass
class Stats:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed_s: float = 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        data = sorted(self.latencies_ms)
        idx = min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))
        return data[idx]

    @property
    def count(self) -> int:
        return len(self.latencies_ms)

    @property
    def rate(self) -> float:
        return self.count / self.elapsed_s if self.elapsed_s else 0.0

    def summary(self) -> str:
        mean = statistics.fmean(self.latencies_ms) if self.latencies_ms else float("nan")
        return (
            f"n={self.count} p50={self.pct(50):.2f}ms p99={self.pct(99):.2f}ms "
            f"mean={mean:.2f}ms rate={self.rate:.0f}/s errors={self.errors}"
        )


Step = Callable[[Connection], Awaitable[float | None]]


async def run_clients(
    host: str,
    port: int,
    clients: int,
    step: Step,
    *,
    duration_s: float | None = None,
    requests_per_client: int | None = None,
) -> Stats:
    """Run ``clients`` connections each calling ``step`` until the budget is spent.

    ``step`` returns a latency in ms to record (or None to record nothing) and
    raises on an error (counted, the connection is reopened).
    """
    stats = Stats()
    deadline = None if duration_s is None else time.perf_counter() + duration_s

    async def client() -> None:
        conn = await Connection(host, port).open()
        done = 0
        try:
            while True:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                if requests_per_client is not None and done >= requests_per_client:
                    return
                try:
                    latency = await step(conn)
                except (AssertionError, ConnectionError, asyncio.IncompleteReadError):
                    stats.errors += 1
                    await conn.close()
                    conn = await Connection(host, port).open()
                    continue
                done += 1
                if latency is not None:
                    stats.latencies_ms.append(latency)
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    stats.elapsed_s = time.perf_counter() - started
    return stats


async def timed(conn: Connection, method: str, path: str, body: bytes = b"", **kw: Any):
    """(latency_ms, response) of one request."""
    t0 = time.perf_counter()
    resp = await conn.request(method, path, body, **kw)
    return (time.perf_counter() - t0) * 1000.0, resp

"""A TCP proxy for fault injection between replicas and Redis (issue 18 item 6).

It forwards ``127.0.0.1:<port>`` to a target and can, at any moment:

- :meth:`TcpProxy.stall` / :meth:`TcpProxy.resume`: stop forwarding on every
  connection, existing and new (the connections stay open and the proxy's kernel
  keeps acknowledging: a hung middlebox, a Redis that stopped answering), then go on;
- :meth:`TcpProxy.half_open`: every *existing* connection goes silent for good while
  new ones are forwarded (a NAT or firewall that dropped its flows, a failover: the
  old sockets look open, nothing ever comes back);
- :meth:`TcpProxy.cut`: reset every existing connection (new ones are forwarded).

It runs an asyncio loop on its own thread, so the Twisted reactor of the test (or
the replicas, as separate processes) is never blocked. Use as a context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class _Link:
    """One proxied connection: both sockets, and whether it may forward."""

    def __init__(self, stalled: bool) -> None:
        self.flowing = asyncio.Event()
        if not stalled:
            self.flowing.set()
        self.dead = False  # half-open: never forwards again
        self.writers: list[asyncio.StreamWriter] = []


class TcpProxy:
    """See the module docstring. Thread-safe control methods; counters for tests."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.accepted = 0  # connections accepted so far
        self._links: set[_Link] = set()
        self._stalled = False
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tcp-proxy")
        self._server: asyncio.base_events.Server | None = None

    # -- control (any thread) -------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the TCP proxy did not start")
        return self

    def stop(self) -> None:
        def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            self._cut_all()
            self._loop.stop()

        self._loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)

    def stall(self) -> None:
        self._call(self._set_stalled, True)

    def resume(self) -> None:
        self._call(self._set_stalled, False)

    def half_open(self) -> None:
        def freeze() -> None:
            for link in self._links:
                link.dead = True
                link.flowing.clear()

        self._call(freeze)

    def cut(self) -> None:
        self._call(self._cut_all)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()

    # -- the loop's thread ----------------------------------------------------------

    def _call(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def _set_stalled(self, stalled: bool) -> None:
        self._stalled = stalled
        for link in self._links:
            if stalled or link.dead:
                link.flowing.clear()
            else:
                link.flowing.set()

    def _cut_all(self) -> None:
        for link in list(self._links):
            link.dead = True
            for writer in link.writers:
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        self._links.clear()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._started.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(self._stalled)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link.writers = [writer, up_writer]
        self._links.add(link)
        await asyncio.gather(
            self._pump(link, reader, up_writer), self._pump(link, up_reader, writer),
            return_exceptions=True,
        )  # fmt: skip
        self._links.discard(link)
        for w in link.writers:
            w.transport.abort()

    @staticmethod
    async def _pump(
        link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await link.flowing.wait()
            data = await reader.read(65536)
            if not data:
                return
            await link.flowing.wait()  # stalled meanwhile: hold what was read
            writer.write(data)
            await writer.drain()


@contextmanager
def tcp_proxy(port: int, host: str = "127.0.0.1") -> Iterator[TcpProxy]:
    """A started proxy to ``host:port`` (stopped after)."""
    with TcpProxy(host, port) as proxy:
        yield proxy

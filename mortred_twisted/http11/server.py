"""The project's HTTP/1.1 server: the factory of its connections and what it owns
for the whole process (edge, reactor thread only).

Every port is served by it: the gateway, the model ports and the supervisor. A
connection's contract (framing by llhttp, decisions from the head, write flow
control, streamed answers, deadlines) is :mod:`mortred_twisted.http11.connection`'s
docstring. The factory owns: the connection cap (``max_connections``) and the cap
per client address (``max_connections_per_address``), the **body budget** (bytes of
request bodies held at once; over it a head is answered 503 + ``Retry-After``), the
app's decision from a head (``refuse_head``, then ``max_body_bytes``), the deadline
sweep (one ``LoopingCall`` for every connection, no timer per request), the access
log, and the graceful drain at shutdown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from mortred_twisted.http11.connection import (
    IDLE_TIMEOUT_S,
    READ_TIMEOUT_S,
    App,
    HTTPConnection,
)
from mortred_twisted.http11.messages import (
    HeaderMap,
    Refusal,
    ServerRequest,
    encode_response,
    error_response,
)

log = Logger()


class HTTPServerFactory(Factory):
    """Builds :class:`HTTPConnection` s for ``app``; owns the connection cap and
    the deadline sweep. ``clock`` is the reactor (``task.Clock`` in tests)."""

    noisy = False
    #: the ``Server`` header of every answer (``server_header=`` overrides it)
    server_header = b"mortred"
    #: the deadline sweep's period: this fraction of the shorter deadline, at most
    #: ``sweep_max_period_s`` (a deadline is met within that fraction of it)
    sweep_fraction = 0.5
    sweep_max_period_s = 5.0

    def __init__(
        self,
        app: App,
        *,
        clock: IReactorTime,
        max_body_bytes: int,
        max_connections: int = 0,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float | None = None,
        access_log: bool = False,
        on_refused: Callable[[int], None] | None = None,
        body_budget_bytes: int = 0,
        max_connections_per_address: int = 0,
        server_header: bytes | None = None,
    ) -> None:
        if server_header is not None:
            self.server_header = server_header
        self.app = app
        self.clock = clock
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        #: bytes of request bodies held at once, all connections (0: no budget)
        self.body_budget_bytes = body_budget_bytes
        self.body_bytes_held = 0
        self.max_connections_per_address = max_connections_per_address
        self._per_address: dict[str, int] = {}
        #: counters for metrics: connections refused by the per-address cap, heads
        #: refused by the body budget, times a connection paused for its writes
        self.address_refusals = 0
        self.budget_refusals = 0
        self.write_pauses = 0
        #: connections aborted by the write deadline (their client read nothing)
        self.write_timeouts = 0
        self._refuse_head = getattr(app, "refuse_head", None)
        self.idle_timeout_s = idle_timeout_s
        self.read_timeout_s = read_timeout_s
        #: the write deadline (see the connection's contract): the read deadline's
        #: value unless given; 0 is none
        self.write_timeout_s = read_timeout_s if write_timeout_s is None else write_timeout_s
        self.access_log = access_log
        self.too_large_message = f"request entity too large (limit {max_body_bytes} bytes)"
        self._on_refused = on_refused
        self.connections: set[HTTPConnection] = set()
        self._sweeper: LoopingCall | None = None
        self.draining = False
        self._empty_waiters: list[defer.Deferred[None]] = []

    @property
    def open_connections(self) -> int:
        return len(self.connections)

    def buildProtocol(self, addr: Any) -> HTTPConnection | None:
        if self.draining:
            return None
        if self.max_connections and len(self.connections) >= self.max_connections:
            return None
        cap = self.max_connections_per_address
        if cap and self._per_address.get(str(getattr(addr, "host", "")), 0) >= cap:
            self.address_refusals += 1
            return None
        conn = HTTPConnection(self)
        self.connections.add(conn)
        return conn

    def address_opened(self, address: str) -> None:
        self._per_address[address] = self._per_address.get(address, 0) + 1

    def address_closed(self, address: str) -> None:
        left = self._per_address.get(address, 0) - 1
        if left > 0:
            self._per_address[address] = left
        else:
            self._per_address.pop(address, None)

    def connections_from(self, address: str) -> int:
        return self._per_address.get(address, 0)

    # -- decisions from the head --------------------------------------------------------

    def judge_head(self, request: ServerRequest, length: int) -> Refusal | None:
        """The refusal of a request that carries a body, from its head alone (see the
        module docstring): the app's own decision, then ``max_body_bytes``."""
        refuse = self._refuse_head
        if refuse is not None:
            body = refuse(request, length)
            if body is not None:
                answer = encode_response(request, body, True, self.server_header)
                return Refusal(request.code, "", answer)
        if length > self.max_body_bytes:
            return self.too_large(request, length)
        return None

    def body_fits(self, length: int) -> bool:
        """Whether a body of ``length`` declared bytes fits in the budget's free part
        now (nothing is reserved: bytes are, as they arrive); counts a refusal."""
        budget = self.body_budget_bytes
        if budget and self.body_bytes_held + length > budget:
            self.budget_refusals += 1
            return False
        return True

    def reserve_body(self, n: int) -> bool:
        """Take ``n`` bytes of the body budget (bytes read); False (nothing taken)
        when over it."""
        budget = self.body_budget_bytes
        if budget and self.body_bytes_held + n > budget:
            self.budget_refusals += 1
            return False
        self.body_bytes_held += n
        return True

    def release_body(self, n: int) -> None:
        self.body_bytes_held -= n

    def over_budget(self, request: ServerRequest) -> Refusal:
        """The refusal of a body that does not fit in the process's body budget."""
        message = "server busy: too many request bodies in progress; retry later"
        answer = self.refusal_response(503, message, request.requestHeaders, retry_after=1)
        return Refusal(503, message, answer)

    def forget(self, conn: HTTPConnection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._empty_waiters:
            waiters, self._empty_waiters = self._empty_waiters, []
            for d in waiters:
                if not d.called:  # a waiter may have given up (timeout, cancel)
                    d.callback(None)

    def drain(self) -> defer.Deferred[None]:
        """Graceful shutdown, after the port stopped listening: refuse new
        connections, close idle ones now and the others after their current answer.
        Fires once every connection is gone (the caller bounds the wait)."""
        self.draining = True
        for conn in list(self.connections):
            conn.drain()
        if not self.connections:
            return defer.succeed(None)
        d: defer.Deferred[None] = defer.Deferred()
        self._empty_waiters.append(d)
        return d

    def too_large(self, request: ServerRequest, length: int) -> Refusal:
        """The refusal of a body over ``max_body_bytes`` (declared, or read so far)."""
        return Refusal(413, self.too_large_message)

    def refusal_response(
        self, status: int, message: str, headers: HeaderMap, retry_after: int | None = None
    ) -> bytes:
        """The answer to a request the server refuses itself; ``headers``: those of
        the request being read (empty when the refusal came before them)."""
        return error_response(status, message, self.server_header, retry_after)

    def refused(self, status: int) -> None:
        if self._on_refused is not None:
            self._on_refused(status)

    def log_access(self, client: str, request: ServerRequest, length: int) -> None:
        """One access-log line (``access_log=True`` only: it costs throughput)."""
        log.info(
            '{client} "{method} {uri} {proto}" {code} {length}',
            client=client,
            method=request.method.decode("latin-1"),
            uri=request.uri.decode("latin-1"),
            proto=request.clientproto.decode("latin-1"),
            code=request.code,
            length=length,
        )

    def sweep(self) -> None:
        """Expire connections idle, slow to send a head or a body, or whose client
        reads none of their answers (a deadline of 0 is none)."""
        now = self.clock.seconds()
        never = float("-inf")
        idle_before = now - self.idle_timeout_s if self.idle_timeout_s > 0 else never
        read_before = now - self.read_timeout_s if self.read_timeout_s > 0 else never
        write_before = now - self.write_timeout_s if self.write_timeout_s > 0 else never
        for conn in list(self.connections):
            conn.expire(now, idle_before, read_before, write_before)

    def startFactory(self) -> None:
        """Sweep every ``sweep_fraction`` of the shortest deadline, at most every
        ``sweep_max_period_s``; no sweep when there is no deadline."""
        timeouts = (self.idle_timeout_s, self.read_timeout_s, self.write_timeout_s)
        deadlines = [t for t in timeouts if t > 0]
        if deadlines and self._sweeper is None:
            period = min(self.sweep_max_period_s, min(deadlines) * self.sweep_fraction)
            self._sweeper = LoopingCall(self.sweep)
            self._sweeper.clock = self.clock
            self._sweeper.start(period, now=False)

    def stopFactory(self) -> None:
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        self._sweeper = None

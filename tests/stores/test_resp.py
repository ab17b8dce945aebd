"""The RESP connection (hiredis on the reactor) and the Redis link's login: units on a
string transport for the framing rules, a real ``redis-server`` (with a password)
for AUTH/SELECT and pub/sub."""

from __future__ import annotations

import hiredis
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import formatEvent, globalLogPublisher

from mortred_twisted.config.server import parse_redis_url
from mortred_twisted.jobs.store import StoreUnavailable
from mortred_twisted.stores.redis_link import RedisLink
from mortred_twisted.stores.resp import RedisReplyError, RespConnection
from tests.support.redis_server import redis_server


def connected(on_message=None) -> tuple[RespConnection, StringTransport]:
    proto = RespConnection(Clock(), label="redis://test", on_message=on_message)
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


def test_a_command_is_packed_once_and_its_reply_fires_it() -> None:
    proto, transport = connected()
    got: list[object] = []
    proto.call("EVALSHA", "abc", 1, "k", b"\x00\xff", 7).addCallback(got.append)
    assert transport.value() == hiredis.pack_command(("EVALSHA", "abc", 1, "k", b"\x00\xff", 7))
    assert got == []
    proto.dataReceived(b"*2\r\n:1\r\n$3\r\nj\x00b\r\n")
    assert got == [[1, b"j\x00b"]]


def test_replies_arrive_in_order_even_split_across_reads() -> None:
    proto, _ = connected()
    got: list[object] = []
    for i in range(3):
        proto.call("GET", f"k{i}").addCallback(got.append)
    wire = b"$1\r\na\r\n$-1\r\n:42\r\n"
    for i in range(len(wire)):  # one byte at a time
        proto.dataReceived(wire[i : i + 1])
    assert got == [b"a", None, 42]


def test_an_error_reply_fails_only_its_call() -> None:
    proto, transport = connected()
    errors: list[str] = []
    got: list[object] = []
    proto.call("EVALSHA", "nope", 0).addErrback(
        lambda f: errors.append(str(f.trap(RedisReplyError) and f.value))
    )
    proto.call("PING").addCallback(got.append)
    proto.dataReceived(b"-NOSCRIPT No matching script.\r\n+PONG\r\n")
    assert errors and errors[0].startswith("NOSCRIPT")
    assert got == [b"PONG"]
    assert not transport.disconnecting


def test_bytes_that_are_not_resp_abort_the_connection_and_fail_the_waiting_calls() -> None:
    """Garbage from the peer (or a man in the middle) is never taken for a reply."""
    proto, transport = connected()
    aborted: list[bool] = []
    transport.abortConnection = lambda: aborted.append(True)  # type: ignore[method-assign]
    failures: list[object] = []
    proto.call("GET", "k").addErrback(lambda f: failures.append(f.trap(StoreUnavailable)))
    proto.dataReceived(b"HTTP/1.1 200 OK\r\n\r\n")
    assert aborted == [True] and failures == []
    proto.connectionLost(None)  # what the abort leads to
    assert failures == [StoreUnavailable]
    assert not proto.connected


def test_a_reply_nobody_asked_for_aborts_the_connection() -> None:
    """An extra reply would shift every later answer onto the wrong call."""
    aborted: list[bool] = []
    proto, transport = connected()
    transport.abortConnection = lambda: aborted.append(True)  # type: ignore[method-assign]
    proto.dataReceived(b":1\r\n")
    assert aborted == [True]


def test_a_lost_connection_fails_every_unanswered_call_and_refuses_new_ones() -> None:
    proto, _ = connected()
    failures: list[object] = []
    for _ in range(3):
        proto.call("GET", "k").addErrback(lambda f: failures.append(f.trap(StoreUnavailable)))
    lost: list[object] = []
    proto.lost.addCallback(lost.append)
    proto.connectionLost(None)
    assert failures == [StoreUnavailable] * 3
    assert lost == [proto]
    refused: list[object] = []
    proto.call("GET", "k").addErrback(lambda f: refused.append(f.trap(StoreUnavailable)))
    assert refused == [StoreUnavailable]


def test_pushed_messages_go_to_the_handler_and_replies_to_their_calls() -> None:
    messages: list[bytes] = []
    proto, _ = connected(on_message=messages.append)
    confirmations: list[object] = []
    proto.call("SUBSCRIBE", "ch").addCallback(confirmations.append)
    proto.dataReceived(
        b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nt job\r\n"
    )
    assert confirmations == [[b"subscribe", b"ch", 1]]
    assert messages == [b"t job"]


def test_the_oldest_wait_is_measured_on_the_clock() -> None:
    clock = Clock()
    proto = RespConnection(clock)
    proto.makeConnection(StringTransport())
    assert proto.oldest_wait() == 0.0
    proto.call("GET", "a")
    clock.advance(2.5)
    proto.call("GET", "b")
    assert proto.oldest_wait() == 2.5
    proto.dataReceived(b"$-1\r\n")
    assert proto.oldest_wait() == 0.0


# -- a real redis-server with a password ---------------------------------------------


def link_to(url: str, events: list[bytes] | None = None) -> RedisLink:
    return RedisLink(
        reactor, parse_redis_url(url), channel="mortred:{T}:events", stream="mortred:{T}:queue",
        on_event=(events if events is not None else []).append, on_subscribed=lambda: None,
    )  # fmt: skip


@pytest_twisted.ensureDeferred
async def test_auth_and_select_from_the_url_against_a_password_protected_redis() -> None:
    with redis_server(password="s3cr@t pw") as redis:
        link = link_to(f"redis://default:s3cr%40t%20pw@127.0.0.1:{redis.port}/3", events := [])
        link.start()
        try:
            await link.when_connected()
            assert await link.call("SET", "where", "db3") == b"OK"
            assert redis.command("-n", "3", "GET", "where") == "db3"
            assert redis.command("-n", "0", "EXISTS", "where") == "0"
            for _ in range(100):  # the subscriber logs in too
                if await link.call("PUBLISH", "mortred:{T}:events", "t x") == 1:
                    break
                await deferLater(reactor, 0.02, lambda: None)
            for _ in range(100):
                if events:
                    break
                await deferLater(reactor, 0.02, lambda: None)
            assert events == [b"t x"]
        finally:
            await link.stop()


@pytest_twisted.ensureDeferred
async def test_a_wrong_password_never_connects_and_is_never_logged() -> None:
    """Calls fail at once (503 at the edge); the log names the refusal, not the secret."""
    logged: list[str] = []

    def observe(event: dict) -> None:
        logged.append(formatEvent(event) or "")

    with redis_server(password="right") as redis:
        globalLogPublisher.addObserver(observe)
        link = link_to(f"redis://:hunter2-wrong@127.0.0.1:{redis.port}/0")
        link.start()
        try:
            for _ in range(100):
                if any("refused AUTH" in line for line in logged):
                    break
                await deferLater(reactor, 0.02, lambda: None)
            assert not link.connected
            with pytest.raises(StoreUnavailable):
                await link.call("PING")
        finally:
            await link.stop()
            globalLogPublisher.removeObserver(observe)
    text = "\n".join(logged)
    assert "refused AUTH" in text and "WRONGPASS" in text
    assert "hunter2" not in text

"""Per-key token buckets (shared by the gateway and the model ports), and the model
port's per-client limit on POSTs, keyed by the client the gateway names."""

from __future__ import annotations

import base64

from mortred_twisted.http11.ratelimit import RateLimiter
from tests.http.test_model_server_app import call, make_app

TOKEN = "internal-token"
BODY = {"images": [base64.b64encode(b"x").decode()]}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_burst_then_asks_to_retry() -> None:
    """At 2 qps, two requests pass, the third is told to retry after 1 s."""
    clock = Clock()
    limiter = RateLimiter(clock)
    assert limiter.acquire("a", 2) is None and limiter.acquire("a", 2) is None
    assert limiter.acquire("a", 2) == 1
    clock.now += 0.5
    assert limiter.acquire("a", 2) is None


def test_keys_are_independent_and_bounded() -> None:
    """One key's bucket does not affect another's; old keys are dropped past max_keys."""
    limiter = RateLimiter(Clock(), max_keys=2)
    assert limiter.acquire("a", 1) is None and limiter.acquire("a", 1) == 1
    assert limiter.acquire("b", 1) is None
    limiter.acquire("c", 1)  # evicts "a", the least recently seen
    assert len(limiter) == 2
    assert limiter.acquire("a", 1) is None


def test_slow_rate_retry_after_rounds_up() -> None:
    """At 0.1 qps the wait is 10 s."""
    limiter = RateLimiter(Clock())
    assert limiter.acquire("k", 0.1) is None
    assert limiter.acquire("k", 0.1) == 10


def test_zero_rate_is_unlimited_and_a_new_rate_starts_a_fresh_bucket() -> None:
    """qps <= 0 never limits; a key whose rate changed (a key reload) gets a full bucket."""
    limiter = RateLimiter(Clock())
    assert all(limiter.acquire("k", 0) is None for _ in range(100))
    assert limiter.acquire("k", 1) is None and limiter.acquire("k", 1) == 1
    assert limiter.acquire("k", 2) is None


def test_forget_except_drops_removed_keys() -> None:
    """After a key reload, the buckets of removed keys are gone."""
    limiter = RateLimiter(Clock())
    limiter.acquire("old", 1)
    limiter.acquire("kept", 1)
    limiter.forget_except({"kept"})
    assert len(limiter) == 1 and limiter.acquire("old", 1) is None


def test_server_rate_limits_posts_per_client_with_retry_after() -> None:
    """With rate_limit_qps=1 the second POST from one client is 429 with Retry-After."""
    app, _clock, _threads, stub = make_app(RateLimiter(Clock()), rate_limit_qps=1)
    assert call(stub, "POST", "/jobs", BODY)[0] == 202
    code, headers, doc = call(stub, "POST", "/jobs", BODY)
    assert code == 429 and headers.getRawHeaders("retry-after") == ["1"]
    assert "rate limit exceeded" in doc["error"]
    assert app.runtime.ledger.queue_depth == 1, "the refused submit was not admitted"


def test_gateway_named_clients_get_their_own_buckets() -> None:
    """On a server with a token, requests carrying it (the gateway's) are limited per
    X-Mortred-Client-IP: two clients behind one gateway do not share a bucket."""
    _app, _clock, _threads, stub = make_app(
        RateLimiter(Clock()), rate_limit_qps=1, auth_token=TOKEN
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    alice = {**auth, "X-Mortred-Client-IP": "192.0.2.1"}
    bob = {**auth, "X-Mortred-Client-IP": "192.0.2.2"}
    assert call(stub, "POST", "/jobs", BODY, alice)[0] == 202
    assert call(stub, "POST", "/jobs", BODY, bob)[0] == 202
    assert call(stub, "POST", "/jobs", BODY, alice)[0] == 429


def test_a_client_cannot_choose_its_bucket_without_the_token() -> None:
    """Without the token the header buys nothing: on a tokenless server it is ignored
    (one bucket per peer address), on a server with a token the request is 401."""
    _app, _clock, _threads, open_stub = make_app(RateLimiter(Clock()), rate_limit_qps=1)
    assert call(open_stub, "POST", "/jobs", BODY, {"X-Mortred-Client-IP": "192.0.2.1"})[0] == 202
    spoofed = call(open_stub, "POST", "/jobs", BODY, {"X-Mortred-Client-IP": "192.0.2.9"})
    assert spoofed[0] == 429
    _app, _clock, _threads, stub = make_app(
        RateLimiter(Clock()), rate_limit_qps=1, auth_token=TOKEN
    )
    assert call(stub, "POST", "/jobs", BODY, {"X-Mortred-Client-IP": "192.0.2.1"})[0] == 401


def test_a_malformed_client_address_falls_back_to_the_peer() -> None:
    """A named client that is not an IP address is not a bucket of its own."""
    app, _clock, _threads, _stub = make_app(
        RateLimiter(Clock()), rate_limit_qps=1, auth_token=TOKEN
    )

    class Request:
        def __init__(self, named: bytes) -> None:
            from twisted.web.http_headers import Headers

            self.requestHeaders = Headers({b"X-Mortred-Client-IP": [named]})

        def getClientAddress(self) -> object:
            class Peer:
                host = "127.0.0.1"

            return Peer()

    assert app.checks.client_ip(Request(b"192.0.2.7")) == "192.0.2.7"
    assert app.checks.client_ip(Request(b"2001:db8::1")) == "2001:db8::1"
    assert app.checks.client_ip(Request(b"not an address")) == "127.0.0.1"
    assert app.checks.client_ip(Request("☃".encode())) == "127.0.0.1"

"""Gateway credentials: static token, API keys, scopes, rate limits, fail-closed start."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.gateway.access import (
    METRICS,
    AccessPolicy,
    InsecureStartup,
    check_startup,
    key_caller,
)
from mortred_twisted.gateway.apikeys import ApiKey, KeyRing, hash_key, load_keys, parse_keys
from mortred_twisted.http11.ratelimit import RateLimiter


def policy(
    token: str = "",
    keys: list[ApiKey] | None = None,
    clock: Clock | None = None,
    metrics_token: str = "",
) -> AccessPolicy:
    clock = clock or Clock()
    return AccessPolicy(
        static_token=token,
        keys=KeyRing(keys or []),
        limiter=RateLimiter(clock.seconds),
        metrics_token=metrics_token,
    )


def test_static_token() -> None:
    """The static token passes; missing, wrong or non-bearer credentials are 401."""
    p = policy("s3cret")
    assert p.decide(b"Bearer s3cret").allowed
    assert p.decide(None).status == 401
    assert p.decide(b"Bearer wrong").status == 401
    assert p.decide(b"Basic s3cret").status == 401


def test_empty_static_token_never_lets_wrong_keys_through() -> None:
    """With keys configured and no static token, an unknown key or empty bearer is 401."""
    p = policy("", [ApiKey("ci", hash_key("good"))])
    assert p.decide(b"Bearer good").allowed
    assert p.decide(b"Bearer ").status == 401
    assert p.decide(b"Bearer bad").status == 401


def test_disabled_key_and_scope() -> None:
    """A disabled key is 401; an inference key on /metrics is 403; scope all passes."""
    p = policy(
        "t",
        [
            ApiKey("off", hash_key("k1"), enabled=False),
            ApiKey("inf", hash_key("k2")),
            ApiKey("ops", hash_key("k3"), "all"),
        ],
    )
    assert p.decide(b"Bearer k1").status == 401
    assert p.decide(b"Bearer k2", METRICS).status == 403
    assert p.decide(b"Bearer k3", METRICS).allowed


def test_metrics_token_only_for_metrics() -> None:
    """MORTRED_METRICS_TOKEN opens /metrics, not inference."""
    p = policy("t", metrics_token="m")
    assert p.decide(b"Bearer m", METRICS).allowed
    assert p.decide(b"Bearer m").status == 401


def test_rate_limit_429_with_retry_after() -> None:
    """A 1 qps key gets one request per second; the next is 429 with Retry-After 1."""
    clock = Clock()
    p = policy("", [ApiKey("slow", hash_key("k"), rate_limit_qps=1)], clock)
    assert p.decide(b"Bearer k").allowed
    d = p.decide(b"Bearer k")
    assert d.status == 429 and d.retry_after == 1
    clock.advance(1.0)
    assert p.decide(b"Bearer k").allowed


def test_open_only_without_credentials() -> None:
    """Nothing configured → open; check_startup refuses that off loopback."""
    assert policy().decide(None).allowed
    check_startup("127.0.0.1", "", KeyRing())
    with pytest.raises(InsecureStartup):
        check_startup("0.0.0.0", "", KeyRing())
    check_startup("0.0.0.0", "t", KeyRing())
    check_startup("0.0.0.0", "", KeyRing([ApiKey("a", hash_key("x"))]), "internal")


def test_api_keys_without_an_internal_token_refuse_to_start() -> None:
    """Keys but no internal token: the models would believe no caller name, so every
    key would see every other key's jobs; the gateway refuses, saying what to set."""
    keys = KeyRing([ApiKey("a", hash_key("x"))])
    for host in ("127.0.0.1", "0.0.0.0"):
        with pytest.raises(InsecureStartup, match="MORTRED_INTERNAL_TOKEN"):
            check_startup(host, "", keys)


def test_key_file_errors_reported_at_once() -> None:
    """Every bad entry of the key file is reported in one ConfigErrors."""
    with pytest.raises(ConfigErrors) as e:
        parse_keys(
            {
                "keys": [
                    {"name": "a", "sha256": "xyz", "scope": "god"},
                    {"sha256": "0" * 64, "rate_limt_qps": 1},
                ]
            }
        )
    text = str(e.value)
    assert "sha256" in text and "scope" in text and "name" in text and "rate_limit_qps" in text


def test_load_missing_file_is_empty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A missing api_keys.toml is an empty ring; a valid file loads."""
    assert len(load_keys(tmp_path / "nope.toml")) == 0
    f = tmp_path / "k.toml"
    f.write_text(f'[[keys]]\nname="ci"\nsha256="{hash_key("abc")}"\nscope="all"\n')
    ring = load_keys(f)
    assert ring.lookup("abc") is not None and ring.lookup("abd") is None


def test_callers_are_named_per_key_and_never_collide() -> None:
    """Each key is its own caller (key:<name>, header-safe); an `all` key and the
    static token list every job; an open gateway is one caller that sees all."""
    p = policy("static", [ApiKey("a b\n", hash_key("k1")), ApiKey("ops", hash_key("k2"), "all")])
    one, ops, static = p.decide("Bearer k1"), p.decide("Bearer k2"), p.decide("Bearer static")
    assert (one.caller, one.all_jobs) == (b"key:a%20b%0A", False)
    assert (ops.caller, ops.all_jobs) == (b"key:ops", True)
    assert (static.caller, static.all_jobs) == (b"gateway-token", True)
    assert policy().decide(None).caller == b"anonymous"
    assert key_caller("gateway-token") != b"gateway-token"
    long = key_caller("x" * 300)
    assert long.startswith(b"key:sha256:") and len(long) <= 128

"""The Host check (DNS-rebinding defence) of a service without a token: pure."""

from __future__ import annotations

import pytest

from mortred_twisted.http11.auth import host_header_name, host_refusal, is_loopback_host_header

LOOPBACK = [
    "localhost",
    "localhost:8787",
    "LocalHost:1",
    "127.0.0.1",
    "127.0.0.1:8787",
    "127.1.2.3:80",
    "[::1]",
    "[::1]:8787",
    b"127.0.0.1:8787",
    " localhost:8787 ",
]
NOT_LOOPBACK = [
    "evil.example",
    "evil.example:8787",
    "127.0.0.1.nip.io",
    "localhost.evil.example",
    "localhost.",
    "0.0.0.0:8787",
    "10.0.0.1",
    "192.168.1.10:8787",
    "[::ffff:7f00:1]",
    "[fe80::1]:8787",
]
MALFORMED = [None, "", "::1", "localhost:", "localhost:http", "localhost:123456", "[::1",
             "[]:80", "local host", "user@localhost", "localhost/x"]  # fmt: skip


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_names_pass_without_a_token(host: str | bytes) -> None:
    """localhost, 127.0.0.0/8 and [::1], with or without a port, are this machine."""
    assert is_loopback_host_header(host)
    assert host_refusal(host, token_configured=False) is None


@pytest.mark.parametrize("host", NOT_LOOPBACK + MALFORMED)
def test_other_names_are_refused_without_a_token(host: str | None) -> None:
    """Any other name (a rebound DNS name, a LAN address), no Host or a malformed one
    is refused by a service without a token, with a message saying why."""
    assert not is_loopback_host_header(host)
    message = host_refusal(host, token_configured=False)
    assert message is not None and "loopback" in message and "DNS-rebinding" in message


@pytest.mark.parametrize("host", LOOPBACK + NOT_LOOPBACK + MALFORMED)
def test_a_service_with_a_token_accepts_any_host(host: str | None) -> None:
    """With a token the bearer check defends the service: every Host passes."""
    assert host_refusal(host, token_configured=True) is None


def test_host_header_name_strips_the_port_and_lowers_the_case() -> None:
    """The name a Host header carries, without port or brackets, lower-cased."""
    assert host_header_name("LOCALHOST:8787") == "localhost"
    assert host_header_name("[::1]:1") == "::1"
    assert host_header_name("example.org") == "example.org"
    assert host_header_name("::1") is None

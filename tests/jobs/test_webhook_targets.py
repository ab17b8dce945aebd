"""Webhook targets: the allowlist's grammar and which addresses a delivery may reach."""

from __future__ import annotations

import ipaddress

import pytest

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.server import build_server_config
from mortred_twisted.jobs.webhook_targets import (
    WebhookRejected,
    allowlist,
    check_address,
    check_target,
    non_public_block,
    normalise_allowed_hosts,
    parse_target,
)

#: Every kind of address a webhook must not reach unless listed, with the word the
#: refusal uses.
INWARD = [
    ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.254", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"),
    ("100.64.0.1", "CGNAT"),
    ("100.127.255.254", "CGNAT"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("240.0.0.1", "reserved"),
    ("192.0.0.8", "IETF"),
    ("192.0.2.10", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.7", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("192.88.99.1", "6to4 relay"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("fd00::1", "unique local"),
    ("fc00::1", "unique local"),
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("2001:db8::1", "documentation"),
    ("2001:2::1", "benchmarking"),
    ("100::1", "discard"),
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:10.0.0.1", "private"),
    ("::127.0.0.1", "IPv4-compatible"),
    ("64:ff9b::7f00:1", "embedding 127.0.0.1"),  # NAT64 of loopback
    ("64:ff9b::a9fe:a9fe", "embedding 169.254.169.254"),
    ("64:ff9b:1::a00:1", "NAT64 local use"),
    ("2002:7f00:1::1", "embedding 127.0.0.1"),  # 6to4 of loopback
    ("2002:c0a8:101::1", "embedding 192.168.1.1"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "embedding 192.0.2.45"),  # Teredo
    ("4000::1", "reserved"),  # outside global unicast
]

PUBLIC = [
    "93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111",
    "64:ff9b::808:808",  # NAT64 of a public address
    "2002:808:808::1",  # 6to4 of a public address
    "::ffff:8.8.8.8",
]  # fmt: skip


def target(url: str, allowed: list[str]):
    return parse_target(url), allowlist(normalise_allowed_hosts(allowed))


@pytest.mark.parametrize(("address", "why"), INWARD)
def test_every_inward_address_is_refused_for_a_listed_name(address: str, why: str) -> None:
    """A listed name resolving to loopback, private, link-local, CGNAT, multicast,
    unspecified, reserved or an IPv6 form embedding one of them is refused, and the
    refusal says which block."""
    t, allowed = target("https://hooks.example.com/x", ["hooks.example.com"])
    with pytest.raises(WebhookRejected) as caught:
        check_address(address, t, allowed)
    assert why in caught.value.message


@pytest.mark.parametrize(("address", "why"), INWARD)
def test_every_inward_address_literal_is_refused_even_by_a_wide_range(
    address: str, why: str
) -> None:
    """An IP-literal URL to an inward address is refused at delivery even when the host
    check passes through 0.0.0.0/0 or ::/0: a wide range admits public addresses only."""
    host = f"[{address.replace('%', '%25')}]" if ":" in address else address
    t, allowed = target(f"http://{host}/x", ["0.0.0.0/0", "::/0"])
    with pytest.raises(WebhookRejected):
        check_address(t.address or address, t, allowed)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    """A listed name resolving to a public address (NAT64 and 6to4 of a public IPv4
    included) may be reached; an IPv4-mapped address is reached as its IPv4 address."""
    t, allowed = target("https://hooks.example.com/x", ["hooks.example.com"])
    reached = check_address(address, t, allowed)
    assert non_public_block(reached) is None
    if address.startswith("::ffff:"):
        assert reached == ipaddress.ip_address("8.8.8.8")


def test_a_name_alone_never_admits_loopback() -> None:
    """Listing 'localhost' (any port) passes the host check but not the address check."""
    t, allowed = target("http://localhost:9000/x", ["localhost:*"])
    assert check_target("http://localhost:9000/x", normalise_allowed_hosts(["localhost:*"]))
    with pytest.raises(WebhookRejected, match="loopback"):
        check_address("127.0.0.1", t, allowed)
    with pytest.raises(WebhookRejected, match="loopback"):
        check_address("::1", t, allowed)


def test_a_cidr_entry_admits_its_addresses_on_its_port() -> None:
    """'127.0.0.1/32:9000' admits 127.0.0.1 (also written ::ffff:127.0.0.1) on port 9000
    for a listed name or an IP literal, not on another port and not 127.0.0.2."""
    entries = ["hooks.internal:9000", "127.0.0.1/32:9000", "10.0.0.0/8:*"]
    t, allowed = target("http://hooks.internal:9000/x", entries)
    assert check_address("127.0.0.1", t, allowed) == ipaddress.ip_address("127.0.0.1")
    assert check_address("::ffff:127.0.0.1", t, allowed) == ipaddress.ip_address("127.0.0.1")
    assert check_address("10.9.8.7", t, allowed) == ipaddress.ip_address("10.9.8.7")
    with pytest.raises(WebhookRejected):
        check_address("127.0.0.2", t, allowed)
    with pytest.raises(WebhookRejected):
        check_address("192.168.0.1", t, allowed)
    allowed_set = normalise_allowed_hosts(entries)
    assert check_target("http://127.0.0.1:9000/x", allowed_set)
    assert check_target("http://[::ffff:127.0.0.1]:9000/x", allowed_set)
    assert check_target("http://10.1.1.1:1234/x", allowed_set)
    for url in ("http://127.0.0.1/x", "http://127.0.0.1:9001/x", "http://127.0.0.2:9000/x",
                "http://hooks.internal/x"):  # fmt: skip
        with pytest.raises(WebhookRejected, match="not in the server's"):
            check_target(url, allowed_set)
    other_port, _ = target("http://hooks.internal:9001/x", ["hooks.internal:*"])
    with pytest.raises(WebhookRejected):
        check_address("127.0.0.1", other_port, allowed)


def test_ipv6_ranges_admit_what_they_contain() -> None:
    """'[::1]:8080' and '[fd00::/8]:*' admit ::1 on 8080 and any fd00::/8 address."""
    entries = ["hooks.internal:8080", "[::1]:8080", "[fd00::/8]:*"]
    t, allowed = target("http://hooks.internal:8080/x", entries)
    assert check_address("::1", t, allowed) == ipaddress.ip_address("::1")
    assert check_address("fd12::5", t, allowed) == ipaddress.ip_address("fd12::5")
    with pytest.raises(WebhookRejected):
        check_address("fe80::1", t, allowed)
    assert check_target("http://[::1]:8080/x", normalise_allowed_hosts(entries))


def test_an_entry_without_a_port_means_the_scheme_default() -> None:
    """'hooks.example.com' admits :80 for http and :443 for https, no other port;
    ':*' admits every port."""
    allowed = normalise_allowed_hosts(["hooks.example.com"])
    assert check_target("http://hooks.example.com/x", allowed)
    assert check_target("https://hooks.example.com:443/x", allowed)
    for url in ("http://hooks.example.com:8080/", "https://hooks.example.com:80/",
                "http://hooks.example.com:443/", "http://hooks.example.com:22/"):  # fmt: skip
        with pytest.raises(WebhookRejected):
            check_target(url, allowed)
    assert check_target(
        "http://hooks.example.com:22/", normalise_allowed_hosts(["hooks.example.com:*"])
    )


def test_entries_are_normalised_and_bad_entries_are_named() -> None:
    """Entries are lower-cased, bare addresses become /32 or /128, mapped ranges become
    IPv4; every bad entry is named in one error."""
    assert normalise_allowed_hosts(
        [" Hooks.Example.COM. ", "127.0.0.1:9000", "::1", "[::1]", "[::ffff:10.0.0.0/104]:*", ""]
    ) == {"hooks.example.com", "127.0.0.1/32:9000", "[::1/128]", "10.0.0.0/8:*"}
    with pytest.raises(ValueError) as caught:
        normalise_allowed_hosts(["10.1.2.3/8", "2130706433", "h:0", "h:x", "*.x.com", "[::1"])
    for bad in ("10.1.2.3/8", "2130706433", "'h:0'", "'h:x'", "*.x.com", "[::1"):
        assert bad in str(caught.value)


def test_the_config_reports_bad_entries_with_every_other_problem() -> None:
    """A server file with a malformed entry is refused at load, naming the entry."""
    doc = {"server": {"id": "X", "webhook_allowed_hosts": ["hooks.example.com", "10.0.0.1/8"]}}
    with pytest.raises(ConfigErrors) as caught:
        build_server_config(doc, env={}, read_model_file=False)
    assert "webhook_allowed_hosts" in str(caught.value) and "10.0.0.1/8" in str(caught.value)

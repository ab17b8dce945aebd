"""Webhook targets (pure): the allowlist's grammar and which addresses a delivery may reach.

A job's ``webhook`` makes the server open a connection on a client's behalf, so what it
may reach is the operator's decision (``webhook_allowed_hosts``), never the client's
(server-side request forgery). Two questions, both must be answered yes:

1. **Is the URL's host listed?** (:func:`check_target`, at submit and again before every
   delivery attempt, on whichever replica delivers.) A host name must be listed by name;
   an IP-literal host must lie in a listed address or range. Either way the entry's port
   must match: an entry without a port means the scheme's default port (80 for http,
   443 for https), ``:*`` means any port.
2. **May this address be reached?** (:func:`check_address`, on every address a name
   resolves to, right before connecting to it; the delivery connects to the address
   that passed, never resolving the name again.) A public address may. A non-public one
   (loopback, private, link-local, CGNAT, multicast, unspecified, reserved,
   documentation and benchmarking ranges, and IPv6 forms that embed such an IPv4
   address: IPv4-mapped, NAT64, 6to4, Teredo) only if an address entry that contains it
   is listed, with its port, and that entry lies inside the non-public block the address
   belongs to: ``127.0.0.1/32`` or ``10.0.0.0/8`` admit what they name, ``0.0.0.0/0``
   admits public IPv4 literals but never loopback. **A name alone never admits a
   non-public address.**

Entries (lower-cased, surrounding blanks dropped)::

    hooks.example.com          name, default port of the URL's scheme
    hooks.example.com:8443     name and port
    hooks.example.com:*        name, any port
    203.0.113.7  10.0.0.0/8  127.0.0.1/32:9000  10.1.0.0/16:*
    ::1  [::1]  [fd00::/8]:8080  [::1/128]:*

A bare address is the same as its ``/32`` (``/128``). No I/O here: the caller resolves.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias
from urllib.parse import urlsplit

IPAddress: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2048

#: An entry's port: any port at all (written ``:*``).
ANY_PORT = -1

DEFAULT_PORTS = {"http": 80, "https": 443}


class WebhookRejected(ValueError):
    """A ``webhook`` (or ``webhook_events_filter``) is not acceptable: 422 at submit,
    outcome ``refused`` at delivery."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


def _table(rows: Iterable[tuple[str, str]]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), why) for net, why in rows)


#: Non-public IPv4 blocks (RFC 6890 and successors), each with what it is.
REFUSED_V4: tuple[tuple[IPNetwork, str], ...] = _table(
    [
        ("0.0.0.0/8", "unspecified ('this network')"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "CGNAT (shared address space)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (cloud metadata)"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast (deprecated)"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved (and broadcast)"),
    ]
)

#: Non-public IPv6 blocks, most specific first; the last rows cover everything outside
#: global unicast (2000::/3). NAT64, 6to4 and Teredo are judged by what they embed.
REFUSED_V6: tuple[tuple[IPNetwork, str], ...] = _table(
    [
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::/96", "IPv4-compatible (deprecated)"),
        ("64:ff9b:1::/48", "NAT64 local use"),
        ("100::/64", "discard-only"),
        ("2001:2::/48", "benchmarking"),
        ("2001:10::/28", "ORCHID"),
        ("2001:20::/28", "ORCHIDv2"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("fc00::/7", "unique local (private)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
        ("::/8", "reserved"),
        ("100::/8", "reserved"),
        ("200::/7", "reserved"),
        ("400::/6", "reserved"),
        ("800::/5", "reserved"),
        ("1000::/4", "reserved"),
        ("4000::/2", "reserved"),
        ("8000::/1", "reserved"),
    ]
)

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")


def canonical(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is its IPv4 address; scope
    ids are dropped. Every other address is itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.scope_id is not None:
            return ipaddress.IPv6Address(int(ip))
    return ip


def non_public_block(ip: IPAddress) -> tuple[IPNetwork, str] | None:
    """The non-public block ``ip`` falls in and what it is, or None for a public address."""
    ip = canonical(ip)
    if isinstance(ip, ipaddress.IPv4Address):
        return next(((net, why) for net, why in REFUSED_V4 if ip in net), None)
    embedded: list[ipaddress.IPv4Address] = []
    block: IPNetwork | None = None
    if ip in _NAT64:
        block, embedded = _NAT64, [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    elif ip in _SIX_TO_FOUR and ip.sixtofour is not None:
        block, embedded = _SIX_TO_FOUR, [ip.sixtofour]
    elif ip in _TEREDO and ip.teredo is not None:
        block, embedded = _TEREDO, list(ip.teredo)
    for inner in embedded:
        found = non_public_block(inner)
        if found is not None and block is not None:
            return block, f"{block} embedding {inner} ({found[1]})"
    if block is not None:
        return None
    return next(((net, why) for net, why in REFUSED_V6 if ip in net), None)


@dataclass(frozen=True)
class AllowEntry:
    """One parsed ``webhook_allowed_hosts`` entry: a name or a network, and a port rule
    (None: the scheme's default port; :data:`ANY_PORT`; or one port)."""

    name: str | None
    network: IPNetwork | None
    port: int | None

    def port_matches(self, scheme: str, port: int) -> bool:
        if self.port == ANY_PORT:
            return True
        return port == (DEFAULT_PORTS[scheme] if self.port is None else self.port)

    def __str__(self) -> str:
        if self.name is not None:
            host = self.name
        else:
            assert self.network is not None
            host = f"[{self.network}]" if self.network.version == 6 else str(self.network)
        if self.port is None:
            return host
        return f"{host}:{'*' if self.port == ANY_PORT else self.port}"


def _strip_dot(name: str) -> str:
    return name[:-1] if name.endswith(".") else name


def _network(text: str) -> IPNetwork:
    net = ipaddress.ip_network(text, strict=True)
    if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(
        ipaddress.IPv6Network("::ffff:0:0/96")
    ):  # an IPv4-mapped range is the IPv4 range it maps
        return ipaddress.IPv4Network((int(net.network_address) & 0xFFFFFFFF, net.prefixlen - 96))
    return net


def parse_entry(text: str) -> AllowEntry:
    """Parse one entry (grammar in the module docstring); ValueError says what is wrong."""
    raw = text.strip().lower()
    port_text: str | None = None
    if raw.startswith("["):
        inside, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: an IPv6 entry is '[address]' or '[address]:port'")
        host, port_text = inside, (rest[1:] if rest else None)
    elif raw.count(":") > 1:
        host = raw  # a bare IPv6 address or range, no port
    else:
        host, sep, after = raw.partition(":")
        port_text = after if sep else None
    port: int | None = None
    if port_text is not None:
        if port_text == "*":
            port = ANY_PORT
        elif port_text.isdigit() and 1 <= int(port_text) <= 65535:
            port = int(port_text)
        else:
            raise ValueError(f"{text!r}: the port must be 1-65535 or '*'")
    try:
        return AllowEntry(None, _network(host), port)
    except ValueError as exc:
        if "/" in host or host.replace(".", "").isdigit() or ":" in host:
            raise ValueError(f"{text!r}: not an address or CIDR range ({exc})") from None
    name = _strip_dot(host)
    labels = name.split(".")
    if not name or not all(
        label and len(label) <= 63 and all(c.isalnum() or c in "-_" for c in label)
        for label in labels
    ):
        raise ValueError(f"{text!r}: not a host name, address or CIDR range")
    return AllowEntry(name, None, port)


def normalise_allowed_hosts(entries: Iterable[str]) -> frozenset[str]:
    """The canonical text of every entry (``10.0.0.1`` → ``10.0.0.1/32``); blank entries
    are skipped. Raises ValueError naming every entry that does not parse."""
    good: set[str] = set()
    bad: list[str] = []
    for entry in entries:
        if not entry.strip():
            continue
        try:
            good.add(str(parse_entry(entry)))
        except ValueError as exc:
            bad.append(str(exc))
    if bad:
        raise ValueError("; ".join(bad))
    return frozenset(good)


@dataclass(frozen=True)
class AllowList:
    """The parsed allowlist: names and networks, with their port rules."""

    entries: tuple[AllowEntry, ...]

    def __bool__(self) -> bool:
        return bool(self.entries)


@functools.lru_cache(maxsize=16)
def allowlist(allowed_hosts: frozenset[str]) -> AllowList:
    """The parsed form of ``allowed_hosts`` (cached: the config's set never changes)."""
    return AllowList(tuple(parse_entry(e) for e in sorted(allowed_hosts)))


@dataclass(frozen=True)
class Target:
    """A webhook URL taken apart: scheme, host (lower-case; no brackets, no final dot),
    effective port, and the host's address when it is an IP literal."""

    url: str
    scheme: str
    host: str
    port: int
    address: IPAddress | None


def parse_target(url: object) -> Target:
    """Take an absolute http(s) URL apart; WebhookRejected says what is wrong with it.

    Credentials in the URL and fragments are refused: a delivery carries no secrets but
    the signature. Port 0 is refused.
    """
    if not isinstance(url, str) or not url:
        raise WebhookRejected("webhook", "must be a non-empty string (an http(s) URL)")
    if len(url) > MAX_URL_LENGTH:
        raise WebhookRejected("webhook", f"longer than {MAX_URL_LENGTH} characters")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url) or not url.isascii():
        raise WebhookRejected("webhook", "contains spaces, control or non-ASCII characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRejected("webhook", f"not a valid URL ({exc})") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise WebhookRejected("webhook", "must be an absolute http:// or https:// URL")
    if not parts.hostname:
        raise WebhookRejected("webhook", "has no host")
    if parts.username is not None or parts.password is not None:
        raise WebhookRejected("webhook", "must not carry credentials")
    if parts.fragment:
        raise WebhookRejected("webhook", "must not have a #fragment")
    if port == 0:
        raise WebhookRejected("webhook", "port 0 is not a port")
    host = _strip_dot(parts.hostname.lower())
    try:
        address: IPAddress | None = canonical(ipaddress.ip_address(host))
    except ValueError:
        address = None
    effective = DEFAULT_PORTS[parts.scheme] if port is None else port
    return Target(url, parts.scheme, host, effective, address)


def _shown(target: Target) -> str:
    return f"[{target.host}]" if ":" in target.host else target.host


def check_parsed_target(target: Target, allowed: AllowList) -> Target:
    """Question 1 of the module docstring on a parsed URL; raises WebhookRejected."""
    for entry in allowed.entries:
        if not entry.port_matches(target.scheme, target.port):
            continue
        if target.address is None and entry.name == target.host:
            return target
        if (
            target.address is not None
            and entry.network is not None
            and target.address.version == entry.network.version
            and target.address in entry.network
        ):
            return target
    raise WebhookRejected(
        "webhook",
        f"host {_shown(target)!r} port {target.port} is not in the server's "
        "webhook_allowed_hosts" + (" (none are allowed: webhooks are off)" if not allowed else ""),
    )


def check_target(url: object, allowed_hosts: frozenset[str]) -> str:
    """Return ``url`` if it is an absolute http(s) URL whose host and port are listed
    (question 1); raises :class:`WebhookRejected` naming what is wrong. A listed host is
    not yet a reachable one: the delivery checks each address (:func:`check_address`)."""
    return check_parsed_target(parse_target(url), allowlist(allowed_hosts)).url


def check_address(address: str | IPAddress, target: Target, allowed: AllowList) -> IPAddress:
    """Question 2: the address to connect to for ``target`` (canonical: an IPv4-mapped
    address becomes its IPv4 address) if ``address`` may be reached; else WebhookRejected
    saying which block refused it. ``address`` may carry an IPv6 scope (``%eth0``)."""
    try:
        ip = canonical(ipaddress.ip_address(address))
    except ValueError:
        raise WebhookRejected("webhook", f"resolved to {address!r}, not an address") from None
    found = non_public_block(ip)
    if found is None:
        return ip
    block, why = found
    for entry in allowed.entries:
        net = entry.network
        if (
            net is not None
            and net.version == ip.version
            and ip in net
            and net.subnet_of(block)  # type: ignore[arg-type]
            and entry.port_matches(target.scheme, target.port)
        ):
            return ip
    raise WebhookRejected(
        "webhook",
        f"{_shown(target)!r} resolves to {ip}, {why}: only an address entry in "
        f"webhook_allowed_hosts (like '{ip}/{ip.max_prefixlen}:{target.port}') admits it",
    )

"""Bearer-token checks shared by the model server, gateway and supervisor (pure).

Contract: comparisons are constant-time (``hmac.compare_digest``) and an empty or
missing expected token never matches anything: "no token configured" is a policy
decision taken by the caller (open on loopback, refuse to start elsewhere), never an
accidental pass.
"""

from __future__ import annotations

import hmac
import ipaddress

WWW_AUTHENTICATE = 'Bearer realm="Mortred"'
#: The client's address as the gateway saw it, sent with every forwarded request. A
#: model port believes it only on a server that has a token (so only a caller that
#: authenticated with the internal token can set it); elsewhere it is ignored.
CLIENT_IP_HEADER = b"x-mortred-client-ip"


def bearer_token(authorization: str | bytes | None) -> str | None:
    """Return the token of an ``Authorization: Bearer <token>`` header, else None."""
    if authorization is None:
        return None
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def token_matches(given: str | None, expected: str | None) -> bool:
    """True when ``given`` equals a non-empty ``expected`` (constant time)."""
    if not expected or given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_header_name(host: str | bytes | None) -> str | None:
    """The host name of a ``Host`` header value, lower-cased and without its port.

    ``name``, ``name:port``, ``[v6]`` and ``[v6]:port`` are accepted (the port must be
    1-5 digits); anything else (empty, a bare IPv6 address, a bad port, spaces inside)
    is None. Pure: parses, looks nothing up.
    """
    if host is None:
        return None
    if isinstance(host, bytes):
        host = host.decode("latin-1")
    text = host.strip()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or not name:
            return None
    else:
        name, colon, port = text.partition(":")
        if ":" in port:  # a bare IPv6 address is not a valid Host
            return None
        rest = colon + port
    if rest and not (rest[0] == ":" and rest[1:].isdigit() and 1 <= len(rest) - 1 <= 5):
        return None
    if not name or any(c.isspace() or c in "/\\@" for c in name):
        return None
    return name.lower()


#: ``Host`` value -> whether it names loopback: a connection sends the same value on
#: every request, and parsing it costs a few µs (bounded: cleared when full).
_LOOPBACK_HOSTS: dict[str | bytes, bool] = {}
_LOOPBACK_HOSTS_MAX = 256


def is_loopback_host_header(host: str | bytes | None) -> bool:
    """True when a ``Host`` header names this machine's loopback: ``localhost``, an
    address of 127.0.0.0/8 or ``[::1]``, with any port (case-insensitive)."""
    if host is None:
        return False
    known = _LOOPBACK_HOSTS.get(host)
    if known is not None:
        return known
    name = host_header_name(host)
    verdict = name is not None and is_loopback_host(name)
    if len(_LOOPBACK_HOSTS) >= _LOOPBACK_HOSTS_MAX:
        _LOOPBACK_HOSTS.clear()  # a client cycling names cannot grow it
    _LOOPBACK_HOSTS[host] = verdict
    return verdict


def host_refusal(host: str | bytes | None, *, token_configured: bool) -> str | None:
    """The DNS-rebinding defence of a service: None when a request may proceed, else
    the message to refuse it with (421 Misdirected Request).

    A service with a bearer token accepts any ``Host``: a page of another origin that
    rebinds its name onto our address has no token to send. A service **without** a
    token (allowed on loopback only; every tap refuses a non-loopback address without
    one) accepts only a ``Host`` that names loopback (:func:`is_loopback_host_header`),
    so ``http://evil.example:8787/`` rebound to 127.0.0.1 is refused; a missing or
    malformed ``Host`` is refused too. Pure, no IO.
    """
    if token_configured or is_loopback_host_header(host):
        return None
    if isinstance(host, bytes):
        host = host.decode("latin-1")
    shown = "no Host header" if host is None else f"Host {host.strip()[:100]!r}"
    return (
        f"{shown} is not a loopback name: this service runs without a token and answers "
        "only http://localhost, http://127.0.0.1 or http://[::1] (DNS-rebinding defence); "
        "set a token to serve other names"
    )

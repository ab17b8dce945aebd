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

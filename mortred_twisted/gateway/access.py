"""Who may call the gateway: static token, API keys, scopes, rate limits (pure).

Decision order for a protected path: bearer token present? → static token
(``MORTRED_GATEWAY_AUTH_TOKEN``) or metrics token (``/metrics`` only) → API key
(enabled, scope) → per-key rate limit. Tokens compare in constant time; an empty
configured token never matches (``token_matches``), so "no token" can only mean
"open" through the explicit :attr:`AccessPolicy.open` flag, which
:func:`check_startup` forbids on a non-loopback host (fail-closed).

**Callers.** An allowed decision names the caller the gateway passes to the model
server (``X-Mortred-Principal``, :attr:`Decision.caller`), which owns the jobs that
caller submits and scopes its listing and ``Idempotency-Key`` s:

* an API key → ``key:<name>`` (the name percent-encoded; names are unique in the key
  file and survive a key's rotation), with ``X-Mortred-Principal-Scope: all``
  (:attr:`Decision.all_jobs`) when the key's scope is ``all``;
* the static gateway token → ``gateway-token``, scope all (the operator's token: it
  also reads ``/metrics``); every client sharing it is one caller;
* an open gateway (no token, no keys: loopback only) → ``anonymous``, scope all.

The prefixes keep a key named like one of the others from ever sharing its jobs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import quote

from mortred_twisted.gateway.apikeys import ApiKey, KeyRing
from mortred_twisted.http11.auth import bearer_token, is_loopback_host, token_matches
from mortred_twisted.http11.ratelimit import RateLimiter

INFERENCE = "inference"
METRICS = "metrics"


class InsecureStartup(Exception):
    """No token and no API keys on a non-loopback listen host."""


@dataclass(frozen=True)
class Decision:
    """The outcome: ``status`` 0 means allowed; else 401/403/429 with a message."""

    status: int
    principal: str = ""
    message: str = ""
    retry_after: int | None = None
    reason: str = ""  # metrics label for failures
    #: the ``X-Mortred-Principal`` value for an allowed request (see module docstring)
    caller: bytes = b""
    #: the caller lists every job (``X-Mortred-Principal-Scope: all``)
    all_jobs: bool = False
    #: the key's share on the model, as headers (``X-Mortred-Weight``,
    #: ``-Max-Pending``, ``-Max-Priority``), sent with the internal token only
    terms: tuple[tuple[bytes, bytes], ...] = ()

    @property
    def allowed(self) -> bool:
        return self.status == 0


#: The model server keeps this many characters of a principal: longer key names are
#: named by their hash so that two never share a truncated prefix.
MAX_CALLER = 128
#: The operator (open gateway, static token) may ask for every priority.
_OPERATOR_TERMS = ((b"x-mortred-max-priority", b"high"),)
_OPEN = Decision(0, "anonymous", caller=b"anonymous", all_jobs=True, terms=_OPERATOR_TERMS)
_STATIC = Decision(0, "static-token", caller=b"gateway-token", all_jobs=True, terms=_OPERATOR_TERMS)
_METRICS_TOKEN = Decision(0, "metrics-token")


def key_caller(name: str) -> bytes:
    """The ``X-Mortred-Principal`` of the API key named ``name`` (visible ASCII)."""
    value = "key:" + quote(name, safe="")
    if len(value) > MAX_CALLER:
        value = "key:sha256:" + hashlib.sha256(name.encode("utf-8")).hexdigest()
    return value.encode("ascii")


def key_terms(key: ApiKey) -> tuple[tuple[bytes, bytes], ...]:
    """The headers that carry ``key``'s share to the model (see :class:`Decision`)."""
    return (
        (b"x-mortred-weight", str(key.weight).encode()),
        (b"x-mortred-max-pending", str(key.max_pending).encode()),
        (b"x-mortred-max-priority", key.max_priority.encode()),
    )


def check_startup(host: str, static_token: str, keys: KeyRing, internal_token: str = "") -> None:
    """Raise :class:`InsecureStartup` when the gateway would be open off loopback, or
    would serve API keys without an internal token (the models then believe no
    caller name, and every key would see, wait on and cancel every other's jobs)."""
    if not static_token and len(keys) == 0 and not is_loopback_host(host):
        raise InsecureStartup(
            f"refusing to listen on {host!r} without MORTRED_GATEWAY_AUTH_TOKEN or "
            "API keys (conf/api_keys.toml)"
        )
    if len(keys) and not internal_token:
        raise InsecureStartup(NO_INTERNAL_TOKEN)


#: Why API keys need an internal token (start-up refusal and rejected key reloads).
NO_INTERNAL_TOKEN = (
    "API keys need MORTRED_INTERNAL_TOKEN: set it for the gateway and the same value as "
    "MORTRED_AUTH_TOKEN on every model server it reaches (the supervisor does both), "
    "so the models believe which key submitted a job; without it every key would see "
    "every other key's jobs"
)


class AccessPolicy:
    """Authentication and rate limiting for one gateway process (reactor thread only).

    ``keys`` is replaced atomically by :meth:`replace_keys` on SIGHUP; requests in
    flight keep the decision they already got.
    """

    def __init__(
        self,
        *,
        static_token: str,
        keys: KeyRing,
        limiter: RateLimiter,
        metrics_token: str = "",
    ) -> None:
        self.static_token = static_token
        self.metrics_token = metrics_token
        self.keys = keys
        self._limiter = limiter
        #: key name -> its caller header value (computed once per name)
        self._callers: dict[str, tuple[bytes, tuple[tuple[bytes, bytes], ...]]] = {}

    @property
    def open(self) -> bool:
        """True when nothing is configured: every request is allowed (loopback only)."""
        return not self.static_token and len(self.keys) == 0

    def replace_keys(self, keys: KeyRing) -> None:
        self.keys = keys
        self._limiter.forget_except({k.name for k in keys.keys})
        self._callers = {}

    def decide(self, authorization: bytes | str | None, need: str = INFERENCE) -> Decision:
        """Decide for a request needing scope ``need`` (``inference`` or ``metrics``)."""
        if self.open and not (need == METRICS and self.metrics_token):
            return _OPEN
        token = bearer_token(authorization)
        if token is None:
            return Decision(401, message="missing bearer token", reason="missing")
        if token_matches(token, self.static_token):
            return _STATIC
        if need == METRICS and token_matches(token, self.metrics_token):
            return _METRICS_TOKEN
        key = self.keys.lookup(token)
        if key is None:
            return Decision(401, message="invalid token", reason="invalid")
        if not key.enabled:
            return Decision(401, message="invalid token", reason="disabled")
        if need == METRICS and key.scope != "all":
            return Decision(
                403, key.name, f"key {key.name!r} has scope {key.scope!r}", reason="scope"
            )
        retry = self._limiter.acquire(key.name, key.rate_limit_qps)
        if retry is not None:
            return Decision(
                429, key.name, f"rate limit exceeded for key {key.name!r}", retry, "rate"
            )
        known = self._callers.get(key.name)
        if known is None:
            known = self._callers[key.name] = (key_caller(key.name), key_terms(key))
        caller, terms = known
        return Decision(0, key.name, caller=caller, all_jobs=key.scope == "all", terms=terms)

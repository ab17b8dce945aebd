"""The HTTP client webhooks are delivered with: it resolves, checks, then connects to
the address it checked.

:class:`GuardedWebhookClient` is what :class:`~mortred_twisted.runtime.webhooks.WebhookSender`
posts through. On every attempt, on the replica that delivers, it

1. checks the URL's host and port against ``webhook_allowed_hosts``
   (:func:`~mortred_twisted.jobs.webhook_targets.check_parsed_target`);
2. resolves the host itself (an IP literal is its own address) with the injected
   :data:`AddressResolver` — in production the reactor's ``nameResolver``, which calls
   ``getaddrinfo`` in the reactor's thread pool, so the reactor never blocks;
3. keeps the first address :func:`~mortred_twisted.jobs.webhook_targets.check_address`
   admits (an answer mixing public and inward addresses never reaches the inward ones);
4. hands that address to the :class:`PinnedTransport`, which connects to it and nothing
   else: no second resolution, so a name that re-binds between the check and the
   connect (DNS rebinding) cannot redirect the request.

A refusal raises :class:`~mortred_twisted.jobs.webhook_targets.WebhookRejected`
(outcome ``refused``, not retried); a name that does not resolve raises
:class:`twisted.internet.error.DNSLookupError` (a connection error, retried).

:class:`PinnedAgentTransport` is the real transport: Twisted's ``Agent`` with an
endpoint factory that opens TCP to the given address, so the request still carries the
URL's ``Host`` header, and for https wraps it in TLS whose SNI and certificate check are
for the URL's host name (``BrowserLikePolicyForHTTPS`` by default), not the address.
Pooled connections are keyed by the address too.

Reactor thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from treq.client import HTTPClient
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import (
    IHostResolution,
    IReactorTime,
    IResolutionReceiver,
    IStreamClientEndpoint,
)
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory, IPolicyForHTTPS
from zope.interface import implementer

from mortred_twisted.jobs.webhook_targets import (
    IPAddress,
    Target,
    WebhookRejected,
    allowlist,
    check_address,
    check_parsed_target,
    parse_target,
)

RESOLVE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0

#: Resolves a host name to its addresses (text, IPv4 and IPv6); fires with an empty
#: sequence when the name has none.
AddressResolver = Callable[[str], "Deferred[Sequence[str]]"]


class PinnedTransport(Protocol):
    """Sends a request for ``url`` over a connection to ``address`` (an IP literal)."""

    def post(self, url: str, *, address: str, **kwargs: Any) -> Deferred[Any]: ...


def reactor_resolver(reactor: Any) -> AddressResolver:
    """An :data:`AddressResolver` over ``reactor.nameResolver`` (``getaddrinfo`` in a
    thread unless the operator installed another resolver)."""

    def resolve(host: str) -> Deferred[Sequence[str]]:
        found: list[str] = []
        done: Deferred[Sequence[str]] = Deferred()

        @implementer(IResolutionReceiver)
        class Receiver:
            def resolutionBegan(self, resolution: IHostResolution) -> None:
                pass

            def addressResolved(self, address: Any) -> None:
                found.append(address.host)

            def resolutionComplete(self) -> None:
                if not done.called:  # not already timed out (cancelled) by the caller
                    done.callback(found)

        reactor.nameResolver.resolveHostName(Receiver(), host, 0, None, "TCP")
        return done

    return resolve


class GuardedWebhookClient:
    """Posts to a webhook URL only at an address the rules admit (module docstring)."""

    def __init__(
        self,
        *,
        allowed_hosts: frozenset[str],
        resolve: AddressResolver,
        transport: PinnedTransport,
        clock: IReactorTime,
        resolve_timeout_s: float = RESOLVE_TIMEOUT_S,
    ) -> None:
        self._allowed = allowlist(frozenset(allowed_hosts))
        self._resolve = resolve
        self._transport = transport
        self._clock = clock
        self._resolve_timeout_s = resolve_timeout_s

    def post(self, url: str, **kwargs: Any) -> Deferred[Any]:
        """Check, resolve, check each address, then post to the admitted one; fails with
        WebhookRejected (refused), DNSLookupError or whatever the transport fails with."""
        return Deferred.fromCoroutine(self._post(url, kwargs))

    async def _post(self, url: str, kwargs: dict[str, Any]) -> Any:
        target = check_parsed_target(parse_target(url), self._allowed)
        address = await self.admitted_address(target)
        return await self._transport.post(url, address=str(address), **kwargs)

    async def admitted_address(self, target: Target) -> IPAddress:
        """The first address of ``target``'s host that the rules admit (resolved once)."""
        if target.address is not None:
            candidates: Sequence[str | IPAddress] = [target.address]
        else:
            resolving = self._resolve(target.host)
            resolving.addTimeout(self._resolve_timeout_s, self._clock)
            candidates = list(await resolving)
            if not candidates:
                raise DNSLookupError(f"{target.host!r} has no address")
        refusal: WebhookRejected | None = None
        for candidate in candidates:
            try:
                return check_address(candidate, target, self._allowed)
            except WebhookRejected as exc:
                refusal = refusal or exc
        assert refusal is not None
        raise refusal


@implementer(IStreamClientEndpoint)
class _PinnedEndpoint:
    """An endpoint that remembers the address it connects to (the pool's key)."""

    def __init__(self, inner: IStreamClientEndpoint, address: str) -> None:
        self.inner = inner
        self.address = address

    def connect(self, protocolFactory: Any) -> Deferred[Any]:
        return self.inner.connect(protocolFactory)


@implementer(IAgentEndpointFactory)
class _PinnedEndpointFactory:
    """TCP to ``address`` whatever the URL's host; TLS (SNI, certificate) for the host."""

    def __init__(
        self, reactor: Any, address: str, tls: IPolicyForHTTPS, connect_timeout_s: float
    ) -> None:
        self._reactor = reactor
        self._address = address
        self._tls = tls
        self._timeout = connect_timeout_s

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        make = TCP6ClientEndpoint if ":" in self._address else TCP4ClientEndpoint
        endpoint: IStreamClientEndpoint = make(
            self._reactor, self._address, uri.port, timeout=self._timeout
        )
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), endpoint)
        return _PinnedEndpoint(endpoint, self._address)


class _PinnedPool(HTTPConnectionPool):
    """A connection pool whose key includes the address a connection was opened to, so a
    pooled connection is only reused for a request pinned to the same address."""

    def getConnection(self, key: Hashable, endpoint: IStreamClientEndpoint) -> Deferred[Any]:
        return super().getConnection((key, getattr(endpoint, "address", None)), endpoint)


class PinnedAgentTransport:
    """The real :class:`PinnedTransport`: treq over ``Agent`` with pinned endpoints."""

    def __init__(
        self,
        reactor: Any,
        *,
        tls_policy: IPolicyForHTTPS | None = None,
        persistent: bool = True,
        max_persistent_per_host: int = 4,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self._reactor = reactor
        self._tls = tls_policy or BrowserLikePolicyForHTTPS()
        self._pool = _PinnedPool(reactor, persistent=persistent)
        self._pool.maxPersistentPerHost = max_persistent_per_host
        self._connect_timeout_s = connect_timeout_s

    def post(self, url: str, *, address: str, **kwargs: Any) -> Deferred[Any]:
        factory = _PinnedEndpointFactory(self._reactor, address, self._tls, self._connect_timeout_s)
        agent = Agent.usingEndpointFactory(self._reactor, factory, pool=self._pool)
        return HTTPClient(agent).post(url, **kwargs)

    def close(self) -> Deferred[None]:
        """Close pooled connections (tests; the process exit does it otherwise)."""
        return self._pool.closeCachedConnections()


def build_webhook_client(
    reactor: Any,
    allowed_hosts: frozenset[str],
    *,
    tls_policy: IPolicyForHTTPS | None = None,
) -> GuardedWebhookClient:
    """The production client: the reactor's resolver and a pinned ``Agent``."""
    return GuardedWebhookClient(
        allowed_hosts=allowed_hosts,
        resolve=reactor_resolver(reactor),
        transport=PinnedAgentTransport(reactor, tls_policy=tls_policy),
        clock=reactor,
    )

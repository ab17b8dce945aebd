"""Webhook deliveries cannot be aimed inward: the guarded client resolves, checks every
address and connects only to the one it checked (scripted resolver and transport on a
Clock; real receivers on 127.0.0.1, plain and TLS, for the pinned transport)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry, Counter
from twisted.internet import reactor
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.ssl import Certificate, PrivateCertificate, optionsForClientTLS
from twisted.internet.task import Clock
from twisted.web.iweb import IPolicyForHTTPS
from twisted.web.resource import Resource
from twisted.web.server import Site
from zope.interface import implementer

from mortred_twisted.runtime.webhook_client import (
    GuardedWebhookClient,
    PinnedAgentTransport,
    reactor_resolver,
)
from mortred_twisted.runtime.webhooks import WebhookSender
from tests.jobs.test_webhook_targets import INWARD

URL = "https://hooks.example.com/x"
PUBLIC_IP = "93.184.216.34"


class ScriptedResolver:
    """Answers each resolution with the next scripted list of addresses."""

    def __init__(self, *answers: Sequence[str]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def __call__(self, host: str) -> Deferred[Sequence[str]]:
        self.asked.append(host)
        return succeed(self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])


class Answer:
    def __init__(self, code: int) -> None:
        self.code = code

    def deliverBody(self, protocol: Any) -> None:
        protocol.connectionLost(None)


class RecordingTransport:
    """Records the address each request was pinned to; answers the scripted codes
    (the last one repeats)."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes) or [200]
        self.sent: list[tuple[str, str]] = []

    def post(self, url: str, *, address: str, **kwargs: Any) -> Deferred[Any]:
        self.sent.append((url, address))
        code = self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]
        return succeed(Answer(code))


def counter(registry: CollectorRegistry) -> Counter:
    return Counter("mortred_webhook_deliveries", "d", ["event", "outcome"], registry=registry)


def outcome(registry: CollectorRegistry, event: str, name: str) -> float:
    value = registry.get_sample_value(
        "mortred_webhook_deliveries_total", {"event": event, "outcome": name}
    )
    return value or 0.0


def sender_for(
    allowed: list[str],
    resolver: Any,
    transport: Any,
    clock: Clock,
    registry: CollectorRegistry | None = None,
    **kw: Any,
) -> WebhookSender:
    client = GuardedWebhookClient(
        allowed_hosts=frozenset(allowed), resolve=resolver, transport=transport, clock=clock
    )
    deliveries = counter(registry) if registry is not None else None
    return WebhookSender(clock=clock, client=client, key=b"k", deliveries=deliveries, **kw)


def run(clock: Clock, d: Deferred[str]) -> str:
    got: list[str] = []
    d.addCallback(got.append)
    for _ in range(2000):
        if got:
            break
        clock.advance(1.0)
    assert got, "the delivery never ended"
    return got[0]


@pytest.mark.parametrize(("address", "why"), INWARD)
def test_a_listed_name_resolving_inward_is_refused_and_never_connected(
    address: str, why: str
) -> None:
    """hooks.example.com is listed, but it resolves to an inward address: the completed
    event ends 'refused' at once (no retry) and nothing is sent anywhere."""
    clock, registry = Clock(), CollectorRegistry()
    transport = RecordingTransport()
    sender = sender_for(["hooks.example.com"], ScriptedResolver([address]), transport, clock,
                        registry)  # fmt: skip
    assert run(clock, sender.send("job_a", URL, "completed", {}, terminal=True)) == "refused"
    assert transport.sent == []
    assert outcome(registry, "completed", "refused") == 1


def test_dns_rebinding_cannot_reach_loopback() -> None:
    """The name answers a public address first (the receiver says 503), then 127.0.0.1:
    the retry is refused; the only request went to the public address."""
    clock = Clock()
    resolver = ScriptedResolver([PUBLIC_IP], ["127.0.0.1"])
    transport = RecordingTransport(503)
    sender = sender_for(["hooks.example.com"], resolver, transport, clock)
    assert run(clock, sender.send("job_b", URL, "completed", {}, terminal=True)) == "refused"
    assert transport.sent == [(URL, PUBLIC_IP)]
    assert resolver.asked == ["hooks.example.com", "hooks.example.com"]  # once per attempt


def test_an_answer_mixing_public_and_inward_addresses_reaches_only_the_public_one() -> None:
    """A name answering [127.0.0.1, ::1, public] is delivered to the public address."""
    clock = Clock()
    transport = RecordingTransport(200)
    resolver = ScriptedResolver(["127.0.0.1", "::1", PUBLIC_IP])
    sender = sender_for(["hooks.example.com"], resolver, transport, clock)
    assert run(clock, sender.send("job_c", URL, "completed", {}, terminal=True)) == "delivered"
    assert transport.sent == [(URL, PUBLIC_IP)]


def test_a_cidr_entry_lets_a_listed_name_reach_its_inward_address() -> None:
    """'hooks.internal:8080' plus '10.0.0.0/8:8080' delivers to 10.1.2.3 on port 8080."""
    clock = Clock()
    transport = RecordingTransport(200)
    sender = sender_for(["hooks.internal:8080", "10.0.0.0/8:8080"],
                        ScriptedResolver(["10.1.2.3"]), transport, clock)  # fmt: skip
    url = "http://hooks.internal:8080/x"
    assert run(clock, sender.send("job_d", url, "completed", {}, terminal=True)) == "delivered"
    assert transport.sent == [(url, "10.1.2.3")]


def test_the_delivering_replica_checks_its_own_allowlist() -> None:
    """A job admitted elsewhere with a target this replica does not list is refused here
    before any resolution."""
    clock = Clock()
    resolver = ScriptedResolver([PUBLIC_IP])
    transport = RecordingTransport()
    sender = sender_for(["other.example.com"], resolver, transport, clock)
    assert run(clock, sender.send("job_e", URL, "completed", {}, terminal=True)) == "refused"
    assert resolver.asked == [] and transport.sent == []


def test_a_name_that_does_not_resolve_is_a_retried_connection_error() -> None:
    """No address (or a resolver failure) is retried like a connection error, then
    'failed'; nothing is sent."""
    clock, registry = Clock(), CollectorRegistry()
    calls: list[str] = []

    def failing(host: str) -> Deferred[Sequence[str]]:
        calls.append(host)
        return fail(OSError("resolver down")) if len(calls) == 2 else succeed([])

    transport = RecordingTransport()
    sender = sender_for(["hooks.example.com"], failing, transport, clock, registry,
                        delays=[0.1, 0.1])  # fmt: skip
    assert run(clock, sender.send("job_f", URL, "completed", {}, terminal=True)) == "failed"
    assert len(calls) == 3 and transport.sent == []
    assert outcome(registry, "completed", "failed") == 1


def test_a_resolver_that_never_answers_times_out() -> None:
    """A hung resolution ends the attempt after the resolve timeout (on the Clock)."""
    clock = Clock()
    client = GuardedWebhookClient(
        allowed_hosts=frozenset(["hooks.example.com"]), resolve=lambda host: Deferred(),
        transport=RecordingTransport(), clock=clock, resolve_timeout_s=5.0,
    )  # fmt: skip
    errors: list[Any] = []
    client.post(URL).addErrback(errors.append)
    clock.advance(4.9)
    assert errors == []
    clock.advance(0.2)
    assert len(errors) == 1


# -- the real pinned transport ------------------------------------------------------


class Receiver(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.hosts: list[str] = []

    def render_POST(self, request: Any) -> bytes:
        self.hosts.append(request.getHeader("host"))
        return b"ok"


@pytest.fixture
def listening():
    ports: list[Any] = []

    def listen(port: Any) -> int:
        ports.append(port)
        return int(port.getHost().port)

    yield listen
    for port in ports:
        pytest_twisted.blockon(port.stopListening())


def real_sender(allowed: list[str], resolve: Any, transport: PinnedAgentTransport) -> WebhookSender:
    client = GuardedWebhookClient(
        allowed_hosts=frozenset(allowed), resolve=resolve, transport=transport, clock=reactor
    )
    return WebhookSender(clock=reactor, client=client, key=b"k", delays=[0.01])


@pytest_twisted.ensureDeferred
async def test_a_name_is_connected_at_the_checked_address_with_its_host_header(listening) -> None:
    """hooks.test does not resolve on this machine: the request reaches the receiver on
    127.0.0.1 only because the transport connects to the checked address, and it still
    carries Host: hooks.test:PORT."""
    receiver = Receiver()
    port = listening(reactor.listenTCP(0, Site(receiver), interface="127.0.0.1"))
    transport = PinnedAgentTransport(reactor, persistent=False)
    sender = real_sender([f"hooks.test:{port}", f"127.0.0.1/32:{port}"],
                         ScriptedResolver(["127.0.0.1"]), transport)  # fmt: skip
    url = f"http://hooks.test:{port}/hook"
    assert await sender.send("job_g", url, "completed", {}, terminal=True) == "delivered"
    assert receiver.hosts == [f"hooks.test:{port}"]


@pytest_twisted.ensureDeferred
async def test_localhost_listed_by_name_is_refused_by_the_real_resolver(listening) -> None:
    """With the reactor's own resolver, 'localhost:PORT' listed by name resolves to
    loopback and is refused: the receiver on 127.0.0.1 gets nothing."""
    receiver = Receiver()
    port = listening(reactor.listenTCP(0, Site(receiver), interface="127.0.0.1"))
    transport = PinnedAgentTransport(reactor, persistent=False)
    sender = real_sender([f"localhost:{port}"], reactor_resolver(reactor), transport)
    url = f"http://localhost:{port}/hook"
    assert await sender.send("job_h", url, "completed", {}, terminal=True) == "refused"
    assert receiver.hosts == []


@pytest_twisted.ensureDeferred
async def test_an_ip_literal_listed_as_cidr_is_delivered(listening) -> None:
    """'127.0.0.1/32:PORT' admits http://127.0.0.1:PORT/ end to end."""
    receiver = Receiver()
    port = listening(reactor.listenTCP(0, Site(receiver), interface="127.0.0.1"))
    transport = PinnedAgentTransport(reactor)
    sender = real_sender([f"127.0.0.1/32:{port}"], reactor_resolver(reactor), transport)
    url = f"http://127.0.0.1:{port}/hook"
    assert await sender.send("job_i", url, "completed", {}, terminal=True) == "delivered"
    assert await sender.send("job_j", url, "completed", {}, terminal=True) == "delivered"
    assert receiver.hosts == [f"127.0.0.1:{port}"] * 2
    await transport.close()


def _certificates(name: str) -> tuple[bytes, bytes]:
    """A fresh CA (PEM) and a server certificate + key for ``name`` signed by it (PEM)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webhook test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(pem), leaf.public_bytes(pem) + key_pem


@implementer(IPolicyForHTTPS)
class TrustOnly:
    """Verifies servers against one CA, for the URL's host name (what
    BrowserLikePolicyForHTTPS does against the system store)."""

    def __init__(self, ca_pem: bytes) -> None:
        self.root = Certificate.loadPEM(ca_pem)

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        return optionsForClientTLS(hostname.decode("ascii"), trustRoot=self.root)


@pytest_twisted.ensureDeferred
async def test_https_verifies_the_host_name_while_connecting_to_the_checked_address(
    listening,
) -> None:
    """https://hooks.test pinned to 127.0.0.1: the certificate for hooks.test verifies
    (SNI and check on the name, not the address); one for another name fails."""
    ca_pem, server_pem = _certificates("hooks.test")
    receiver = Receiver()
    options = PrivateCertificate.loadPEM(server_pem).options()
    port = listening(reactor.listenSSL(0, Site(receiver), options, interface="127.0.0.1"))
    transport = PinnedAgentTransport(reactor, tls_policy=TrustOnly(ca_pem), persistent=False)
    sender = real_sender([f"hooks.test:{port}", f"127.0.0.1/32:{port}"],
                         ScriptedResolver(["127.0.0.1"]), transport)  # fmt: skip
    url = f"https://hooks.test:{port}/hook"
    assert await sender.send("job_k", url, "completed", {}, terminal=True) == "delivered"
    assert receiver.hosts == [f"hooks.test:{port}"]

    other = real_sender([f"other.test:{port}", f"127.0.0.1/32:{port}"],
                        ScriptedResolver(["127.0.0.1"]), transport)  # fmt: skip
    wrong = f"https://other.test:{port}/hook"
    assert await other.send("job_l", wrong, "completed", {}, terminal=True) == "failed"
    assert receiver.hosts == [f"hooks.test:{port}"]


def test_the_reactor_resolver_collects_every_address_and_tolerates_a_late_answer() -> None:
    """reactor_resolver hands back every address the name resolver reports; an answer
    arriving after the caller timed the resolution out is ignored, not an error."""

    class FakeAddress:
        def __init__(self, host: str) -> None:
            self.host = host

    class FakeNameResolver:
        def __init__(self) -> None:
            self.receivers: list[Any] = []

        def resolveHostName(self, receiver: Any, host: str, *args: Any) -> Any:
            self.receivers.append(receiver)
            return receiver

    class FakeReactor:
        nameResolver = FakeNameResolver()

    resolve = reactor_resolver(FakeReactor())
    answered: list[Any] = []
    resolve("hooks.example.com").addCallback(answered.append)
    receiver = FakeReactor.nameResolver.receivers[0]
    receiver.resolutionBegan(None)
    receiver.addressResolved(FakeAddress("93.184.216.34"))
    receiver.addressResolved(FakeAddress("2606:2800:220:1::1"))
    receiver.resolutionComplete()
    assert answered == [["93.184.216.34", "2606:2800:220:1::1"]]

    clock = Clock()
    late = resolve("slow.example.com")
    late.addTimeout(1.0, clock).addErrback(lambda f: None)
    clock.advance(2.0)
    FakeReactor.nameResolver.receivers[1].resolutionComplete()  # no AlreadyCalledError

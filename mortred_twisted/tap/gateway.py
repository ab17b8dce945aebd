"""``twistd -n mortred-gateway``: Options and makeService (entry point).

Environment: ``MORTRED_GATEWAY_AUTH_TOKEN`` (inference bearer token),
``MORTRED_INTERNAL_TOKEN`` (sent to model processes; set by the supervisor, which
also passes ``--supervisor-url``: the token then goes only to the children the
supervisor trusts, :mod:`~mortred_twisted.supervisor.trust`),
``MORTRED_METRICS_TOKEN`` (optional, GET /metrics). ``SIGHUP`` reloads
``conf/api_keys.toml`` in place: connections and requests in flight are untouched; a
file with errors is rejected and the previous keys stay.

This is the one place that falls back to the global reactor.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from twisted.application import internet, service
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python import usage

from mortred_twisted.config.catalog import build_catalog
from mortred_twisted.config.control import (
    ControlConfig,
    load_control_config,
    with_overrides,
)
from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.secret_files import apply_secret_files
from mortred_twisted.gateway.access import NO_INTERNAL_TOKEN, AccessPolicy, check_startup
from mortred_twisted.gateway.apikeys import load_keys
from mortred_twisted.gateway.cold_start import ColdStart, supervisor_wake
from mortred_twisted.gateway.metrics import GatewayMetrics
from mortred_twisted.http.gateway import GatewayApp
from mortred_twisted.http.gateway_admission import ColdAdmission
from mortred_twisted.http11.pool import LeanUpstreamClient
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.http11.server import HTTPServerFactory
from mortred_twisted.supervisor.child_contract import spawn_key_from
from mortred_twisted.supervisor.process import supervisor_url
from mortred_twisted.supervisor.trust import RemoteChildren, TrustGate

log = Logger()


class Options(usage.Options):
    """Command line of ``twistd mortred-gateway``."""

    optParameters = [
        ["config", "c", "conf/mortred.toml", "Control-plane config (conf/mortred.toml)."],
        ["host", None, None, "Listen host (overrides [gateway] host)."],
        ["port", "p", None, "Listen port (overrides [gateway] port; 0 = any free)."],
        ["api-keys", None, None, "API key file (overrides [gateway] api_keys)."],
        ["grace", None, "5", "Seconds requests in progress may take to finish on SIGTERM."],
        ["read-timeout", None, "60", "Seconds a request head, then its body, may take (408)."],
        [
            "supervisor-url",
            None,
            None,
            "The supervisor's API (http://host:port) for cold-start wakes "
            "(default: [supervisor] api_host:api_port of --config).",
        ],
    ]
    optFlags = [["access-log", None, "Log every request (costs throughput)."]]

    def postOptions(self) -> None:
        url = self["supervisor-url"]
        if url is not None and not re.fullmatch(r"https?://[^/?#\s]+", url):
            raise usage.UsageError(f"--supervisor-url must be http(s)://host:port, not {url!r}")
        for name in ("grace", "read-timeout"):
            try:
                self[name] = float(self[name])
            except ValueError:
                raise usage.UsageError(f"--{name} must be a number of seconds") from None
        if self["read-timeout"] <= 0:
            raise usage.UsageError("--read-timeout must be positive")
        if self["grace"] < 0:
            raise usage.UsageError("--grace must be >= 0")
        if self["port"] is not None:
            try:
                self["port"] = int(self["port"])
            except ValueError:
                raise usage.UsageError("--port must be an integer") from None


def load_config(options: Options) -> ControlConfig:
    """The control config with command-line overrides applied."""
    path = Path(options["config"])
    config = load_control_config(path) if path.exists() else ControlConfig(root=str(Path.cwd()))
    changes: dict[str, Any] = {}
    if options["host"] is not None:
        changes["host"] = options["host"]
    if options["port"] is not None:
        changes["port"] = options["port"]
    if options["api-keys"] is not None:
        changes["api_keys"] = options["api-keys"]
    return with_overrides(config, gateway=changes) if changes else config


class GatewayService(service.MultiService):
    """The listening port plus SIGHUP reload, and a graceful stop: stop listening,
    let requests in progress finish for up to ``grace_s`` (:meth:`HTTPServerFactory.
    drain`), then close the upstream pool."""

    def __init__(
        self,
        app: GatewayApp,
        keys_path: Path,
        reactor: Any,
        server: HTTPServerFactory | None = None,
        grace_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.app = app
        self.keys_path = keys_path
        self.reactor = reactor
        self.server = server
        self.grace_s = grace_s
        #: the supervisor's trusted children (supervisor/trust.py), when supervised
        self.children: RemoteChildren | None = None
        self._previous_hup: Any = None

    def reload_keys(self) -> bool:
        """Reload the key file; keep the current keys when it has errors."""
        try:
            keys = load_keys(self.keys_path)
        except ConfigErrors as exc:
            self.app.metrics.key_reloads.labels("error").inc()
            log.error("API key reload rejected, keeping previous keys: {exc}", exc=exc)
            return False
        if len(keys) and not self.app.internal_token:
            self.app.metrics.key_reloads.labels("error").inc()
            log.error(
                "API key reload rejected, keeping previous keys: {why}", why=NO_INTERNAL_TOKEN
            )
            return False
        self.app.policy.replace_keys(keys)
        self.app.metrics.api_keys.set(len(keys))
        self.app.metrics.key_reloads.labels("ok").inc()
        log.info("API keys reloaded: {n} key(s)", n=len(keys))
        return True

    def startService(self) -> None:
        super().startService()
        if self.app.admission is not None:  # Redis links of the admission at zero
            self.app.admission.start()
        if self.children is not None:
            self.children.start()
        self._previous_hup = signal.signal(
            signal.SIGHUP, lambda *_: self.reactor.callFromThread(self.reload_keys)
        )
        # Start-up objects never die: keep them out of the full collections that
        # dominate Klein's p99 (twisted-notes).
        self.reactor.callWhenRunning(gc.freeze)

    def stopService(self) -> Any:
        if self._previous_hup is not None:
            signal.signal(signal.SIGHUP, self._previous_hup)
        if self.children is not None:
            self.children.stop()
        d = super().stopService()  # the port stops listening
        d.addBoth(lambda _: self._drain())
        d.addBoth(lambda _: self.app.upstream.close())
        if self.app.admission is not None:
            d.addBoth(lambda _: self.app.admission.stop())
        return d

    def _drain(self) -> Any:
        if self.server is None:
            return None
        drained = self.server.drain()
        left = len(self.server.connections)
        if left:
            log.info("draining {n} connection(s), up to {s} s", n=left, s=self.grace_s)
        drained.addTimeout(self.grace_s, self.reactor)
        drained.addErrback(lambda f: f.trap(defer.TimeoutError, defer.CancelledError))
        return drained


def cold_start(
    config: ControlConfig,
    catalog: Any,
    http: Any,
    internal_token: str,
    reactor: Any,
    supervisor: str | None = None,
) -> ColdStart | None:
    """Cold starts held for the autoscaled ids (None when there are none): the
    supervisor at ``supervisor`` (its API's base URL: the supervisor passes its own
    with ``--supervisor-url``) is woken, by default the one of this config's
    ``[supervisor] api_host:api_port``."""
    if not any(e.autoscale is not None for e in catalog.values()):
        return None
    url = supervisor or supervisor_url(config)
    log.info("cold starts wake the supervisor at {url}", url=url)
    wake = supervisor_wake(http, url, internal_token)
    return ColdStart(catalog, wake, reactor)


def build_service(options: Options, reactor: Any, env: dict[str, str]) -> GatewayService:
    """Everything but the reactor choice; raises ``usage.UsageError`` on bad config."""
    try:
        config = load_config(options)
        catalog = build_catalog(config)
        keys_path = config.path(config.gateway.api_keys)
        keys = load_keys(keys_path)
    except ConfigErrors as exc:
        raise usage.UsageError(str(exc)) from None
    gw = config.gateway
    static_token = env.get("MORTRED_GATEWAY_AUTH_TOKEN", "")
    internal_token = env.get("MORTRED_INTERNAL_TOKEN", "")
    check_startup(gw.host, static_token, keys, internal_token)
    policy = AccessPolicy(
        static_token=static_token,
        keys=keys,
        limiter=RateLimiter(reactor.seconds),
        metrics_token=env.get("MORTRED_METRICS_TOKEN", ""),
    )
    if policy.open:
        log.warn("gateway is OPEN: no MORTRED_GATEWAY_AUTH_TOKEN and no API keys (loopback)")
    upstream = LeanUpstreamClient(
        reactor,
        recv_timeout_s=gw.upstream_recv_timeout_ms / 1000.0,
        connect_timeout_s=gw.upstream_send_timeout_ms / 1000.0,
        max_idle_per_host=gw.max_persistent_per_host,
    )
    metrics = GatewayMetrics()
    metrics.api_keys.set(len(keys))
    cold = cold_start(config, catalog, upstream, internal_token, reactor, options["supervisor-url"])
    children = None
    forward: Any = upstream
    if options["supervisor-url"] and internal_token:
        # Run by a supervisor: the token goes only to the children it trusts.
        children = RemoteChildren(upstream, options["supervisor-url"], internal_token, reactor)
        forward = TrustGate(upstream, children)
    if cold is not None:
        metrics.watch_cold_start(cold)
    app = GatewayApp(
        catalog=catalog,
        policy=policy,
        upstream=forward,
        clock=reactor,
        metrics=metrics,
        internal_token=internal_token,
        cold_start=cold,
        admission=(
            ColdAdmission.for_catalog(catalog, reactor, internal_token, env)
            if cold is not None
            else None
        ),
        spawn_key=spawn_key_from(env),
    )
    # Our HTTP/1.1 connection handling on llhttp (http11/server.py), not twisted.web:
    # per request it costs about half the CPU, and the gateway's CPU bounds its
    # throughput.
    server = HTTPServerFactory(
        app,
        clock=reactor,
        max_body_bytes=gw.request_size_limit_bytes,
        max_connections=gw.max_connections,
        read_timeout_s=options["read-timeout"],
        access_log=bool(options["access-log"]),
        on_refused=lambda status: metrics.hot.count("refused", str(status)),
        body_budget_bytes=gw.body_budget_bytes,
        server_header=b"mortred-gateway",
        max_connections_per_address=gw.max_connections_per_client,
    )
    metrics.open_connections.set_function(lambda: server.open_connections)
    metrics.watch_server(server)
    svc = GatewayService(app, keys_path, reactor, server=server, grace_s=options["grace"])
    svc.children = children
    internet.TCPServer(gw.port, server, interface=gw.host, backlog=1024).setServiceParent(svc)
    log.info(
        "gateway on http://{host}:{port} for {n} model(s): {ids}",
        host=gw.host,
        port=gw.port,
        n=len(catalog),
        ids=", ".join(catalog),
    )
    return svc


def makeService(options: Options) -> service.IService:
    """twistd entry point: the global reactor is chosen here and nowhere else."""
    from twisted.internet import reactor

    try:
        apply_secret_files(os.environ)  # <NAME>_FILE secrets, before anything reads them
        return build_service(options, reactor, dict(os.environ))
    except Exception as exc:  # startup errors: one clear line, non-zero exit
        print(f"mortred-gateway: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

"""``twistd -n mortred-supervisor``: the whole control plane (entry point).

Starts the management API (``[supervisor] api_host:api_port``), then the gateway and
the autostart models as child processes. Tokens come from the environment or are
generated once per boot; the URLs to call are logged, the generated tokens and the
web UI's sign-in link are shown on the terminal only (:func:`show_on_terminal`),
never written to the twistd log:

* ``MORTRED_API_TOKEN``: this API and the web UI;
* ``MORTRED_GATEWAY_AUTH_TOKEN``: gateway inference (passed to the gateway child);
* ``MORTRED_INTERNAL_TOKEN``: gateway → models (models get it as ``MORTRED_AUTH_TOKEN``).

Before autostart, children left on its ports by an earlier run are stopped and ports
held by other processes are reported (:mod:`~mortred_twisted.supervisor.leftovers`);
a child whose port is held is not started (``start_failed``), and a model child is
ready only once it proves it holds its spawn key
(:mod:`~mortred_twisted.supervisor.child_contract`).

SIGTERM / Ctrl-C: models are stopped (SIGTERM, then SIGKILL after the grace), then
the gateway, then the supervisor exits; twistd waits on :meth:`stopService`.
This is the one place that falls back to the global reactor.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from treq.client import HTTPClient
from twisted.application import internet, service
from twisted.internet.defer import succeed
from twisted.logger import Logger
from twisted.python import usage
from twisted.web.client import Agent

from mortred_twisted.config.catalog import Catalog, CatalogEntry, build_catalog
from mortred_twisted.config.control import ControlConfig, load_control_config, with_overrides
from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.secret_files import apply_secret_files
from mortred_twisted.config.server import redis_address
from mortred_twisted.http.supervisor_api import SupervisorApi
from mortred_twisted.http11.auth import is_loopback_host
from mortred_twisted.http11.pool import LeanUpstreamClient
from mortred_twisted.http11.upstream import UpstreamClient, quiet_pool
from mortred_twisted.supervisor.leftovers import stop_leftovers
from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.meter import StoreMeter, child_config
from mortred_twisted.supervisor.metrics import supervisor_registry
from mortred_twisted.supervisor.monitor import (
    ManagedServer,
    Supervisor,
    Timing,
    http_prober,
)
from mortred_twisted.supervisor.policy import RestartTracker
from mortred_twisted.supervisor.ports import describe_holders, listeners, port_free
from mortred_twisted.supervisor.process import ReactorSpawner, gateway_spec, model_spec
from mortred_twisted.supervisor.replicas import ReplicaGroup, replica_id
from mortred_twisted.supervisor.scaler import Scaler
from mortred_twisted.supervisor.trust import LocalChildren, TrustGate

log = Logger()


class Options(usage.Options):
    """Command line of ``twistd mortred-supervisor``."""

    DEFAULT_CONFIG = "conf/mortred.toml"
    optParameters = [
        ["config", "c", DEFAULT_CONFIG, "Control-plane config (conf/mortred.toml)."],
        ["api-host", None, None, "Management API host (overrides [supervisor] api_host)."],
        ["api-port", None, None, "Management API port (overrides [supervisor] api_port)."],
        ["gateway-port", None, None, "Gateway port (overrides [gateway] port)."],
        ["autostart", None, None, "Comma-separated ids to start (default: per config)."],
    ]
    optFlags = [
        ["no-gateway", None, "Do not run the gateway."],
        ["no-autostart", None, "Start no model at boot (the gateway still starts)."],
    ]

    def postOptions(self) -> None:
        for key in ("api-port", "gateway-port"):
            if self[key] is not None:
                try:
                    self[key] = int(self[key])
                except ValueError:
                    raise usage.UsageError(f"--{key} must be an integer") from None


def load_config(options: Options) -> ControlConfig:
    """``--config`` (defaults built in when the default path does not exist), with the
    command-line overrides applied."""
    path = Path(options["config"])
    if not path.exists() and options["config"] == Options.DEFAULT_CONFIG:
        config = ControlConfig(root=str(Path.cwd()), source=str(path.resolve()))
    else:
        config = load_control_config(path)
    sup: dict[str, Any] = {}
    gw: dict[str, Any] = {}
    if options["api-host"] is not None:
        sup["api_host"] = options["api-host"]
    if options["api-port"] is not None:
        sup["api_port"] = options["api-port"]
    if options["gateway-port"] is not None:
        gw["port"] = options["gateway-port"]
    if options["no-gateway"]:
        gw["enabled"] = False
    return with_overrides(config, supervisor=sup, gateway=gw)


def autostart_ids(options: Options, catalog: Catalog) -> list[str]:
    if options["no-autostart"]:
        return []
    if options["autostart"]:
        wanted = [x.strip() for x in options["autostart"].split(",") if x.strip()]
        unknown = [x for x in wanted if x not in catalog]
        if unknown:
            raise usage.UsageError(f"--autostart: unknown id(s): {', '.join(unknown)}")
        return wanted
    return [e.id for e in catalog.enabled() if e.autostart]


def _open_tty() -> IO[str]:
    return open("/dev/tty", "w", encoding="utf-8")


def show_on_terminal(
    text: str,
    *,
    stderr: IO[str] | None = None,
    open_tty: Callable[[], IO[str]] = _open_tty,
) -> bool:
    """Write ``text`` (secrets: tokens, the sign-in link) where only a person sees it;
    True when it was shown.

    The process's original stderr when it is a terminal (``sys.__stderr__``: twistd
    replaces ``sys.stdout``/``sys.stderr`` with files that write into its log), else
    the controlling terminal (``/dev/tty``), else nowhere: a daemon, or a process whose
    output goes to files or pipes, never writes secrets (they would end up in a log).
    """
    stream = stderr if stderr is not None else sys.__stderr__
    try:
        if stream is not None and stream.isatty():
            stream.write(text + "\n")
            stream.flush()
            return True
    except (OSError, ValueError):  # closed or detached stderr
        pass
    try:
        with open_tty() as tty:
            tty.write(text + "\n")
        return True
    except OSError:  # no controlling terminal (ENXIO), or none at all
        return False


class SupervisorService(service.MultiService):
    """API port + children. ``stopService`` returns the Deferred of the ordered stop.

    ``banner`` (URLs, models; no secret) is logged at start; ``secrets`` (generated
    tokens, the sign-in link; may be empty) go to ``show`` only, never to the log.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        autostart: list[str],
        banner: str,
        secrets: str = "",
        show: Callable[[str], bool] = show_on_terminal,
        leftovers: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        self.supervisor = supervisor
        self.autostart = autostart
        self.banner = banner
        self.secrets = secrets
        self.show = show
        #: stops an earlier run's children on our ports before autostart (fires
        #: when done); None: nothing to look at
        self.leftovers = leftovers
        #: the autoscalers' store meters (started and stopped with the service)
        self.meters: list[Any] = []

    def startService(self) -> None:
        super().startService()
        log.info("{banner}", banner=self.banner)
        if self.secrets and not self.show(self.secrets):
            log.error(
                "generated tokens were not shown: no terminal to show them on (they are "
                "never logged); set MORTRED_API_TOKEN and MORTRED_GATEWAY_AUTH_TOKEN in "
                "the environment and restart"
            )
        for meter in self.meters:
            meter.start()
        for scaler in self.supervisor.scalers.values():
            scaler.start()
        d = self.leftovers() if self.leftovers is not None else succeed(None)
        d.addErrback(lambda f: log.failure("looking for leftovers failed", f))
        d.addCallback(lambda _: self.supervisor.start_all(self.autostart))
        d.addCallback(lambda r: log.info("autostart finished: {r}", r=r))

    def stopService(self) -> Any:
        log.info("stopping models, then the gateway")
        d = self.supervisor.stop_all()  # scalers first, so none starts a replica
        for meter in self.meters:
            d.addBoth(lambda _, m=meter: m.stop())
        d.addBoth(lambda _: service.MultiService.stopService(self))
        return d


def build_service(options: Options, reactor: Any, env: dict[str, str]) -> SupervisorService:
    try:
        config = load_config(options)
        catalog = build_catalog(config)
    except ConfigErrors as exc:
        raise usage.UsageError(str(exc)) from None
    autostart = autostart_ids(options, catalog)
    sup = config.supervisor
    generated: list[str] = []

    def token(name: str) -> str:
        value = env.get(name, "")
        if not value:
            value = secrets.token_urlsafe(24)
            generated.append(f"  {name}={value}")
        return value

    api_token = token("MORTRED_API_TOKEN")
    gateway_token = token("MORTRED_GATEWAY_AUTH_TOKEN")
    internal_token = env.get("MORTRED_INTERNAL_TOKEN") or secrets.token_urlsafe(24)
    if not api_token and not is_loopback_host(sup.api_host):  # pragma: no cover
        raise usage.UsageError("refusing a non-loopback API without MORTRED_API_TOKEN")

    timing = Timing(
        probe_interval=sup.probe_interval_ms / 1000.0,
        ready_timeout=sup.ready_timeout_s,
        grace=sup.stop_grace_s,
    )
    spawner = ReactorSpawner(reactor)
    probe_pool = quiet_pool(reactor, persistent=False)
    prober = http_prober(HTTPClient(Agent(reactor, pool=probe_pool)), reactor)
    log_dir = config.path(sup.log_dir)
    rotate = int(sup.log_rotate_mb * 1024 * 1024)

    def port_check(host: str, port: int) -> str | None:
        return None if port_free(host, port) else describe_holders(listeners(port))

    def managed(
        sid: str,
        kind: str,
        spec: Any,
        url: str,
        policy: str,
        cat: str,
        listen: tuple[str, int] | None = None,
    ) -> ManagedServer:
        return ManagedServer(
            sid,
            kind=kind,
            category=cat,
            spec=spec,
            probe_url=url,
            tracker=RestartTracker(policy),
            clock=reactor,
            spawner=spawner,
            prober=prober,
            log_buffer=LogBuffer(
                file_path=log_dir / f"{sid}.log", rotate_bytes=rotate, keep=sup.log_keep
            ),
            timing=timing,
            listen=listen,
            port_check=port_check,
            verify_identity=True,
        )

    def address(e: CatalogEntry, replica: int = 0) -> tuple[str, int] | None:
        return (e.host, e.port + replica) if e.port else None

    scaled: list[tuple[ReplicaGroup, CatalogEntry]] = []

    def model(e: CatalogEntry) -> Any:
        if e.replicas == 1 and e.autoscale is None:
            spec = model_spec(e, config, internal_token, env)
            return managed(e.id, "model", spec, f"{e.base_url}/ready", e.restart_policy,
                           e.category, address(e))  # fmt: skip
        replicas = []
        for i in range(e.replicas):
            spec = model_spec(e, config, internal_token, env, replica=i)
            url = f"{e.replica_url(i)}/ready"
            replicas.append(
                managed(
                    replica_id(e.id, i),
                    "model",
                    spec,
                    url,
                    e.restart_policy,
                    e.category,
                    address(e, i),
                )
            )
        if e.autoscale is None:
            return ReplicaGroup(e.id, replicas)
        group = ReplicaGroup(e.id, replicas, floor=e.autoscale.min_replicas)
        scaled.append((group, e))
        return group

    models = [model(e) for e in catalog.enabled()]
    gateway = None
    gw = config.gateway
    if gw.enabled:
        host = f"[{gw.host}]" if ":" in gw.host else gw.host
        probe_host = "127.0.0.1" if gw.host in ("0.0.0.0", "") else host
        gateway = managed(
            "gateway",
            "gateway",
            gateway_spec(
                config, auth_token=gateway_token, internal_token=internal_token, parent_env=env
            ),
            f"http://{probe_host}:{gw.port}/healthz",
            sup.restart_policy if sup.restart_policy != "no" else "on-failure",
            "control",
            (gw.host or "0.0.0.0", gw.port) if gw.port else None,
        )
    supervisor = Supervisor(models, gateway=gateway, start_concurrency=sup.start_concurrency)
    proxy_pool = quiet_pool(reactor)
    proxy = UpstreamClient(
        Agent(reactor, pool=proxy_pool),
        reactor,
        recv_timeout_s=gw.upstream_recv_timeout_ms / 1000.0,
        pool=proxy_pool,
    )
    # The internal token goes only to children that are ready and proved who they
    # are (supervisor/trust.py): the relay, the event streams and the scrapes.
    children = LocalChildren(supervisor.model_children())
    api = SupervisorApi(
        supervisor=supervisor,
        catalog=catalog,
        api_token=api_token,
        registry=supervisor_registry(supervisor),
        proxy=TrustGate(proxy, children),
        # Job event streams: no receive deadline, one connection each (closed when
        # the browser leaves).
        streams=TrustGate(
            LeanUpstreamClient(
                reactor, recv_timeout_s=gw.upstream_recv_timeout_ms / 1000.0, connect_timeout_s=5
            ),
            children,
        ),
        internal_token=internal_token,
    )
    meters = []
    # The meters' scrapes of /metrics: a short deadline (a hung replica must not
    # stall its scaler's ticks, which never overlap).
    scrape_pool = quiet_pool(reactor)
    scrapes = TrustGate(
        UpstreamClient(
            Agent(reactor, pool=scrape_pool), reactor, recv_timeout_s=2.0, pool=scrape_pool
        ),
        children,
    )
    for group, e in scaled:
        assert e.autoscale is not None
        child = model_spec(e, config, internal_token, env)
        store = child_config(e.config_path or str(config.path(e.source)), child.env)
        meter = StoreMeter.on_redis(
            reactor,
            store.id,
            redis_address(store),
            scrapes,
            internal_token,
            timeout_s=store.redis_timeout_ms / 1000.0,
        )
        meters.append(meter)
        supervisor.scalers[e.id] = Scaler(group, e.autoscale, meter, reactor, e.replica_url)
    # The project's one HTTP server, with the gateway's body limits and budget, and
    # its deadlines (a slow or idle client cannot hold a connection).
    site = api.http_server(
        reactor,
        max_body_bytes=gw.request_size_limit_bytes,
        body_budget_bytes=gw.body_budget_bytes,
        max_connections=gw.max_connections,
        max_connections_per_address=gw.max_connections_per_client,
        read_timeout_s=sup.read_timeout_s,
        idle_timeout_s=sup.idle_timeout_s,
    )
    lines = [
        "mortred control plane",
        f"  supervisor + web UI: http://{sup.api_host}:{sup.api_port}/",
    ]
    if gateway is not None:
        lines.append(f"  gateway:             http://{gw.host}:{gw.port}/v1/models/<id>/...")
    lines.append(f"  models: {', '.join(e.id for e in catalog.enabled())}")
    lines.append(f"  autostart: {', '.join(autostart) or '(none)'}")
    secret_lines: list[str] = []
    if generated:
        secret_lines.append(
            "mortred: generated tokens (shown once, on this terminal only; export them to "
            "keep them across restarts):"
        )
        secret_lines.extend(generated)
        if not env.get("MORTRED_API_TOKEN"):
            secret_lines.append(
                f"  web UI sign-in link: http://{sup.api_host}:{sup.api_port}/#token={api_token}"
            )
    every: list[ManagedServer] = []
    for s in supervisor.all():
        every.extend(getattr(s, "replicas", [s]))
    svc = SupervisorService(
        supervisor,
        autostart,
        "\n".join(lines),
        "\n".join(secret_lines),
        leftovers=lambda: stop_leftovers(every, reactor, timing.grace),
    )
    svc.meters = meters
    internet.TCPServer(
        sup.api_port, site, interface=sup.api_host, reactor=reactor
    ).setServiceParent(svc)
    return svc


def makeService(options: Options) -> service.IService:
    """twistd entry point: the global reactor is chosen here and nowhere else."""
    from twisted.internet import reactor

    try:
        apply_secret_files(os.environ)  # <NAME>_FILE secrets, before anything reads them
        return build_service(options, reactor, dict(os.environ))
    except (usage.UsageError, ConfigErrors) as exc:
        print(f"mortred-supervisor: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

"""``twistd -n mortred-model --config conf/server/<…>.toml``: one model server.

The only place that falls back to the global reactor. Service tree (started in
order, stopped in reverse)::

    MultiService
      ├─ ModelThreadPool      model threads (stopped last)
      ├─ ModelServerService   connects the job store, loads the models, listens,
      │                       drains jobs on stop
      └─ job-store upkeep     retention; leases and reclaim for a shared store

Startup refuses (usage error, non-zero exit) on an invalid config and on a
non-loopback listen host without an auth token (fail-closed). A port it cannot
listen on (another process holds it) is a failed start: the reason is logged, no
model is loaded, and the process exits with
:data:`~mortred_twisted.supervisor.child_contract.EXIT_CANNOT_LISTEN`. A model that fails
to load does not stop the process: it stays up and answers ``/ready`` 503 with the
error, so a supervisor sees why.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Any

from twisted.application.internet import TimerService
from twisted.application.service import IService, MultiService, Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python import usage

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.secret_files import apply_secret_files
from mortred_twisted.config.server import ServerConfig, load_server_config
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.http.model_server import ModelServerApp
from mortred_twisted.http11.auth import is_loopback_host
from mortred_twisted.http11.ratelimit import RateLimiter
from mortred_twisted.metrics.edge import EdgeLimitsCollector
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.runtime.deadline import within
from mortred_twisted.runtime.model_runtime import ModelRuntime
from mortred_twisted.runtime.threads import ModelThreadPool
from mortred_twisted.runtime.validation_twin import publish_twin
from mortred_twisted.supervisor.child_contract import EXIT_CANNOT_LISTEN, spawn_key_from

log = Logger()

FLUSH_DELAY_S = 0.05
#: at shutdown, time the last answers get even when the jobs used the whole grace
ANSWER_FLOOR_S = 0.5


class Options(usage.Options):
    optParameters = [
        ["config", "c", None, "Server TOML (conf/server/<family>/<model>.toml)."],
        ["grace", None, "30", "Seconds to let in-flight jobs finish on shutdown."],
        ["switch-interval", None, "0.0005", "sys.setswitchinterval while serving (s)."],
    ]
    optFlags = [["access-log", None, "Log every request (costs throughput)."]]

    def postOptions(self) -> None:
        if not self["config"]:
            raise usage.UsageError("--config is required")
        try:
            self["grace"] = float(self["grace"])
            self["switch-interval"] = float(self["switch-interval"])
        except ValueError as exc:
            raise usage.UsageError(str(exc)) from None


def check_listen_policy(config: ServerConfig) -> None:
    """Fail closed: a non-loopback host needs a token. Raises UsageError."""
    if not config.auth_token and not is_loopback_host(config.host):
        raise usage.UsageError(
            f"refusing to listen on {config.host} without auth_token "
            "(set MORTRED_AUTH_TOKEN or auth_token, or listen on 127.0.0.1)"
        )


class ModelServerService(Service):
    """Loads the model, listens, and drains the job runner on stop."""

    def __init__(
        self,
        runtime: ModelRuntime,
        app: ModelServerApp,
        *,
        reactor: Any,
        grace_s: float,
        access_log: bool = False,
    ) -> None:
        self.runtime = runtime
        self.app = app
        self._reactor = reactor
        self._grace_s = grace_s
        self._access_log = access_log
        self._port: Any = None
        self._site: ModelPortFactory | None = None
        self.listening: Deferred[Any] = Deferred()
        #: why the port could not be opened (None: it was, or not tried yet)
        self.cannot_listen: str | None = None
        #: the exit status after a failed listen (tests set None: no exit)
        self.exit_code: int | None = EXIT_CANNOT_LISTEN

    def startService(self) -> None:
        super().startService()
        cfg = self.runtime.config
        site = self._build_site(cfg)
        self._site = site
        self.runtime.metrics.registry.register(EdgeLimitsCollector("mortred_http", site))
        host = cfg.host.replace(":", "\\:")
        endpoint = serverFromString(self._reactor, f"tcp:{cfg.port}:interface={host}:backlog=128")
        d = endpoint.listen(site)

        def listening(port: Any) -> Any:
            self._port = port
            addr = port.getHost()
            base = f"http://{cfg.host}:{addr.port}"
            log.info(
                "mortred model server {id} ({model}) listening on {base}\n"
                "  sync:  POST {base}{uri}\n"
                "  async: POST {base}/jobs   (enabled: {async_enabled})\n"
                "  probes: GET {base}/ready   metrics: GET {base}/metrics",
                id=cfg.id,
                model=cfg.model_type,
                base=base,
                uri=cfg.server_uri,
                async_enabled=cfg.async_enabled,
            )
            # Objects alive after start-up never need collecting: keep them out of
            # the full collections that dominate the p99 of a busy reactor.
            gc.freeze()
            self.listening.callback(port)
            return port

        def cannot_listen(failure: Any) -> None:
            log.critical("cannot listen on {host}:{port}: {f}", host=cfg.host,
                         port=cfg.port, f=failure.getErrorMessage())  # fmt: skip
            self.cannot_listen = failure.getErrorMessage()
            self.listening.errback(failure)
            # A failed start, not a clean exit: the supervisor must not count it.
            self._reactor.addSystemEventTrigger(
                "after", "shutdown", exit_now, self.exit_code, self._reactor
            )
            self._reactor.callLater(0, self._reactor.stop)

        d.addCallbacks(listening, cannot_listen)
        if self.cannot_listen is not None:
            return  # nothing to serve: load nothing, connect nothing
        self.runtime.start_store()
        loaded = self.runtime.load_models()
        loaded.addBoth(self._freeze_loaded)
        loaded.addCallback(self._publish_twin)

    def _publish_twin(self, result: Any) -> Any:
        """On the Redis store, the replica's validation twin for the gateway's
        admission at zero replicas (runtime/validation_twin.py); not waited for."""
        publish_twin(self.runtime)
        return result

    @staticmethod
    def _freeze_loaded(result: Any) -> Any:
        """The models (and torch) load after the port opened: freeze again once they
        are in, or every full collection scans torch's and the model's objects for
        the life of the process (~60k objects, 12-35 ms a collection, measured)."""
        gc.freeze()
        return result

    def _build_site(self, cfg: ServerConfig) -> ModelPortFactory:
        """The port's server (:mod:`~mortred_twisted.http.model_port`): the project's
        HTTP/1.1 server with the config's limits and deadlines."""
        return ModelPortFactory.for_app(
            self.app, self._reactor, on_finished=self.app.record_request,
            access_log=self._access_log,
        )  # fmt: skip

    def stopService(self) -> Deferred[None]:
        """Drain within one grace period: jobs get up to ``grace_s``; then every wait
        and event stream still parked is woken to answer the job's current status
        (on a shared store its jobs live on: a wait for one that another replica
        will run must not hang until the port closes), and the answers get what is
        left of the grace (at least ANSWER_FLOOR_S) to be written."""
        super().stopService()
        started = self._reactor.seconds()
        d = self.runtime.shutdown(self._grace_s)

        def release_parked(_: Any) -> None:
            counters = self.runtime.counters
            for name in counters.names():
                counters.count_by_name(name, None)

        def requests_answered(_: Any) -> Deferred[Any]:
            # Wait (bounded) until each in-flight response is written.
            idle = self._site.when_idle() if self._site is not None else succeed(None)
            left = self._grace_s - (self._reactor.seconds() - started)
            return within(self._reactor, idle, max(ANSWER_FLOOR_S, left), cancel_on_expiry=False)

        d.addBoth(release_parked)

        def flushed(_: Any) -> Deferred[None]:
            # One short pause lets the transports flush what was just written
            # before the reactor drops every connection at shutdown.
            return deferLater(self._reactor, FLUSH_DELAY_S, lambda: None)

        def close_port(_: Any) -> Any:
            if self._port is not None:
                return self._port.stopListening()
            return None

        def close_store(_: Any) -> Any:
            return self.runtime.close_store()

        d.addBoth(requests_answered)
        d.addBoth(flushed)
        d.addBoth(close_port)
        d.addBoth(close_store)
        return d


def exit_now(code: int | None, reactor: Any) -> None:
    """After the reactor's shutdown: flush the log and exit with ``code`` (twistd
    itself would exit 0). ``None`` does nothing (in-process tests)."""
    if code is None:
        return
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code)


class OrderedServices(MultiService):
    """Starts children in order and stops them in reverse, each stop waiting for the
    previous one's Deferred (``MultiService`` stops them all at once: the thread pool
    would be joined while the server still drains jobs on it)."""

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)
        children = list(self)[::-1]

        async def stop_in_order() -> None:
            for child in children:
                result = child.stopService()
                if isinstance(result, Deferred):
                    await result

        return Deferred.fromCoroutine(stop_in_order())


def build_service(
    config: ServerConfig,
    *,
    reactor: Any,
    grace_s: float = 30.0,
    switch_interval_s: float | None = 0.0005,
    access_log: bool = False,
) -> MultiService:
    """The whole model-server service tree for ``config`` (tests use this too)."""
    check_listen_policy(config)
    top = OrderedServices()
    threads = ModelThreadPool(
        reactor, config.worker_nums, name=f"mortred-{config.id}",
        switch_interval_s=switch_interval_s, niceness=config.worker_nice,
    )  # fmt: skip
    threads.setServiceParent(top)
    webhook_client = None
    if config.webhook_allowed_hosts:
        # Webhook deliveries: resolved, checked, then pinned to the checked address
        # (see runtime/webhook_client.py).
        from mortred_twisted.runtime.webhook_client import build_webhook_client

        webhook_client = build_webhook_client(reactor, frozenset(config.webhook_allowed_hosts))
    runtime = ModelRuntime(
        config, clock=reactor, threads=threads, metrics=ServerMetrics(),
        call_from_thread=reactor.callFromThread, webhook_client=webhook_client,
        io_threads=lambda fn, *args: deferToThreadPool(reactor, reactor.getThreadPool(), fn, *args),
    )  # fmt: skip
    limiter = RateLimiter(reactor.seconds) if config.rate_limit_qps > 0 else None
    app = ModelServerApp(runtime, rate_limiter=limiter, spawn_key=spawn_key_from(os.environ))
    server = ModelServerService(
        runtime, app, reactor=reactor, grace_s=grace_s, access_log=access_log
    )
    server.setName("model-server")
    server.setServiceParent(top)
    interval = retention_sweep_interval_s(config)
    if interval is not None:
        # Retention also runs on every submit; this frees expired jobs on an idle
        # server (and renews leases, reclaims jobs of lost replicas with a shared
        # store). Last child: stopped first.
        sweep = TimerService(interval, runtime.maintain)
        sweep.clock = reactor
        sweep.setName("retention-sweep")
        sweep.setServiceParent(top)
    return top


#: the upkeep tick of a memory store without a TTL (LRU only) that may store result
#: files: their jobs' LRU eviction and the files' sweep
RESULT_FILES_SWEEP_S = 2.0


def retention_sweep_interval_s(config: ServerConfig) -> float | None:
    """How often to run the ledger's retention between submits: a tenth of the job
    TTL, between 0.1 s and 10 s; None when nothing can expire by time and nothing
    needs the tick (async off, or ``async_job_ttl = 0`` with ``output_files =
    "inline"``: LRU only, which only grows on submit). With ``async_job_ttl = 0`` and
    result files on, :data:`RESULT_FILES_SWEEP_S`: the tick ends the files of jobs LRU
    evicted (the sweep is part of the upkeep; a no-op for the built-in models). A
    shared store also renews leases there: at least three times per ``job_lease_ms``."""
    if not config.async_enabled:
        return None
    if config.job_store == "redis":
        ttl_s = config.async_job_ttl / 1000.0 / 10 if config.async_job_ttl > 0 else 10.0
        return min(10.0, max(0.1, min(ttl_s, config.job_lease_ms / 1000.0 / 3)))
    if config.async_job_ttl <= 0:
        return RESULT_FILES_SWEEP_S if config.output_files == "files" else None
    return min(10.0, max(0.1, config.async_job_ttl / 1000.0 / 10))


def makeService(options: Options) -> IService:
    from twisted.internet import reactor

    try:
        apply_secret_files(os.environ)  # <NAME>_FILE secrets, before anything reads them
        config = load_server_config(options["config"])
    except ConfigErrors as exc:
        print(str(exc), file=sys.stderr)
        raise SystemExit(2) from None
    return build_service(
        config,
        reactor=reactor,
        grace_s=options["grace"],
        switch_interval_s=options["switch-interval"],
        access_log=bool(options["access-log"]),
    )

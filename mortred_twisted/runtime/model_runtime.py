"""``ModelRuntime``: one model server's runtime, wired from its config.

Owns the job store (``[server] job_store``: the in-process ledger, or Redis shared
by the replicas of the model id), the worker pool, the job runner, the sync path,
the named counters and the metrics of one process, and the readiness state. Loading the
model instances happens on the model thread pool at start; a loading error leaves
the runtime *not ready* with the error kept for ``/ready`` and the log — never a
half-working server with random weights.

Thread contract: reactor thread, except :meth:`load_models`' body (model thread).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from mortred_twisted.config.s3 import is_s3_url
from mortred_twisted.config.server import ServerConfig, redis_address
from mortred_twisted.jobs.ledger import AsyncJobTable
from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.status import retry_after_s
from mortred_twisted.jobs.store import JobStore
from mortred_twisted.jobs.webhooks import secret_key
from mortred_twisted.metrics.server import ServerMetrics
from mortred_twisted.model_api.base import InferenceRequest, Model
from mortred_twisted.models.isolated import IsolatedModel
from mortred_twisted.models.registry import create_model
from mortred_twisted.models.threads import apply_torch_threads, torch_threads_for
from mortred_twisted.runtime.counters import NamedCounters
from mortred_twisted.runtime.execution import ThreadRunner
from mortred_twisted.runtime.inference import SyncInference
from mortred_twisted.runtime.job_events import JobEvents
from mortred_twisted.runtime.runner import JobRunner, record_end
from mortred_twisted.runtime.webhooks import WebhookHttpClient, WebhookSender
from mortred_twisted.runtime.workers import WorkerPool
from mortred_twisted.sdk.seed_contract import sdk_declaration
from mortred_twisted.stores.memory_store import MemoryJobStore
from mortred_twisted.stores.result_files import (
    JobFiles,
    ResultFiles,
    ResultFileSweeper,
    ledger_states,
    open_result_files,
    redis_states,
)
from mortred_twisted.stores.wire import decode_request, encode_request

log = Logger()

ModelBuilder = Callable[[str, Mapping[str, Any], Path], Model]


class Readiness(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


class ModelRuntime:
    """See the module docstring."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        clock: IReactorTime,
        threads: ThreadRunner,
        metrics: ServerMetrics | None = None,
        build_model: ModelBuilder = create_model,
        call_from_thread: Callable[..., Any] | None = None,
        webhook_client: WebhookHttpClient | None = None,
        io_threads: Callable[..., Deferred[Any]] | None = None,
    ) -> None:
        self.config = config
        #: ``run(fn, *args)`` on a thread for file IO (result files); the model
        #: threads when not given (the tap gives the reactor's own pool)
        self.io_threads = io_threads or threads.run
        #: the SDK jobs' result files (None until an SDK model loaded with async on)
        self.result_files: ResultFiles | None = None
        self._files_sweeper: ResultFileSweeper | None = None
        self.clock = clock
        self.threads = threads
        self.metrics = metrics or ServerMetrics()
        self._build_model = build_model
        self.counters = NamedCounters()
        #: The in-process ledger (memory store only; None with a shared store).
        self.ledger: AsyncJobTable[InferenceRequest] | None = None
        self.store: JobStore[InferenceRequest] = self._build_store()
        self.webhooks: WebhookSender | None = None
        if webhook_client is not None and config.webhook_allowed_hosts:
            key = secret_key(config.webhook_secret) if config.webhook_secret else None
            self.webhooks = WebhookSender(
                clock=clock, client=webhook_client, key=key,
                deliveries=self.metrics.webhook_deliveries,
            )  # fmt: skip
        #: job lifecycle fan-out: event streams and webhooks (see runtime/job_events.py)
        self.events = JobEvents(
            store=self.store,
            counters=self.counters,
            call_from_thread=call_from_thread or (lambda fn, *a: fn(*a)),
            webhooks=self.webhooks,
        )
        self.readiness = Readiness.LOADING
        self.load_error: str | None = None
        self.models: list[Model] = []
        self.workers: WorkerPool[Model] | None = None
        self.runner: JobRunner | None = None
        self.sync: SyncInference | None = None
        self.metrics.bind_gauges(
            queue_depth=lambda: self.store.queue_depth,
            workers_available=lambda: self.workers.available if self.workers else 0,
            workers_busy=lambda: self.workers.busy if self.workers else 0,
            ready=lambda: 1.0 if self.ready else 0.0,
            waiters=lambda: self.counters.total_waiting,
        )

    def mean_run_s(self, path: str) -> float | None:
        """Mean model run time so far on ``path`` (``sync``/``async``), in seconds."""
        registry = self.metrics.registry
        labels = {"path": path}
        count = registry.get_sample_value("mortred_inference_duration_ms_count", labels)
        total = registry.get_sample_value("mortred_inference_duration_ms_sum", labels)
        if not count or total is None:
            return None
        return total / count / 1000.0

    def retry_after(self, path: str, waiting_ahead: int = 0) -> str:
        """``Retry-After`` for a 429 on ``path``, estimated from the queue."""
        busy = self.workers.busy if self.workers is not None else 1
        return str(retry_after_s(self.mean_run_s(path), busy, waiting_ahead))

    def _build_store(self) -> JobStore[InferenceRequest]:
        cfg = self.config
        if cfg.job_store != "redis":
            self.ledger = AsyncJobTable(
                max_queue=cfg.async_max_queue,
                job_ttl_ms=cfg.async_job_ttl,
                max_completed=cfg.async_max_completed,
                clock=self.clock.seconds,
                max_pending_per_caller=cfg.async_max_queue_per_caller,
            )
            return MemoryJobStore(self.ledger)
        from mortred_twisted.stores.redis_link import RedisLink
        from mortred_twisted.stores.redis_store import RedisJobStore

        address = redis_address(cfg)
        registry = self.metrics.registry
        timeout_s = cfg.redis_timeout_ms / 1000.0
        store = RedisJobStore(
            reactor=self.clock,
            link_factory=lambda reactor, **kw: RedisLink(
                reactor, address, reply_timeout_s=timeout_s, registry=registry, **kw
            ),
            model_id=cfg.id,
            counters=self.counters,
            max_queue=cfg.async_max_queue,
            job_ttl_ms=cfg.async_job_ttl,
            max_completed=cfg.async_max_completed,
            max_pending_per_caller=cfg.async_max_queue_per_caller,
            lease_ms=cfg.job_lease_ms,
            max_attempts=cfg.job_max_attempts,
            budget_ms=cfg.async_timeout,
            encode=encode_request,
            decode=decode_request,
        )
        store.on_queued = self._kick
        store.on_cancel = self._cancel_local
        store.on_change = lambda job_id: self.events.changed(job_id)
        store.on_ended = self._ended_in_store
        return store

    def _ended_in_store(self, job_id: str, state: JobState) -> None:
        """A job the shared store ended by itself (a pending job past its budget, a
        lost replica's job, a flagged job at claim): counted and its webhook sent
        here, once (only the replica whose script ended it is told)."""
        record_end(
            job_id, state, store=self.store, metrics=self.metrics, counters=self.counters,
            events=self.events,
        )  # fmt: skip

    def _kick(self) -> None:
        if self.runner is not None and self.ready:
            self.runner.kick()

    def _cancel_local(self, job_id: str) -> None:
        """Another replica asked to cancel a job: stop it if it runs here."""
        if self.runner is not None:
            self.runner.cancel(job_id)

    def start_store(self) -> None:
        """Connect a shared store (in the background; calls fail with 503 until up)."""
        start = getattr(self.store, "start", None)
        if start is not None:
            start()

    def maintain(self) -> Deferred[Any] | int:
        """The periodic upkeep of the store (retention; leases for a shared one)."""
        out = self.store.maintain()
        if isinstance(out, Deferred):
            out.addErrback(lambda f: log.warn("job store upkeep failed: {e}",
                                              e=f.getErrorMessage()))  # fmt: skip
        self._kick()
        if self._files_sweeper is not None:
            swept = Deferred.fromCoroutine(self._files_sweeper.sweep())
            swept.addErrback(lambda f: log.warn("result file sweep failed: {e}",
                                                e=f.getErrorMessage()))  # fmt: skip
        return out

    def result_files_dir(self) -> Path | None:
        """Where a shared store's result files live (every replica of the id reaches
        it): ``<result_files_dir or <root>/var/results>/<model id>``; None: this
        process's own temporary directory (the memory store's default)."""
        cfg = self.config
        if is_s3_url(cfg.result_files_dir):
            return None  # an object store (see _open_result_files)
        if cfg.result_files_dir:
            return Path(cfg.root) / cfg.result_files_dir / cfg.id
        if cfg.job_store == "redis":
            return Path(cfg.root) / "var" / "results" / cfg.id
        return None

    def _open_result_files(self) -> None:
        """Result files for an SDK model's jobs (nothing for the built-in models:
        their envelope stays the seed's)."""
        files = open_result_files(self.config, self.result_files_dir(), os.environ)
        self.result_files = files
        ledger = self.ledger
        states = ledger_states(ledger) if ledger is not None else redis_states(self.store)
        self._files_sweeper = ResultFileSweeper(files, states, self.io_threads)

    def file_sink(self, job_id: str, request: InferenceRequest) -> JobFiles | None:
        """The result-file sink of one run (the runner asks it for each job): None,
        i.e. files inline, with ``Prefer: return=inline`` or ``output_files =
        "inline"``."""
        files = self.result_files
        if files is None or request.inline_files or self.config.output_files == "inline":
            return None
        return files.sink(job_id)

    @property
    def ready(self) -> bool:
        return self.readiness is Readiness.READY

    @property
    def validator(self) -> Model | None:
        """An instance whose cheap ``validate`` the HTTP edge may call (reactor)."""
        return self.models[0] if self.models else None

    def load_models(self) -> Deferred[None]:
        """Build ``worker_nums`` instances on the model thread pool, then wire up."""
        cfg = self.config

        threads = torch_threads_for(cfg.torch_threads, cfg.worker_nums)

        def build_all() -> list[Model]:
            root = Path(cfg.root)
            models: list[Model]
            if cfg.worker_isolation == "process":
                # Each worker's model lives in its own process; the server validates
                # requests with what each worker sends back, never a model of its
                # own (see models/isolated.py).
                models = [
                    IsolatedModel(
                        cfg.model_type,
                        cfg.model_options,
                        root,
                        niceness=cfg.worker_nice,
                        torch_threads=threads,
                        cancel_grace_s=cfg.cancel_grace_ms / 1000.0,
                    )
                    for _ in range(cfg.worker_nums)
                ]
            else:
                models = [
                    self._build_model(cfg.model_type, cfg.model_options, root)
                    for _ in range(cfg.worker_nums)
                ]
            apply_torch_threads(threads)
            return models

        d = self.threads.run(build_all)
        d.addCallbacks(self._loaded, self._load_failed)
        return d

    def _loaded(self, models: list[Model]) -> None:
        cfg = self.config
        self.models = models
        if cfg.async_enabled and models and sdk_declaration(models[0]) is not None:
            self._open_result_files()
        self.workers = WorkerPool(models)
        self.runner = JobRunner(
            clock=self.clock,
            store=self.store,
            workers=self.workers,
            threads=self.threads,
            counters=self.counters,
            metrics=self.metrics,
            budget_ms=cfg.async_timeout,
            events=self.events,
            result_files=self.file_sink,
        )
        self.sync = SyncInference(
            clock=self.clock,
            workers=self.workers,
            threads=self.threads,
            metrics=self.metrics,
            run_timeout_ms=cfg.model_run_timeout,
            max_queue_depth=cfg.max_queue_depth,
            **self._batching(models[0] if models else None),
        )
        connected = getattr(self.store, "when_connected", None)
        if connected is None:
            self._mark_ready()
        else:  # a shared store: ready once it can be reached (the log says so)
            log.info("model {model} loaded; waiting for the job store", model=cfg.model_type)
            connected().addCallback(lambda _: self._mark_ready())

    def _batching(self, model: Model | None) -> dict[str, Any]:
        """The sync path's dynamic batching: the server file's ``max_batch_size`` when
        above 1, else what an SDK model declares (``predict_batch`` with its class
        attributes ``max_batch_size``/``batch_wait_ms``), else none."""
        cfg = self.config
        declaration = sdk_declaration(model)  # the seed contract: the server file decides
        if cfg.max_batch_size > 1 or declaration is None or declaration.max_batch_size <= 1:
            return {
                "max_batch_size": cfg.max_batch_size,
                "max_batch_delay_ms": cfg.max_batch_delay_ms,
            }
        return {
            "max_batch_size": declaration.max_batch_size,
            "max_batch_delay_ms": declaration.batch_wait_ms,
        }

    def _mark_ready(self) -> None:
        cfg = self.config
        if self.readiness is Readiness.LOADING:
            self.readiness = Readiness.READY
            log.info("model {model} ready: {n} worker(s)", model=cfg.model_type, n=cfg.worker_nums)
            self._kick()

    def _load_failed(self, failure: Any) -> None:
        self.readiness = Readiness.FAILED
        self.load_error = f"{failure.type.__name__}: {failure.getErrorMessage()}"
        log.critical(
            "model {model} failed to load; server stays NOT READY: {error}",
            model=self.config.model_type,
            error=self.load_error,
        )
        cause = getattr(failure.value, "__cause__", None)
        if cause is not None:  # a user's model: the traceback of its import or setup()
            import traceback

            log.error(
                "{model} load failure traceback:\n{tb}",
                model=self.config.model_type,
                tb="".join(traceback.format_exception(cause)),
            )

    def shutdown(self, grace_s: float) -> Deferred[None]:
        """Stop admitting, drain in-flight jobs for up to ``grace_s``, close models."""
        self.readiness = Readiness.STOPPING
        if self.runner is None:
            d: Deferred[Any] = Deferred()
            d.callback(None)
        else:
            d = self.runner.drain(grace_s)

        def close(_: Any) -> None:
            for model in self.models:
                try:
                    model.close()
                except Exception:
                    log.failure("closing a model instance failed")

        d.addBoth(close)
        return d

    def close_store(self) -> Deferred[Any] | None:
        """Disconnect a shared store (after the last answer that needs it); remove
        this process's own result files (a memory store's jobs die with it)."""
        if self.result_files is not None:
            self.result_files.close()
        stop = getattr(self.store, "stop", None)
        return stop() if stop is not None else None

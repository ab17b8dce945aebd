"""The Twisted client: :class:`TwistedClient` and :class:`TwistedJob`, on treq.

Needs the ``twisted`` extra (``pip install './client[twisted]'``). The surface mirrors
the sync client; every method returns a ``Deferred`` (``await`` it inside a
coroutine run by ``Deferred.fromCoroutine``/``ensureDeferred``), and
:meth:`TwistedJob.events` is an async iterator (``async for``). The requests, the
error table and the retry policy are the sync client's (:mod:`.protocol`,
:mod:`.retry`); only sending and sleeping differ.

IO is injected: ``reactor`` (clock and connections; the global reactor when not
given, looked up in the constructor and nowhere else) and ``http`` (a
``treq.client.HTTPClient``, e.g. ``treq.testing.StubTreq`` in tests). Reactor
thread only.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from treq.client import HTTPClient
from twisted.internet import defer, task
from twisted.web import client as web_client
from twisted.web.http_headers import Headers

from mortred_client._twisted_io import BodyChunks, as_os_error, response_headers
from mortred_client.errors import JobFailed, JobNotFinished, NotSupported, TransportError
from mortred_client.images import encode_images
from mortred_client.protocol import (
    Answer,
    Api,
    Call,
    EventFollow,
    check_base_url,
    envelope,
    find_infer_path,
    for_origin,
    new_idempotency_key,
    read_page,
    read_result,
    read_status,
    resolve_url,
    states_param,
)
from mortred_client.retry import RetryPolicy, parse_retry_after, retryable_error, retryable_status
from mortred_client.sse import SseParser
from mortred_client.sync import POLL_MS, check_download, file_target
from mortred_client.types import JobEvent, JobPage, JobStatus, Progress, Result, ResultFile

log = logging.getLogger("mortred_client")


class TwistedClient:
    """The Deferred twin of :class:`mortred_client.Client` (same arguments, plus
    ``reactor`` and ``http``)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        model: str | None = None,
        *,
        timeout: float = 30.0,
        front: str | None = None,
        infer_path: str | None = None,
        retry: RetryPolicy | None = None,
        reactor: Any = None,
        http: HTTPClient | None = None,
        wall: Callable[[], float] | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self.base_url = check_base_url(base_url)
        self.api = Api(front or ("gateway" if model else "model"), model, token or None)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.reactor = reactor
        if http is None:
            # No persistent connections: a stale one must never fail a request that
            # may not be repeated (the sync client does the same).
            pool = web_client.HTTPConnectionPool(reactor, persistent=False)
            http = HTTPClient(web_client.Agent(reactor, pool=pool))
        self.http = http
        self._infer_path = infer_path
        self._wall = wall or reactor.seconds
        self._rng = rng

    def _sleep(self, delay: float) -> defer.Deferred[None]:
        return task.deferLater(self.reactor, delay, lambda: None)

    # -- the request loop -------------------------------------------------------------

    async def _send(self, call: Call, unbuffered: bool = False) -> Any:
        url, pairs = for_origin(self.base_url, call)  # credentials: own origin only
        headers = Headers()
        for name, value in pairs:
            headers.addRawHeader(name.encode("latin-1"), value.encode("latin-1"))
        try:
            return await self.http.request(
                call.method, url, headers=headers,
                data=call.body, timeout=self.timeout + call.hold, unbuffered=unbuffered,
                reactor=self.reactor,
            )  # fmt: skip
        except Exception as exc:
            mapped = as_os_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def _answer(self, call: Call) -> Answer:
        response = await self._send(call)
        try:
            body = await response.content()
        except Exception as exc:
            mapped = as_os_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        return Answer(response.code, response_headers(response), body)

    def call(self, call: Call) -> defer.Deferred[Answer]:
        """Send ``call`` with the retries its safety allows (see the sync client)."""
        return defer.Deferred.fromCoroutine(self._call(call))

    async def _call(self, call: Call) -> Answer:
        attempts = self.retry.start(self.reactor.seconds(), self._rng)
        while True:
            try:
                answer = await self._answer(call)
            except OSError as exc:
                now = self.reactor.seconds()
                delay = attempts.next_delay(now, retryable_error(exc, call.safety))
                if delay is None:
                    url = resolve_url(self.base_url, call.path)
                    raise TransportError(f"{call.method} {url}: {exc}") from exc
                log.info("%s %s: %s; retrying in %.2f s", call.method, call.path, exc, delay)
                await self._sleep(delay)
                continue
            if answer.status < 400:
                return answer
            retry_after = parse_retry_after(answer.headers.get("retry-after"), self._wall())
            retryable = retryable_status(answer.status, call.safety)
            delay = attempts.next_delay(self.reactor.seconds(), retryable, retry_after)
            if delay is None:
                return self.api.check(call, answer, self._wall())  # raises
            log.info(
                "%s %s: HTTP %d (Retry-After %s); retrying in %.2f s", call.method, call.path,
                answer.status, answer.headers.get("retry-after", "-"), delay,
            )  # fmt: skip
            await self._sleep(delay)

    # -- jobs -------------------------------------------------------------------------

    def submit(
        self,
        images: Iterable[Any] | bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        webhook: str | None = None,
        webhook_events: list[str] | None = None,
        priority: int | None = None,
        idempotency_key: str | None = None,
        req_id: str | None = None,
    ) -> defer.Deferred[TwistedJob]:
        """Submit a job; fires with the :class:`TwistedJob` (see ``Client.submit``;
        ``images=None`` or none sends no ``images`` key)."""
        doc = envelope(
            encode_images(images), params, req_id=req_id, webhook=webhook,
            webhook_events=webhook_events, priority=priority,
        )  # fmt: skip
        call = self.api.submit(doc, idempotency_key or new_idempotency_key())

        async def go() -> TwistedJob:
            submitted = self.api.read_submitted(await self._call(call))
            return TwistedJob(self, submitted.status, replayed=submitted.replayed)

        return defer.Deferred.fromCoroutine(go())

    def job(self, job: str) -> TwistedJob:
        """A handle on an existing job: its id or its poll URL (no request made)."""
        poll_url = job if "/" in job else self.api.job_path(job)
        job_id = poll_url.rstrip("/").rsplit("/", 1)[-1]
        return TwistedJob(self, JobStatus(job_id=job_id, state="unknown", poll_url=poll_url))

    def list_jobs(
        self, state: str | Iterable[str] | None = None, limit: int | None = None,
        cursor: str | None = None,
    ) -> defer.Deferred[JobPage]:  # fmt: skip
        """One page of your jobs, newest first."""
        call = self.api.list_page(states_param(state), limit, cursor)
        return self.call(call).addCallback(read_page)

    async def iter_jobs(
        self, state: str | Iterable[str] | None = None, page_size: int = 100
    ) -> AsyncIterator[JobStatus]:
        """Every one of your jobs, newest first, page by page (``async for``)."""
        cursor: str | None = None
        while True:
            page = await self.list_jobs(state, page_size, cursor)
            for job in page.jobs:
                yield job
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def jobs(
        self, state: str | Iterable[str] | None = None, page_size: int = 100
    ) -> defer.Deferred[list[JobStatus]]:
        """Every one of your jobs over every page, as one list."""

        async def collect() -> list[JobStatus]:
            return [job async for job in self.iter_jobs(state, page_size)]

        return defer.Deferred.fromCoroutine(collect())

    def run(
        self,
        images: Iterable[Any] | bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **submit: Any,
    ) -> defer.Deferred[Result]:
        """Submit, wait and fetch the result (see ``Client.run``)."""

        async def go() -> Result:
            job = await self.submit(images, params, **submit)
            return await job.result(wait=True, timeout=timeout)

        return defer.Deferred.fromCoroutine(go())

    # -- sync path and queue ----------------------------------------------------------

    def infer(
        self,
        images: Iterable[Any] | bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        req_id: str | None = None,
    ) -> defer.Deferred[Result]:
        """Sync inference (see ``Client.infer``)."""
        doc = envelope(encode_images(images), params, req_id=req_id)

        async def go() -> Result:
            path = self._infer_path
            if self.api.front == "model" and path is None:
                found = find_infer_path((await self._call(self.api.openapi())).json())
                if found is None:
                    raise NotSupported("this server has no sync inference route")
                path = self._infer_path = found
            return read_result(await self._call(self.api.infer(doc, path)))

        return defer.Deferred.fromCoroutine(go())

    def download(self, file: ResultFile) -> defer.Deferred[bytes]:
        """The bytes of a result file (see ``Client.download``): decoded when inline,
        else fetched from its ``url`` (credentials on the base URL's origin only,
        with the retries); fails with ``ValueError`` when its ``sha256`` differs."""

        async def go() -> bytes:
            data = file.inline_bytes()
            if data is None:
                if not file.url:
                    raise ValueError(f"result file {file.name}: neither url nor base64")
                data = (await self._call(self.api.file(file.url))).body
            return check_download(file, data)

        return defer.Deferred.fromCoroutine(go())

    def queue(self) -> defer.Deferred[Any]:
        """The model's queue JSON; fails with NotSupported when there is none."""
        return self.call(self.api.queue()).addCallback(Answer.json)


class TwistedJob:
    """A submitted job (see :class:`mortred_client.Job`); methods return Deferreds."""

    def __init__(self, client: TwistedClient, status: JobStatus, *, replayed: bool = False) -> None:
        self.client = client
        self.job_id = status.job_id
        self.poll_url = status.poll_url or client.api.job_path(status.job_id)
        self.result_url = status.result_url
        self.replayed = replayed
        self.last = status

    def __repr__(self) -> str:
        return f"<TwistedJob {self.job_id} {self.last.state}>"

    @property
    def state(self) -> str:
        return self.last.state

    @property
    def progress(self) -> Progress | None:
        return self.last.progress

    @property
    def queue_position(self) -> int | None:
        return self.last.queue_position

    def _seen(self, status: JobStatus) -> JobStatus:
        self.last = status
        self.result_url = status.result_url or self.result_url
        return status

    def status(self) -> defer.Deferred[JobStatus]:
        d = self.client.call(self.client.api.status(self.poll_url))
        return d.addCallback(read_status).addCallback(self._seen)

    def wait(
        self, timeout: float | None = None, poll_ms: int = POLL_MS
    ) -> defer.Deferred[JobStatus]:
        """Long-poll until terminal or ``timeout`` seconds; fires with the last status."""
        return defer.Deferred.fromCoroutine(self._wait(timeout, poll_ms))

    async def _wait(self, timeout: float | None, poll_ms: int) -> JobStatus:
        clock = self.client.reactor.seconds
        deadline = None if timeout is None else clock() + timeout
        while True:
            budget = poll_ms
            if deadline is not None:
                budget = min(budget, max(0, int((deadline - clock()) * 1000)))
            answer = await self.client._call(self.client.api.wait(self.poll_url, budget))
            status = self._seen(read_status(answer))
            if status.terminal or (deadline is not None and clock() >= deadline):
                return status

    def result(self, wait: bool = False, timeout: float | None = None) -> defer.Deferred[Result]:
        """The result envelope; fails with JobFailed / JobNotFinished like the sync one."""
        return defer.Deferred.fromCoroutine(self._result(wait, timeout))

    async def _result(self, wait: bool, timeout: float | None) -> Result:
        if wait:
            status = await self._wait(timeout, POLL_MS)
            if not status.terminal:
                raise JobNotFinished(f"job {self.job_id} still {status.state} after {timeout} s")
        api = self.client.api
        try:
            return read_result(await self.client._call(api.result(self.poll_url, self.result_url)))
        except JobNotFinished:
            status = await self.status()
            if status.terminal and not status.done:
                raise JobFailed(status) from None
            raise

    def download_files(
        self, directory: str | os.PathLike[str], *, wait: bool = False,
        timeout: float | None = None,
    ) -> defer.Deferred[list[Path]]:  # fmt: skip
        """Write every result file of this (done) job into ``directory`` (made if
        needed) under its own name; fires with the paths written, in the result's
        order (see ``Job.download_files``: a name that is not a plain file name fails
        with ``ValueError`` before anything is written for it). Files are fetched one
        at a time; each is written to local disk on the reactor thread once whole."""

        async def go() -> list[Path]:
            result = await self._result(wait, timeout)
            out = Path(directory)
            out.mkdir(parents=True, exist_ok=True)
            written: list[Path] = []
            for file in result.files():
                path = file_target(out, file)
                path.write_bytes(await self.client.download(file))
                written.append(path)
            return written

        return defer.Deferred.fromCoroutine(go())

    def cancel(self) -> defer.Deferred[JobStatus]:
        d = self.client.call(self.client.api.cancel(self.poll_url))
        return d.addCallback(read_status).addCallback(self._seen)

    def follow(self, on_event: Callable[[JobEvent], object]) -> defer.Deferred[JobStatus]:
        """Call ``on_event`` for each event; fires with the terminal status."""

        async def go() -> JobStatus:
            async for event in self.events():
                on_event(event)
            return self.last

        return defer.Deferred.fromCoroutine(go())

    async def events(
        self, last_event_id: str | None = None, *, model_events: bool = False
    ) -> AsyncIterator[JobEvent]:
        """The job's live events until the terminal one (``async for``), resumed with
        ``Last-Event-ID`` after a dropped stream (see ``Job.events``). Leaving the
        loop early aborts the stream (use ``contextlib.aclosing`` to do it at once).
        ``model_events``: also yield an SDK model's own events (``preview``, ``output``)."""
        client = self.client
        clock = client.reactor.seconds
        follow = EventFollow(last_event_id, model_events=model_events)
        attempts = client.retry.start(clock(), client._rng)
        while True:
            call = client.api.events(self.poll_url, follow.last_event_id)
            failure: OSError
            try:
                response = await client._send(call, unbuffered=True)
            except OSError as exc:
                failure = exc
            else:
                if response.code >= 400:
                    body = await response.content()
                    answer = Answer(response.code, response_headers(response), body)
                    retry_after = parse_retry_after(
                        answer.headers.get("retry-after"), client._wall()
                    )
                    retryable = retryable_status(answer.status, call.safety)
                    delay = attempts.next_delay(clock(), retryable, retry_after)
                    if delay is None:
                        client.api.check(call, answer, client._wall())
                    await client._sleep(delay or 0.0)
                    continue
                body_reader = BodyChunks()
                response.deliverBody(body_reader)
                parser = SseParser()
                try:
                    while True:
                        chunk = await body_reader.next()
                        if chunk is None:
                            failure = ConnectionError("the event stream ended before the job did")
                            break
                        for sse in parser.feed(chunk):
                            event = follow.accept(sse)
                            if event is None:
                                continue
                            attempts.reset(clock())
                            self._seen(event.status)
                            yield event
                            if event.terminal:
                                return
                except OSError as exc:
                    failure = exc
                finally:
                    body_reader.abort()
            delay = attempts.next_delay(clock(), True)
            if delay is None:
                raise TransportError(f"event stream of {self.job_id}: {failure}") from failure
            log.info(
                "event stream of %s: %s; reopening in %.2f s (Last-Event-ID %s)", self.job_id,
                failure, delay, follow.last_event_id,
            )  # fmt: skip
            await client._sleep(delay)

"""The blocking client: :class:`Client` and :class:`Job` (standard library only).

Thread-safe: a client holds no connection between calls (see :mod:`._http`), and a
:class:`Job` only remembers the last status it saw. Time is injected (``clock``,
``wall``, ``sleep``, ``rng``) so the retry waits can be tested without sleeping.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mortred_client._http import HttpTransport
from mortred_client.errors import JobFailed, JobNotFinished, NotSupported, TransportError
from mortred_client.images import encode_images
from mortred_client.protocol import (
    Answer,
    Api,
    Call,
    EventFollow,
    envelope,
    find_infer_path,
    new_idempotency_key,
    read_page,
    read_result,
    read_status,
    states_param,
)
from mortred_client.retry import RetryPolicy, parse_retry_after, retryable_error, retryable_status
from mortred_client.sse import SseParser
from mortred_client.types import JobEvent, JobPage, JobStatus, Progress, Result, ResultFile

log = logging.getLogger("mortred_client")

#: Budget of one long-poll while waiting (ms): short enough to notice a lost
#: connection, long enough that an idle wait costs two requests a minute.
POLL_MS = 30_000


class Client:
    """A client of one model's job API.

    ``base_url`` is a gateway (with ``model``: ``/v1/models/<model>/…``) or a model
    port (without: ``/jobs``); ``front="supervisor"`` uses the supervisor's operator
    proxy (``mortredctl``). ``token`` is sent as ``Authorization: Bearer``.
    ``timeout`` (seconds) bounds each connect and each read, on top of what a
    long-poll is asked to hold. ``retry`` bounds the retries (see :mod:`.retry`).
    ``infer_path``: a model port's sync route (found in its ``/openapi.json`` when
    not given).
    """

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
        transport: HttpTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.api = Api(front or ("gateway" if model else "model"), model, token or None)
        self.transport = transport or HttpTransport(base_url)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._infer_path = infer_path
        self._clock, self._wall, self._sleep, self._rng = clock, wall, sleep, rng

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release (no connection is kept); for ``with`` blocks."""

    # -- the request loop -------------------------------------------------------------

    def call(self, call: Call) -> Answer:
        """Send ``call``, retrying as its safety and the policy allow; the success
        answer, or the exception of the last outcome."""
        attempts = self.retry.start(self._clock(), self._rng)
        while True:
            try:
                answer = self.transport.send(call, self.timeout)
            except OSError as exc:
                delay = attempts.next_delay(self._clock(), retryable_error(exc, call.safety))
                if delay is None:
                    url = self.transport.url(call.path)
                    raise TransportError(f"{call.method} {url}: {exc}") from exc
                log.info("%s %s: %s; retrying in %.2f s", call.method, call.path, exc, delay)
                self._sleep(delay)
                continue
            if answer.status < 400:
                return answer
            retry_after = parse_retry_after(answer.headers.get("retry-after"), self._wall())
            retryable = retryable_status(answer.status, call.safety)
            delay = attempts.next_delay(self._clock(), retryable, retry_after)
            if delay is None:
                return self.api.check(call, answer, self._wall())  # raises
            log.info(
                "%s %s: HTTP %d (Retry-After %s); retrying in %.2f s", call.method, call.path,
                answer.status, answer.headers.get("retry-after", "-"), delay,
            )  # fmt: skip
            self._sleep(delay)

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
    ) -> Job:
        """Submit a job (202 at admission) and return it.

        ``images`` (bytes, paths, PIL images or numpy arrays; one alone or several)
        go as the envelope's ``images``; ``None`` or none sends no ``images`` key: a
        model declared with the SDK takes its inputs by name in ``params`` (file
        inputs as base64 or ``data:`` URIs there).

        An ``Idempotency-Key`` is generated unless given, so the submit is retried
        like a GET (a lost answer is answered by the first job, never a second one);
        ``job.replayed`` is True when the server says it had admitted it before.
        Raises :class:`~.errors.QueueFull` (429, with ``retry_after``) once the
        retries are spent, :class:`~.errors.InvalidRequest` for a bad envelope.
        """
        doc = envelope(
            encode_images(images), params, req_id=req_id, webhook=webhook,
            webhook_events=webhook_events, priority=priority,
        )  # fmt: skip
        key = idempotency_key or new_idempotency_key()
        submitted = self.api.read_submitted(self.call(self.api.submit(doc, key)))
        return Job(self, submitted.status, replayed=submitted.replayed)

    def job(self, job: str) -> Job:
        """A handle on an existing job: its id, or its poll URL (no request made)."""
        poll_url = job if "/" in job else self.api.job_path(job)
        job_id = poll_url.rstrip("/").rsplit("/", 1)[-1]
        return Job(self, JobStatus(job_id=job_id, state="unknown", poll_url=poll_url))

    def list_jobs(
        self, state: str | Iterable[str] | None = None, limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPage:  # fmt: skip
        """One page of your jobs, newest first (``state``: a name or several)."""
        return read_page(self.call(self.api.list_page(states_param(state), limit, cursor)))

    def jobs(
        self, state: str | Iterable[str] | None = None, page_size: int = 100
    ) -> Iterator[JobStatus]:
        """Every one of your jobs, newest first, following ``next_cursor`` page by page
        (each page fetched when the previous one is used up)."""
        cursor: str | None = None
        while True:
            page = self.list_jobs(state, page_size, cursor)
            yield from page.jobs
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def run(
        self,
        images: Iterable[Any] | bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **submit: Any,
    ) -> Result:
        """Submit, wait and fetch the result in one call; :class:`~.errors.JobFailed`
        if the job ends without one, :class:`~.errors.JobNotFinished` if ``timeout``
        (seconds) passes first."""
        return self.submit(images, params, **submit).result(wait=True, timeout=timeout)

    # -- sync path and queue ----------------------------------------------------------

    def infer(
        self,
        images: Iterable[Any] | bytes | str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        req_id: str | None = None,
    ) -> Result:
        """Sync inference (blocks until the model answered): the envelope. It runs the
        model, so it is retried only on a 429 or a refused connection."""
        doc = envelope(encode_images(images), params, req_id=req_id)
        path = self._infer_path
        if self.api.front == "model" and path is None:
            found = find_infer_path(self.call(self.api.openapi()).json())
            if found is None:
                raise NotSupported("this server has no sync inference route")
            path = self._infer_path = found
        return read_result(self.call(self.api.infer(doc, path)))

    def download(self, file: ResultFile) -> bytes:
        """The bytes of a result file (``Result.files()``): decoded when inline, else
        fetched from its ``url`` with this client's credentials (only on the base
        URL's origin) and retries; checked against its ``sha256`` (``ValueError``
        when they differ)."""
        data = file.inline_bytes()
        if data is None:
            if not file.url:
                raise ValueError(f"result file {file.name}: neither url nor base64")
            data = self.call(self.api.file(file.url)).body
        return check_download(file, data)

    def queue(self) -> Any:
        """The model's queue (``GET /queue``): its JSON. :class:`~.errors.NotSupported`
        when the server has no such route."""
        return self.call(self.api.queue()).json()


class Job:
    """A submitted job. ``state``, ``progress`` and ``queue_position`` are those of the
    last status seen (the submit's, or the last :meth:`status`, :meth:`wait` or
    event); :meth:`status` asks the server."""

    def __init__(self, client: Client, status: JobStatus, *, replayed: bool = False) -> None:
        self.client = client
        self.job_id = status.job_id
        self.poll_url = status.poll_url or client.api.job_path(status.job_id)
        self.result_url = status.result_url
        self.replayed = replayed
        self.last = status

    def __repr__(self) -> str:
        return f"<Job {self.job_id} {self.last.state}>"

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

    def status(self) -> JobStatus:
        """The job's status now (:class:`~.errors.JobNotFound` if unknown)."""
        api = self.client.api
        return self._seen(read_status(self.client.call(api.status(self.poll_url))))

    def wait(self, timeout: float | None = None, poll_ms: int = POLL_MS) -> JobStatus:
        """Wait on the server's long-poll until the job is terminal or ``timeout``
        seconds pass (``None``: no limit); the last status either way (check
        ``.terminal``). A long-poll that ends without news is simply re-issued."""
        clock = self.client._clock
        deadline = None if timeout is None else clock() + timeout
        while True:
            budget = poll_ms
            if deadline is not None:
                budget = min(budget, max(0, int((deadline - clock()) * 1000)))
            call = self.client.api.wait(self.poll_url, budget)
            status = self._seen(read_status(self.client.call(call)))
            if status.terminal or (deadline is not None and clock() >= deadline):
                return status

    def result(self, wait: bool = False, timeout: float | None = None) -> Result:
        """The result envelope of a ``done`` job (repeatable).

        With ``wait`` it first waits (``timeout`` seconds, ``None``: no limit).
        Raises :class:`~.errors.JobFailed` when the job ended failed, timeout or
        cancelled (with its error), :class:`~.errors.JobNotFinished` while it runs.
        """
        if wait:
            status = self.wait(timeout)
            if not status.terminal:
                raise JobNotFinished(f"job {self.job_id} still {status.state} after {timeout} s")
        api = self.client.api
        try:
            return read_result(self.client.call(api.result(self.poll_url, self.result_url)))
        except JobNotFinished:
            status = self.status()
            if status.terminal and not status.done:
                raise JobFailed(status) from None
            raise

    def download_files(
        self, directory: str | os.PathLike[str], *, wait: bool = False,
        timeout: float | None = None,
    ) -> list[Path]:  # fmt: skip
        """Write every result file of this (done) job into ``directory`` (made if
        needed) under its own name; the paths written, in the result's order."""
        result = self.result(wait=wait, timeout=timeout)
        return save_files(self.client, result.files(), directory)

    def cancel(self) -> JobStatus:
        """Cancel: a pending job ends ``cancelled`` at once, a running one is asked to
        stop (``cancel_requested``; :meth:`wait` for its end). Raises
        :class:`~.errors.JobAlreadyFinished` when it had already ended."""
        api = self.client.api
        return self._seen(read_status(self.client.call(api.cancel(self.poll_url))))

    def events(
        self, last_event_id: str | None = None, *, model_events: bool = False
    ) -> Iterator[JobEvent]:
        """The job's live events (``state``, ``progress``, then the terminal one), as
        they happen; ends after the terminal event.

        A stream that drops (connection reset, cut, or ended early) is reopened with
        ``Last-Event-ID``, after the retry policy's backoff; events that repeat the
        last status are skipped. Leaving the loop early closes the stream.
        ``model_events``: also yield the events a model declared with the server's
        SDK emits (``preview``, ``output``; :attr:`JobEvent.model_event`), each once.
        """
        client = self.client
        follow = EventFollow(last_event_id, model_events=model_events)
        attempts = client.retry.start(client._clock(), client._rng)
        while True:
            call = client.api.events(self.poll_url, follow.last_event_id)
            failure: BaseException
            try:
                stream = client.transport.stream(call, client.timeout + 20.0)
            except OSError as exc:
                failure = exc
            else:
                try:
                    if stream.status >= 400:
                        answer = Answer(stream.status, stream.headers, stream.read_all())
                        retry_after = parse_retry_after(
                            answer.headers.get("retry-after"), client._wall()
                        )
                        delay = attempts.next_delay(
                            client._clock(), retryable_status(answer.status, call.safety),
                            retry_after,
                        )  # fmt: skip
                        if delay is None:
                            client.api.check(call, answer, client._wall())
                        client._sleep(delay or 0.0)
                        continue
                    parser = SseParser()
                    for chunk in stream.chunks():
                        for sse in parser.feed(chunk):
                            event = follow.accept(sse)
                            if event is None:
                                continue
                            attempts.reset(client._clock())
                            self._seen(event.status)
                            yield event
                            if event.terminal:
                                return
                    failure = ConnectionError("the event stream ended before the job did")
                except OSError as exc:
                    failure = exc
                finally:
                    stream.close()
            delay = attempts.next_delay(client._clock(), True)
            if delay is None:
                raise TransportError(f"event stream of {self.job_id}: {failure}") from failure
            log.info(
                "event stream of %s: %s; reopening in %.2f s (Last-Event-ID %s)", self.job_id,
                failure, delay, follow.last_event_id,
            )  # fmt: skip
            client._sleep(delay)


def save_files(
    client: Client, files: Iterable[ResultFile], directory: str | os.PathLike[str]
) -> list[Path]:
    """Download each of ``files`` into ``directory`` under its name (a name that is
    not a plain file name, e.g. with ``/`` or a leading dot, is refused with
    ``ValueError``: a server cannot write outside ``directory``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for file in files:
        path = file_target(out, file)
        path.write_bytes(client.download(file))
        written.append(path)
    return written


def file_target(directory: Path, file: ResultFile) -> Path:
    """Where ``file`` goes in ``directory``: its own name, which must be a plain
    file name (``ValueError`` for ``/``, ``\\``, a leading dot or none)."""
    name = file.name
    if not name or name != os.path.basename(name) or name.startswith(".") or "\\" in name:
        raise ValueError(f"result file name refused: {name!r}")
    return directory / name


def check_download(file: ResultFile, data: bytes) -> bytes:
    """``data`` if it matches ``file``'s ``sha256``, else ``ValueError``."""
    if hashlib.sha256(data).hexdigest() != file.sha256:
        raise ValueError(f"result file {file.name}: sha256 does not match")
    return data

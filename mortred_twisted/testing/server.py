"""``MemoryServer``: a model server with its real routes, in memory, without sockets.

The server is the one ``twistd mortred-model`` runs (:class:`ModelRuntime`, the
memory job store, the job runner, :class:`ModelServerApp`'s routes on the project's
HTTP server), driven by hand: time is a :class:`~twisted.internet.task.Clock`, the
model thread pool a queue this class steps (:class:`SteppedThreads`), and requests
go through :class:`~mortred_twisted.testing.memory_http.MemoryClient` (llhttp on
both sides, no socket). Every call settles the server before it returns: due
timers fire, queued model calls run (on the calling thread), answers are flushed.
So a submitted job has finished when ``submit`` returns, unless it waits for a
worker or for time to pass (:meth:`MemoryServer.advance`)::

    server = MemoryServer("models/sharpen.py:Sharpen")
    job = server.submit(image=Path("cat.png"), amount=2.0).json()
    server.wait(job["job_id"])["state"]           # "done"
    doc = server.result(job["job_id"])            # the envelope
    server.file(job["job_id"], "output.png").body # a result file's bytes

Thread contract: one thread (the caller's; no reactor needs to run). The model runs
on that thread too.
"""

from __future__ import annotations

import base64
import json as _json
import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from mortred_twisted.model_api.base import Model, ModelLoadError
from mortred_twisted.sdk.media import File
from mortred_twisted.testing.harness import Target, load_target, target_name

#: A settle loop that has not gone quiet after this many turns is a bug (a model
#: that keeps rescheduling itself at the same instant).
MAX_TURNS = 100_000


class SteppedThreads:
    """The model thread pool as a queue (``ThreadRunner``): ``run`` queues a call, the
    server's settle loop runs it with :meth:`step` on the caller's thread."""

    def __init__(self) -> None:
        self.queue: deque[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Deferred]] = (
            deque()
        )

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.queue.append((fn, args, kwargs, d))
        return d

    @property
    def pending(self) -> int:
        return len(self.queue)

    def step(self) -> None:
        fn, args, kwargs, d = self.queue.popleft()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            d.errback(Failure())
            return
        d.callback(result)


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, headers (lower-case names, the last value of each),
    the body's bytes."""

    code: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return _json.loads(self.body) if self.body else None

    def __repr__(self) -> str:
        return f"Answer({self.code}, {self.body[:200]!r})"


class HTTPStatusError(AssertionError):
    """A request the server answered with a status >= 400 where success was expected."""

    def __init__(self, what: str, answer: Answer) -> None:
        super().__init__(f"{what}: HTTP {answer.code}: {answer.body[:500]!r}")
        self.answer = answer


def json_value(value: Any) -> Any:
    """A harness input as it goes in a JSON submit: files and bytes as base64, paths
    read, Pillow pictures and numpy arrays as PNG, lists item by item."""
    from mortred_twisted.testing.harness import as_media

    value = as_media(value)
    if isinstance(value, File):
        return base64.b64encode(value.read()).decode("ascii")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, os.PathLike):
        return base64.b64encode(Path(value).read_bytes()).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: json_value(v) for k, v in value.items()}
    return value


class MemoryServer:
    """See the module docstring. ``options`` are the ``[model]`` options, ``server``
    the ``[server]`` keys (``id``, ``worker_nums``, ``async_timeout``, …; the async
    job API is on), ``base`` the folder a relative ``file.py`` target is taken from,
    ``root`` the model's root. Raises :class:`ModelLoadError` when the model does
    not load (``setup`` failed, bad declaration)."""

    def __init__(
        self,
        target: Target,
        options: Mapping[str, Any] | None = None,
        *,
        server: Mapping[str, Any] | None = None,
        base: str | os.PathLike[str] | None = None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        from mortred_twisted.config.server import build_server_config

        cls = load_target(target, Path(base) if base is not None else None)
        model_type = target_name(target)
        if isinstance(target, str) and model_type.rpartition(":")[0].endswith(".py"):
            file, _, attr = model_type.rpartition(":")
            model_type = f"{(Path(base or '.') / file).resolve()}:{attr}"
        doc = {
            "server": {
                "id": "memory",
                "server_uri": "/infer",
                "worker_nums": 1,
                "async_enabled": True,
                **(server or {}),
            },
            "model": {"type": model_type, **(options or {})},
        }
        config = build_server_config(doc, root=Path(root) if root else Path.cwd(), env={})
        self._start(config, cls)

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **server: Any) -> MemoryServer:
        """The server a server TOML describes (its ``[server]`` keys overridden by
        ``server``; the job store is always the in-memory one)."""
        from dataclasses import replace

        from mortred_twisted.config.server import load_server_config

        config = load_server_config(path, env={})
        config = replace(config, async_enabled=True, job_store="memory", **server)
        self = cls.__new__(cls)
        self._start(config, load_target(config.model_type))
        return self

    def _start(self, config: Any, served_class: type | None, build_model: Any = None) -> None:
        """Serve ``config`` with ``served_class`` (an SDK class), or with
        ``build_model`` (``(type, options, root) -> Model``: the registry's
        ``create_model`` serves the config's own type)."""
        from mortred_twisted.http.model_port import ModelPortFactory
        from mortred_twisted.http.model_server import ModelServerApp
        from mortred_twisted.metrics.server import ServerMetrics
        from mortred_twisted.runtime.model_runtime import ModelRuntime
        from mortred_twisted.testing.memory_http import MemoryClient

        def build(model_type: str, options: Mapping[str, Any], root: Path) -> Model:
            from mortred_twisted.model_api.input_limits import split_input_limits
            from mortred_twisted.sdk.loading import build_sdk_model

            limits, rest = split_input_limits(model_type, options)
            return build_sdk_model(served_class, rest, root, input_limits=limits)

        if build_model is None:
            build_model = build

        self.config = config
        self.clock = Clock()
        self.threads = SteppedThreads()
        self.runtime = ModelRuntime(
            config,
            clock=self.clock,
            threads=self.threads,
            metrics=ServerMetrics(),
            build_model=build_model,
        )
        self.runtime.load_models()
        self.settle()
        if not self.runtime.ready:
            raise ModelLoadError(self.runtime.load_error or "the model did not load")
        self.app = ModelServerApp(self.runtime)
        self.client = MemoryClient(ModelPortFactory.for_app(self.app, self.clock))
        self.closed = False

    # -- driving the server --------------------------------------------------------

    def _due(self) -> bool:
        now = self.clock.seconds()
        return any(call.getTime() <= now for call in self.clock.getDelayedCalls())

    def settle(self) -> None:
        """Run what can run now: due timers, queued model calls, pending writes."""
        client = getattr(self, "client", None)
        for _ in range(MAX_TURNS):
            self.clock.advance(0)
            if client is not None:
                client.flush()
            if self.threads.pending:
                self.threads.step()
                continue
            if not self._due():
                return
        raise RuntimeError(f"the server did not settle in {MAX_TURNS} turns")

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of server time pass (timeouts, long polls, retention)."""
        self.settle()
        self.clock.advance(seconds)
        self.settle()

    # -- HTTP -----------------------------------------------------------------------

    def request_d(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Deferred[Answer]:
        """One request; the Deferred fires with its :class:`Answer` once the whole
        body was written (the server is settled first)."""
        sent = dict(headers or {})
        if json is not None:
            body = _json.dumps(json).encode("utf-8")
            sent.setdefault("Content-Type", "application/json")
        d = self.client.request(method, "http://localhost" + path, headers=sent, data=body)

        def read(response: Any) -> Deferred[Answer]:
            head = {
                name.decode("latin-1").lower(): values[-1].decode("latin-1")
                for name, values in response.headers.getAllRawHeaders()
            }
            content = response.content()
            content.addCallback(lambda raw: Answer(response.code, head, raw))
            return content

        d.addCallback(read)
        self.settle()
        return d

    def request(self, method: str, path: str, **kw: Any) -> Answer:
        """:meth:`request_d`, settled: the answer, or AssertionError when none came
        (the request still waits: advance time)."""
        d = self.request_d(method, path, **kw)
        got: list[Any] = []
        d.addBoth(got.append)
        self.settle()
        if not got:
            d.cancel()
            d.addErrback(lambda _f: None)
            raise AssertionError(f"{method} {path}: no answer yet (advance the clock?)")
        if isinstance(got[0], Failure):
            got[0].raiseException()
        return got[0]

    # -- the job API ---------------------------------------------------------------

    def submit(
        self,
        params: Mapping[str, Any] | None = None,
        *,
        images: list[Any] | None = None,
        headers: Mapping[str, str] | None = None,
        **inputs: Any,
    ) -> Answer:
        """``POST /jobs`` with the inputs by name in ``params`` (files as base64);
        the answer as it came (202, or the refusal)."""
        doc: dict[str, Any] = {"params": json_value({**(params or {}), **inputs})}
        if images is not None:
            doc["images"] = json_value(list(images))
        return self.request("POST", "/jobs", json=doc, headers=headers)

    def status(self, job_id: str) -> dict[str, Any]:
        return self._ok("status", self.request("GET", f"/jobs/{job_id}")).json()

    def wait(self, job_id: str, timeout_ms: int = 60_000) -> dict[str, Any]:
        """``GET /jobs/{id}/wait``: the job's status once it ended, or once
        ``timeout_ms`` of server time passed."""
        d = self.request_d("GET", f"/jobs/{job_id}/wait?timeout={int(timeout_ms)}")
        got: list[Any] = []
        d.addBoth(got.append)
        if not got:
            self.advance(timeout_ms / 1000.0)
        if not got:
            raise AssertionError(f"wait for {job_id}: no answer after {timeout_ms} ms")
        if isinstance(got[0], Failure):
            got[0].raiseException()
        return self._ok("wait", got[0]).json()

    def result(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/{id}/result``: the envelope (HTTPStatusError unless 200)."""
        return self._ok("result", self.request("GET", f"/jobs/{job_id}/result")).json()

    def cancel(self, job_id: str) -> Answer:
        return self.request("DELETE", f"/jobs/{job_id}")

    def file(self, job_id: str, name: str, headers: Mapping[str, str] | None = None) -> Answer:
        """``GET /jobs/{id}/files/{name}``: a result file, as it came."""
        return self.request("GET", f"/jobs/{job_id}/files/{name}", headers=headers)

    def events(self, job_id: str) -> list[tuple[str, Any]]:
        """``GET /jobs/{id}/events`` of an ended job (the stream then ends): each
        event's name and JSON data, in order (the model's own events after the
        job's ``state``/``progress``/terminal ones, as the server replays them)."""
        answer = self._ok("events", self.request("GET", f"/jobs/{job_id}/events"))
        out: list[tuple[str, Any]] = []
        for record in answer.body.decode("utf-8").split("\n\n"):
            name, data = "message", []
            for line in record.split("\n"):
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "event":
                    name = value
                elif field == "data":
                    data.append(value)
            if data:
                out.append((name, _json.loads("\n".join(data))))
        return out

    def run(self, params: Mapping[str, Any] | None = None, **inputs: Any) -> dict[str, Any]:
        """Submit, wait, and return the result's envelope (HTTPStatusError when a
        step is refused or the job does not end ``done``)."""
        job = self._ok("submit", self.submit(params, **inputs)).json()
        status = self.wait(job["job_id"])
        if status.get("state") != "done":
            raise AssertionError(f"job {job['job_id']} ended {status.get('state')}: {status}")
        return self.result(job["job_id"])

    def files_of(self, data: Any) -> dict[str, bytes]:
        """Every result file an envelope's ``data`` describes, by name: fetched from
        its ``url``, or decoded from an inline ``base64``."""
        found: dict[str, bytes] = {}

        def walk(value: Any) -> None:
            if isinstance(value, dict):
                if isinstance(value.get("sha256"), str) and "name" in value:
                    if "base64" in value:
                        found[value["name"]] = base64.b64decode(value["base64"])
                    elif isinstance(value.get("url"), str):
                        answer = self._ok("file", self.request("GET", value["url"]))
                        found[value["name"]] = answer.body
                    return
                for item in value.values():
                    walk(item)
            elif isinstance(value, list):
                for item in value:
                    walk(item)

        walk(data)
        return found

    @staticmethod
    def _ok(what: str, answer: Answer) -> Answer:
        if answer.code >= 400:
            raise HTTPStatusError(what, answer)
        return answer

    def close(self) -> None:
        """Stop the server: drain, close the model, remove its result files."""
        if self.closed:
            return
        self.closed = True
        self.runtime.shutdown(0)
        self.settle()
        self.runtime.close_store()
        self.settle()
        for call in self.clock.getDelayedCalls():
            call.cancel()

    def __enter__(self) -> MemoryServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

"""What a model port would cost on the gateway's llhttp server: a measurement probe.

    .venv/bin/python bench/llhttp_port_probe.py [--rounds 2] [--store redis|memory]

Runs one model server (the fake model, the settings of ``bench/replicas.py``) twice
per round, pinned to CPU 0 with the client (and ``redis-server``) on CPU 1, and
measures submit ×32 (40 submits per connection) on each:

* ``twisted.web``: the model server as it ships (``LimitedSite`` + ``FramingChannel``
  + ``FastRoutes``);
* ``llhttp``: the same process, whose port is instead served by
  :class:`~mortred_twisted.gateway.server.GatewayServerFactory` (llhttp framing,
  pipelining, deadlines) with an app that matches the hot routes exactly as
  ``FastRoutes`` does and calls the *same* instrumented handlers through a small
  adapter (the part of ``IRequest`` those handlers use).

This is a probe, not a server to run: the llhttp variant answers only the hot
routes (submit, status, wait, result, sync infer; anything else is a 404) and
applies none of ``LimitedSite``'s policies beyond the body limit. It exists to
measure, on the real handlers and store, what the HTTP stack costs per submit
(docs/benchmarks.md, issue 10's submit target). Prints a Markdown table; nothing
here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class _HotRouteRequest:
    """The ``IRequest`` subset the hot handlers read and write, over the gateway
    server's :class:`~mortred_twisted.gateway.messages.ProxyRequest`."""

    def __init__(self, proxy: Any) -> None:
        self._proxy = proxy
        self.method = proxy.method
        self.path = proxy.path
        self.uri = proxy.uri
        self.requestHeaders = proxy.requestHeaders
        self.content = proxy.content if proxy.content is not None else io.BytesIO(b"")
        self.code = 200
        self._args: dict[bytes, list[bytes]] | None = None

    @property
    def args(self) -> dict[bytes, list[bytes]]:
        if self._args is None:
            self._args = parse_qs(self.uri.partition(b"?")[2], keep_blank_values=True)
        return self._args

    def setHeader(self, name: bytes, value: bytes) -> None:
        self._proxy.setHeader(name, value)

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = self._proxy.code = code

    def getClientAddress(self) -> Any:
        return self._proxy.peer


class _HotRoutesApp:
    """``dispatch`` for the gateway server: the hot routes of ``root`` (a
    ``FastRoutes``), each counted by ``on_finished`` as the site would."""

    def __init__(self, root: Any, on_finished: Any) -> None:
        self._root = root
        self._on_finished = on_finished

    def dispatch(self, proxy: Any) -> Any:
        request = _HotRouteRequest(proxy)
        matched = self._root._match(request)
        if matched is None:
            proxy.code = 404
            return b'{"error":"not a hot route (llhttp probe)"}'
        handler, kwargs = matched
        outcome = handler(request, **kwargs)
        if hasattr(outcome, "addCallback"):

            def counted(body: bytes) -> bytes:
                self._on_finished(request)
                return body

            return outcome.addCallback(counted)
        self._on_finished(request)
        return outcome


def _run_child(argv: list[str]) -> None:
    """The model server, its port on the gateway's server (``--child``)."""
    from twisted.internet.defer import succeed

    import mortred_twisted.tap.model_server as tap
    from mortred_twisted.gateway.server import GatewayServerFactory
    from mortred_twisted.supervisor import launch

    def site(resource: Any, limit: int, _early_reject: Any, **kw: Any) -> Any:
        factory = GatewayServerFactory(
            _HotRoutesApp(resource, kw["on_finished"]), clock=kw["reactor"], max_body_bytes=limit
        )
        factory.when_idle = lambda: succeed(None)  # type: ignore[attr-defined]
        return factory

    tap.LimitedSite = site  # type: ignore[misc,assignment]
    sys.argv = ["twistd", *argv]
    launch.main()


def _start(tmp: Path, stack: str, store: str, redis_url: str, model_id: str) -> tuple[Any, int]:
    import http.client

    from bench.replicas import INTERNAL, SERVER_TOML
    from tests.support.servers import free_port
    from tests.support.waiting import wait_until

    port = free_port()
    conf = tmp / f"{model_id}.toml"
    toml = SERVER_TOML.format(id=model_id, store=store, root=ROOT)
    conf.write_text(toml.replace("port = 18120", f"port = {port}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")}
    env.update(
        PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", MORTRED_AUTH_TOKEN=INTERNAL,
        MORTRED_REDIS_URL=redis_url,
    )  # fmt: skip
    twistd = ["-n", "--pidfile=", "--logfile", str(tmp / f"{model_id}.log"), "mortred-model",
              "--config", str(conf)]  # fmt: skip
    if stack == "llhttp":
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *twistd]
    else:
        cmd = [sys.executable, "-m", "mortred_twisted.supervisor.launch", *twistd]
    process = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=str(tmp), env=env)

    def ready() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/jobs/job_none", headers={"Authorization": f"Bearer {INTERNAL}"})
            return conn.getresponse().status == 404
        except OSError:
            return False

    wait_until(ready, 120, f"{model_id} on {stack} ready")
    return process, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--store", choices=("redis", "memory"), default="redis")
    parser.add_argument("--submits-per-client", type=int, default=40)
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.child is not None:
        _run_child(args.child)
        return
    import shutil

    from bench.replicas import _cpu_s, _pin, submit_p99
    from tests.support.redis_server import redis_server

    print(
        "| round | stack on the model port | n | p50 ms | p99 ms | rate /s "
        "| server CPU per submit |"
    )
    print("|---|---|---|---|---|---|---|")
    tmp = Path(tempfile.mkdtemp(prefix="mortred-llhttp-probe-"))
    mine = os.sched_getaffinity(0)
    try:
        with redis_server() as redis:
            assert redis.process is not None
            _pin(redis.process.pid, {1})
            for r in range(1, args.rounds + 1):
                for stack in ("twisted.web", "llhttp"):
                    key = "llhttp" if stack == "llhttp" else "twisted"
                    process, port = _start(tmp, key, args.store, redis.url, f"PROBE{r}{key}")
                    try:
                        os.sched_setaffinity(0, {1})
                        asyncio.run(submit_p99(port, 5))  # warm-up
                        before = _cpu_s(process.pid)
                        st = asyncio.run(submit_p99(port, args.submits_per_client))
                        cpu = (_cpu_s(process.pid) - before) / max(1, st.count) * 1e6
                    finally:
                        os.sched_setaffinity(0, mine)
                        process.terminate()
                        process.wait(15)
                    print(
                        f"| {r} | {stack} ({args.store} store) | {st.count} | {st.pct(50):.2f} "
                        f"| {st.pct(99):.2f} | {st.rate:,.0f} | {cpu:.0f} µs |",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

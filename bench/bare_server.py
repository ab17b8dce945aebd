"""A bare HTTP server returning fixed JSON bytes: the poll baseline.

``python bench/bare_server.py PORT BODY_FILE [twisted|llhttp]`` serves ``GET
/jobs/<anything>`` with the bytes of BODY_FILE (same headers as the model server's
status answer), so the model server's ``GET /jobs/{id}`` throughput can be compared
with what the HTTP stack itself can do in the same run on the same core.
``twisted`` (the default) is a one-method ``twisted.web`` resource, the stack the
model ports run on; ``llhttp`` is the gateway's own HTTP/1.1 server
(:mod:`mortred_twisted.http11.server`) with an app that answers the same bytes.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.web.resource import Resource
from twisted.web.server import Site


class Fixed(Resource):
    isLeaf = True

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body = body

    def render_GET(self, request):
        request.setHeader(b"Content-Type", b"application/json; charset=utf-8")
        request.setHeader(b"Cache-Control", b"no-store")
        request.setHeader(b"Content-Length", str(len(self.body)).encode())
        return self.body


class QuietSite(Site):
    def log(self, request) -> None:
        pass


class FixedApp:
    """The same answer through the gateway's server (``dispatch`` contract)."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def dispatch(self, request: Any) -> bytes:
        request.responseHeaders.setRawHeaders(b"Content-Type", [b"application/json; charset=utf-8"])
        request.responseHeaders.setRawHeaders(b"Cache-Control", [b"no-store"])
        return self.body


def main() -> None:
    port = int(sys.argv[1])
    with open(sys.argv[2], "rb") as f:
        body = f.read()
    stack = sys.argv[3] if len(sys.argv) > 3 else "twisted"
    if stack == "llhttp":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from mortred_twisted.http11.server import HTTPServerFactory

        factory: Any = HTTPServerFactory(FixedApp(body), clock=reactor, max_body_bytes=1 << 20)
    elif stack == "twisted":
        factory = QuietSite(Fixed(body))
    else:
        raise SystemExit(f"unknown stack {stack!r} (twisted or llhttp)")
    reactor.listenTCP(port, factory, interface="127.0.0.1")
    print("bare server listening", flush=True)
    gc.freeze()
    reactor.run()


if __name__ == "__main__":
    main()

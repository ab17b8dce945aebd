"""A bare ``twisted.web`` resource returning fixed JSON bytes: the poll baseline.

``python bench/bare_server.py PORT BODY_FILE`` serves ``GET /jobs/<anything>`` with
the bytes of BODY_FILE (same headers as the model server's status answer), so the
model server's ``GET /jobs/{id}`` throughput can be compared with what twisted.web
itself can do in the same run on the same core.
"""

from __future__ import annotations

import gc
import sys

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


def main() -> None:
    port = int(sys.argv[1])
    with open(sys.argv[2], "rb") as f:
        body = f.read()
    reactor.listenTCP(port, QuietSite(Fixed(body)), interface="127.0.0.1")
    print("bare server listening", flush=True)
    gc.freeze()
    reactor.run()


if __name__ == "__main__":
    main()

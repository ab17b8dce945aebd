"""Blocking HTTP/1.1 on :mod:`http.client` (standard library only).

One connection per request (closed after it): no stale keep-alive connection can
make a request that must not be repeated fail on a connection the server had
already closed. Every failure to get a complete answer is an ``OSError``
(``http.client`` protocol errors become ``ConnectionError``), which the retry
policy classifies.
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

from mortred_client.protocol import Answer, Call, check_base_url, for_origin, resolve_url


class HttpTransport:
    """Sends :class:`Call` s to ``base_url`` (``http`` or ``https``; a path prefix in
    the base URL is put before every path the client builds). Thread-safe: it holds
    no connection between calls."""

    def __init__(self, base_url: str, ssl_context: ssl.SSLContext | None = None) -> None:
        self.base_url = check_base_url(base_url)
        self._ssl = ssl_context

    def _connection(self, url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        port = parts.port
        if parts.scheme == "https":
            ctx = self._ssl or ssl.create_default_context()
            return http.client.HTTPSConnection(
                parts.hostname or "", port, timeout=timeout, context=ctx
            ), target
        return http.client.HTTPConnection(parts.hostname or "", port, timeout=timeout), target

    def url(self, path: str) -> str:
        """An absolute URL for a client-built path or a server's link."""
        return resolve_url(self.base_url, path)

    def send(self, call: Call, timeout: float) -> Answer:
        """The whole answer to ``call``; ``OSError`` when there is none."""
        url, headers = for_origin(self.base_url, call)  # credentials: own origin only
        conn, target = self._connection(url, timeout + call.hold)
        try:
            conn.request(call.method, target, body=call.body, headers=dict(headers))
            resp = conn.getresponse()
            body = resp.read()
            return Answer(resp.status, _headers(resp), body)
        except http.client.HTTPException as exc:
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    def stream(self, call: Call, timeout: float) -> Stream:
        """Open ``call`` and return its answer's head with the body still to read."""
        url, headers = for_origin(self.base_url, call)  # credentials: own origin only
        conn, target = self._connection(url, timeout)
        try:
            conn.request(call.method, target, body=call.body, headers=dict(headers))
            resp = conn.getresponse()
        except http.client.HTTPException as exc:
            conn.close()
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return Stream(conn, resp)


class Stream:
    """An answer whose body is read as it arrives; close it when done."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self.status = resp.status
        self.headers = _headers(resp)

    def read_all(self) -> bytes:
        try:
            return self._resp.read()
        except http.client.HTTPException as exc:
            raise ConnectionError(str(exc)) from exc

    def chunks(self, size: int = 65536) -> Iterator[bytes]:
        """The body's bytes as they come (``read1``: whatever is there, at once); ends
        with the body. ``OSError`` when the connection breaks mid-body."""
        while True:
            try:
                chunk = self._resp.read1(size)
            except http.client.HTTPException as exc:
                raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        self._resp.close()
        self._conn.close()


def _headers(resp: http.client.HTTPResponse) -> dict[str, str]:
    return {k.lower(): v for k, v in resp.getheaders()}

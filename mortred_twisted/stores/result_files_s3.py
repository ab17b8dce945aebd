"""Result files in an S3-compatible object store (blocking IO; standard library only).

Chosen with a URL-shaped ``result_files_dir = "s3://<bucket>/<prefix>"``; the
endpoint and region are server keys (``result_files_s3_endpoint``, default AWS's
``https://s3.<region>.amazonaws.com``; ``result_files_s3_region``, default
``us-east-1``) and the credentials come from the environment only
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optional ``AWS_SESSION_TOKEN``),
never from a file. The bucket must exist; requests are path-style
(``<endpoint>/<bucket>/<key>``), which SeaweedFS, MinIO, Ceph and AWS all serve.

Layout (the directory store's, as keys)::

    <prefix>/<model id>/<job id>/<name>      the bytes; Content-Type as given,
                                             x-amz-meta-sha256: the hex digest

A PUT is atomic in S3 (an object is visible whole or not at all), so there is no
sidecar: a reader sees the old object or the new one, never part of one. Every
request is signed with AWS Signature Version 4 (``sigv4.sign``) over the payload's
sha256, and a PUT carries ``x-amz-checksum-sha256``: the server refuses a body that
changed on the way (SeaweedFS checks the latter only, AWS both).

Same interface and retention as :class:`~.result_files.DirectoryResultFiles`:
``sink``/``put``/``lookup``/``read``/``clear``/``remove``/``job_ids``/``close``;
the runtime's :class:`~.result_files.ResultFileSweeper` removes the objects of jobs
the job store no longer knows. Thread contract: every method is blocking and
thread-safe (each thread keeps its own keep-alive connection); call it from a worker
thread or the IO thread pool, never the reactor. A failed request raises
:class:`S3Error` (or ``OSError`` for the network) after up to :data:`ATTEMPTS`
tries of the idempotent requests this store makes.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from mortred_twisted.config.s3 import (
    ACCESS_KEY_ENV,
    SECRET_KEY_ENV,
    TOKEN_ENV,
    S3Location,
    parse_s3_url,
)
from mortred_twisted.stores.result_files import (
    SWEEP_BATCH,
    FileChanged,
    FileRange,
    JobFiles,
    StoredFile,
    check_name,
)
from mortred_twisted.stores.sigv4 import UNRESERVED as _UNRESERVED
from mortred_twisted.stores.sigv4 import sign

#: tries per request (a dropped keep-alive connection, a 500/503 from the server)
ATTEMPTS = 3
TIMEOUT_S = 30.0
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class S3Error(OSError):
    """An S3 request the server refused: ``status`` and its error ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"S3 {status} {code}: {message}")
        self.status = status
        self.code = code


def default_endpoint(region: str) -> str:
    return f"https://s3.{region}.amazonaws.com"


# -- the store ----------------------------------------------------------------------


class _Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _error(reply: _Reply) -> S3Error:
    code, message = "", reply.body[:200].decode("utf-8", "replace")
    try:
        doc = ET.fromstring(reply.body)
        code = doc.findtext("{*}Code") or ""
        message = doc.findtext("{*}Message") or message
    except ET.ParseError:
        pass
    return S3Error(reply.status, code or http.client.responses.get(reply.status, ""), message)


class S3ResultFiles:
    """Result files of one model id under ``s3://<bucket>/<prefix><model id>/`` (see
    the module docstring). ``now`` and ``sleep`` are injected for tests."""

    owned = False
    #: keys per listing request (S3's most; tests make it small to page)
    page = 1000

    def __init__(
        self,
        location: S3Location,
        model_id: str,
        *,
        endpoint: str,
        region: str,
        access_key: str,
        secret_key: str,
        session_token: str = "",
        timeout_s: float = TIMEOUT_S,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"result_files_s3_endpoint: not an http(s) URL: {endpoint!r}")
        self.location = location
        self._tls = parts.scheme == "https"
        self._host = parts.netloc
        self._base = parts.path.rstrip("/")
        self._region = region
        self._access = access_key
        self._secret = secret_key
        self._token = session_token
        self._timeout = timeout_s
        self._now = now
        self._sleep = sleep
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        #: keys of this model id's files: ``<prefix><model id>/``
        self.root = f"{location.prefix}{check_name(model_id, 'model id')}/"

    @classmethod
    def from_config(cls, config: Any, env: Mapping[str, str]) -> S3ResultFiles:
        """The store ``config.result_files_dir`` (an ``s3://`` URL) names, with the
        credentials from ``env`` (checked by the config already)."""
        region = config.result_files_s3_region
        return cls(
            parse_s3_url(config.result_files_dir), config.id,
            endpoint=config.result_files_s3_endpoint or default_endpoint(region),
            region=region, access_key=env[ACCESS_KEY_ENV], secret_key=env[SECRET_KEY_ENV],
            session_token=env.get(TOKEN_ENV, ""),
        )  # fmt: skip

    def __repr__(self) -> str:
        scheme = "https" if self._tls else "http"
        where = f"s3://{self.location.bucket}/{self.root}"
        return f"<S3ResultFiles {where} at {scheme}://{self._host}>"

    # -- HTTP -------------------------------------------------------------------------

    def _connection(self, fresh: bool) -> http.client.HTTPConnection:
        """This thread's keep-alive connection (a new one when ``fresh``)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and not fresh:
            return conn
        if conn is not None:
            self._drop(conn)
        kind = http.client.HTTPSConnection if self._tls else http.client.HTTPConnection
        conn = kind(self._host, timeout=self._timeout)
        self._local.conn = conn
        with self._lock:
            self._connections.append(conn)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def _request(
        self, method: str, key: str | None, *, query: Mapping[str, str] | None = None,
        body: bytes = b"", headers: Mapping[str, str] | None = None,
        ok: Iterable[int] = (200,),
    ) -> _Reply:  # fmt: skip
        path = f"{self._base}/{self.location.bucket}" + (f"/{key}" if key is not None else "")
        query = dict(query or {})
        payload = hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA256
        target = quote(path, safe="/" + _UNRESERVED)
        if query:
            target += "?" + "&".join(
                f"{quote(k, safe=_UNRESERVED)}={quote(v, safe=_UNRESERVED)}"
                for k, v in sorted(query.items())
            )
        accepted = frozenset(ok)
        for attempt in range(ATTEMPTS):
            signed = sign(
                method, self._host, path, query, dict(headers or {}), payload,
                region=self._region, access_key=self._access, secret_key=self._secret,
                session_token=self._token, now=self._now(),
            )  # fmt: skip
            if body or method == "PUT":
                signed["content-length"] = str(len(body))
            conn = self._connection(fresh=attempt > 0)
            try:
                conn.request(method, target, body=body or None, headers=signed)
                response = conn.getresponse()
                data = response.read()
            except (http.client.HTTPException, ConnectionError, TimeoutError):
                self._drop(conn)
                if attempt + 1 == ATTEMPTS:
                    raise
                self._sleep(0.05 * 4**attempt)
                continue
            reply = _Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
            if response.will_close:
                self._drop(conn)
            if reply.status in accepted:
                return reply
            if reply.status in (500, 502, 503, 504) and attempt + 1 < ATTEMPTS:
                self._sleep(0.05 * 4**attempt)
                continue
            raise _error(reply)
        raise AssertionError("unreachable")

    def _job_key(self, job_id: str, name: str | None = None) -> str:
        base = f"{self.root}{check_name(job_id, 'job id')}/"
        return base if name is None else base + check_name(name)

    def _list(
        self, prefix: str, *, delimiter: str = "", start_after: str = "", limit: int = 1000
    ) -> tuple[list[str], list[str]]:
        """(keys, common prefixes) under ``prefix``, every page, up to ``limit`` of
        each, in key order."""
        keys: list[str] = []
        prefixes: list[str] = []
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix, "max-keys": str(min(self.page, limit))}
            if delimiter:
                query["delimiter"] = delimiter
            if token:
                query["continuation-token"] = token
            elif start_after:
                query["start-after"] = start_after
            doc = ET.fromstring(self._request("GET", None, query=query).body)
            keys += [e.text or "" for e in doc.iterfind("{*}Contents/{*}Key")]
            prefixes += [e.text or "" for e in doc.iterfind("{*}CommonPrefixes/{*}Prefix")]
            token = doc.findtext("{*}NextContinuationToken") or ""
            truncated = (doc.findtext("{*}IsTruncated") or "false").lower() == "true"
            if not truncated or not token or len(keys) >= limit or len(prefixes) >= limit:
                return keys[:limit], prefixes[:limit]

    # -- the interface ----------------------------------------------------------------

    def sink(self, job_id: str) -> JobFiles:
        """The sink of one run of ``job_id`` (``sdk.outputs.FileSink``)."""
        check_name(job_id, "job id")
        return JobFiles(self, job_id)

    def put(self, job_id: str, name: str, data: bytes, content_type: str) -> StoredFile:
        """Store ``data`` as ``name`` of ``job_id`` (one signed PUT: atomic)."""
        key = self._job_key(job_id, name)
        digest = hashlib.sha256(data).hexdigest()
        headers = {
            "content-type": str(content_type),
            "x-amz-meta-sha256": digest,
            # checked by the server against the body (SeaweedFS does not check the
            # signed payload hash; AWS checks both)
            "x-amz-checksum-sha256": base64.b64encode(bytes.fromhex(digest)).decode("ascii"),
        }
        self._request("PUT", key, body=data, headers=headers)
        return StoredFile(key, name, str(content_type), len(data), digest)

    def lookup(self, job_id: str, name: str) -> StoredFile | None:
        """The stored file ``name`` of ``job_id`` (a HEAD), or None (unknown, or an
        object that is not ours). Raises ``BadFileName`` for an unsafe name."""
        key = self._job_key(job_id, name)
        reply = self._request("HEAD", key, ok=(200, 404))
        digest = reply.headers.get("x-amz-meta-sha256", "")
        if reply.status == 404 or len(digest) != 64:
            return None
        size = int(reply.headers.get("content-length", "0"))
        content_type = reply.headers.get("content-type", "application/octet-stream")
        return StoredFile(key, name, content_type, size, digest)

    def read(self, found: StoredFile, start: int, length: int) -> bytes:
        """``length`` bytes of a looked-up file from ``start`` (a ranged GET)."""
        if length <= 0:
            return b""
        headers = {"range": f"bytes={start}-{start + length - 1}"}
        reply = self._request("GET", found.path, headers=headers, ok=(200, 206))
        if reply.status == 200:  # a server that ignored the range: cut it here
            return reply.body[start : start + length]
        return reply.body

    def open_range(self, found: StoredFile, start: int, length: int) -> FileRange:
        """A reader of ``length`` bytes of a looked-up object from ``start``: one
        ranged GET of :data:`S3_CHUNK` bytes per read, each checked to come from the
        object looked up (its ``x-amz-meta-sha256``; another attempt's object
        raises :class:`FileChanged`, so an answer is cut, never mixed)."""
        return _S3Range(self, found, start, length)

    def clear(self, job_id: str, keep: Iterable[str] = ()) -> None:
        """Remove what an earlier attempt of ``job_id`` left (all but ``keep``)."""
        base = self._job_key(job_id)
        kept = {base + k for k in keep}
        keys, _ = self._list(base, limit=100_000)
        for key in keys:
            if key not in kept:
                self._request("DELETE", key, ok=(200, 204, 404))

    def remove(self, job_id: str) -> None:
        """Remove every file of ``job_id`` (nothing if it has none), and the folder
        entry a filer-backed server (SeaweedFS) keeps for ``<job id>/`` until its
        own cleanup: the sweep would list an empty job again (on AWS, where there
        are no folders, that DELETE is a no-op 204)."""
        self.clear(job_id)
        self._request("DELETE", self._job_key(job_id), ok=(200, 204, 404))

    def job_ids(self, after: str = "", limit: int = SWEEP_BATCH) -> list[str]:
        """Up to ``limit`` job ids with files, in name order, after ``after``."""
        # "~" sorts after every character of a safe name: skip all of after's keys
        start = f"{self.root}{after}/~" if after else ""
        _, prefixes = self._list(self.root, delimiter="/", start_after=start, limit=limit)
        ids = [p[len(self.root) :].rstrip("/") for p in prefixes]
        return [j for j in ids if j > after and _safe(j)]

    def close(self) -> None:
        """Close the connections (the objects stay: the store is shared)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()


def _safe(name: str) -> bool:
    try:
        check_name(name)
    except ValueError:
        return False
    return True


#: bytes one ranged GET of a streamed answer asks for (fewer requests than the
#: directory's chunk: each costs a round trip to the object store)
S3_CHUNK = 1024 * 1024


class _S3Range:
    """:class:`FileRange` of an S3 object: a ranged GET per :meth:`read`."""

    __slots__ = ("_files", "_found", "_left", "_pos", "chunk")

    def __init__(self, files: S3ResultFiles, found: StoredFile, start: int, length: int) -> None:
        self._files = files
        self._found = found
        self._pos = start
        self._left = length
        self.chunk = S3_CHUNK

    def read(self, n: int) -> bytes:
        n = min(n, self._left)
        if n <= 0:
            return b""
        found = self._found
        headers = {"range": f"bytes={self._pos}-{self._pos + n - 1}"}
        reply = self._files._request("GET", found.path, headers=headers, ok=(200, 206))
        if reply.headers.get("x-amz-meta-sha256", found.sha256) != found.sha256:
            raise FileChanged(f"{found.name} was replaced since its lookup")
        data = reply.body[self._pos : self._pos + n] if reply.status == 200 else reply.body[:n]
        self._pos += len(data)
        self._left -= len(data)
        return data

    def close(self) -> None:
        """Nothing to release (each read is a whole request)."""

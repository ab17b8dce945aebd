"""Result files: where the ``Image``/``File`` outputs of SDK jobs are kept (blocking IO).

A job whose output holds files stores them here from the worker thread, inside its
run, so a job is never ``done`` without its files (``sdk/outputs.py`` writes their
descriptions into the result and calls :meth:`JobFiles.put`). Layout of a
:class:`DirectoryResultFiles` root::

    <root>/<job id>/<name>              the bytes
    <root>/<job id>/.<name>.meta        {"content_type", "size", "sha256"} (JSON)

Both are written atomically (a temporary file in the same directory, ``fsync``,
``rename``; the directory is fsynced after), the bytes before their sidecar: a file
without a sidecar is not served (a write cut by a crash is invisible), and a reader
never sees half a file. Concurrent puts of one name end with one of them, whole.

Who uses which root: the memory job store a private temporary directory per process
(removed at shutdown: its jobs die with the process; one left by a process killed
or crashed is reclaimed by the next server on the host,
:func:`reclaim_private_roots`); the Redis store a directory every replica of the
model id reaches (``result_files_dir``, default ``<root>/var/results/<model id>``),
never bytes inside Redis. A ``result_files_dir``
of ``s3://<bucket>/<prefix>`` puts them in an S3-compatible object store instead
(``result_files_s3.py``: the same interface, :class:`ResultFiles`).

**Names** are checked again here (the encoder already makes safe ones): a job id or
file name with ``/``, ``\\``, NUL, a control character, a leading dot (``..``, the
sidecars and temporaries), or longer than :data:`MAX_NAME` raises
:class:`BadFileName` — at the edge that is a 404, never a path outside the root.

**Retention ends with the job**: :class:`ResultFileSweeper` (the runtime's periodic
upkeep) removes the directories of jobs the job store no longer knows (TTL, LRU) and
of jobs that ended without a result (failed, cancelled, timed out: files written
before the end), a bounded number of directories per pass.

Thread contract: every method of :class:`DirectoryResultFiles` and :class:`JobFiles`
is thread-safe and blocking (call it from a worker thread or ``threads.run``);
:class:`ResultFileSweeper.sweep` runs on the reactor thread and does its IO through
the injected thread runner.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from twisted.logger import Logger

from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.store import Maybe, settle
from mortred_twisted.pids import pid_alive

log = Logger()

MAX_NAME = 200
_SAFE = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")  # fullmatch: no "\n" before $
_META = ".meta"
#: the attempt whose files a job keeps, and the job's lock file (never served:
#: names with a leading dot are not file names)
_ATTEMPT = ".attempt"
_LOCK = ".lock"
#: locks that keep a put's bytes and sidecar together (striped by name)
_PUT_LOCKS = 32
#: job ids whose states one store read asks for (one pipeline on Redis)
SWEEP_BATCH = 256
#: state reads per sweep pass (a pass lists ``SWEEP_BATCH * SWEEP_BATCHES`` job ids
#: once): enough to keep up with ~400 jobs/s at the 10 s upkeep tick
SWEEP_BATCHES = 16


class Superseded(RuntimeError):
    """A put of a run whose job a later attempt claimed (the run lost its lease):
    its file is not written."""


class BadFileName(ValueError):
    """A job id or file name that could leave its directory (or is not ours)."""


def check_name(name: str, what: str = "file name") -> str:
    """``name`` if it is a safe single path segment, else :class:`BadFileName`."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_NAME
        or not _SAFE.fullmatch(name)
        or name in (".", "..")
    ):
        raise BadFileName(f"invalid {what}: {name!r}")
    return name


#: bytes one read of a streamed answer takes (a file answer holds about this much,
#: plus the socket's buffers, per connection: never the whole file)
CHUNK = 256 * 1024


class FileChanged(OSError):
    """A looked-up file was replaced before (or while) it was read: the answer is
    refused (503, before its head) or cut (after it), never sent short or mixed."""


class FileRange(Protocol):
    """A range of one stored file being read (blocking; one thread at a time)."""

    chunk: int

    def read(self, n: int) -> bytes:
        """Up to ``n`` next bytes of the range (``b""`` at its end)."""
        ...

    def close(self) -> None: ...


class _OpenFileRange:
    """:class:`FileRange` over an open file handle."""

    __slots__ = ("_f", "_left", "chunk")

    def __init__(self, f: Any, length: int) -> None:
        self._f = f
        self._left = length
        self.chunk = CHUNK

    def read(self, n: int) -> bytes:
        n = min(n, self._left)
        if n <= 0:
            return b""
        data = self._f.read(n)
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._f.close()


class StoredFile(NamedTuple):
    """One stored result file, as its sidecar describes it."""

    path: str
    name: str
    content_type: str
    size: int
    sha256: str


def _write_atomically(directory: str, name: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _claimed(directory: str) -> str:
    """The attempt token a job's folder records ("" if none)."""
    try:
        with open(os.path.join(directory, _ATTEMPT), "rb") as f:
            return f.read(200).decode("ascii", "replace")
    except FileNotFoundError:
        return ""


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryResultFiles:
    """Result files in a directory (see the module docstring). ``owned``: the root
    is this process's own (a temporary directory) and :meth:`close` removes it."""

    def __init__(self, root: str | Path, *, owned: bool = False) -> None:
        self.root = str(root)
        self.owned = owned
        os.makedirs(self.root, exist_ok=True)
        self._locks = tuple(threading.Lock() for _ in range(_PUT_LOCKS))

    @classmethod
    def private(cls, parent: str | None = None) -> DirectoryResultFiles:
        """A fresh temporary root of this process (the memory store's default), in
        ``parent`` (the system's temporary directory). The roots that processes
        which died uncleanly (SIGKILL, a crash: :meth:`close` never ran) left there
        are reclaimed first (:func:`reclaim_private_roots`)."""
        parent = parent or tempfile.gettempdir()
        reclaim_private_roots(parent)
        prefix = f"{PRIVATE_PREFIX}{_host_tag()}-{os.getpid()}-"
        return cls(tempfile.mkdtemp(prefix=prefix, dir=parent), owned=True)

    def _job_dir(self, job_id: str) -> str:
        return os.path.join(self.root, check_name(job_id, "job id"))

    def sink(self, job_id: str) -> JobFiles:
        """The sink of one run of ``job_id`` (``sdk.outputs.FileSink``)."""
        check_name(job_id, "job id")
        return JobFiles(self, job_id)

    @contextlib.contextmanager
    def _job_lock(self, directory: str) -> Iterator[None]:
        """The job's lock across processes (``flock`` on ``<job>/.lock``): an
        attempt's claim and every put of an attempt, one at a time."""
        os.makedirs(directory, exist_ok=True)
        fd = os.open(os.path.join(directory, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def claim(self, job_id: str, attempt: str) -> None:
        """Make ``attempt`` the one run whose files ``job_id`` keeps: under the
        job's lock, record it (``<job>/.attempt``) and remove what earlier attempts
        left. From then on an earlier attempt's :meth:`put` raises
        :class:`Superseded` (it lost its lease: its files must never replace
        this attempt's). Attempts are ordered by their token (its start time
        first, :class:`JobFiles`): a claim older than the recorded one is itself
        :class:`Superseded` (a stale run whose first file came late)."""
        directory = self._job_dir(job_id)
        with self._job_lock(directory):
            current = _claimed(directory)
            if current > attempt:
                raise Superseded(f"job {job_id}: attempt {attempt} was superseded")
            if current != attempt:
                _write_atomically(directory, _ATTEMPT, attempt.encode("ascii"))
                self.clear(job_id, keep=(_ATTEMPT, _LOCK))

    def put(
        self, job_id: str, name: str, data: bytes, content_type: str, attempt: str | None = None
    ) -> StoredFile:
        """Store ``data`` as ``name`` of ``job_id`` (atomically; see the module).
        With ``attempt``: only while it is the job's claimed attempt (checked and
        written under the job's lock), else :class:`Superseded`."""
        check_name(name)
        directory = self._job_dir(job_id)
        if attempt is None:
            return self._put(directory, name, data, content_type)
        with self._job_lock(directory):
            if _claimed(directory) != attempt:
                raise Superseded(f"job {job_id}: attempt {attempt} was superseded")
            return self._put(directory, name, data, content_type)

    def _put(self, directory: str, name: str, data: bytes, content_type: str) -> StoredFile:
        os.makedirs(directory, exist_ok=True)
        digest = hashlib.sha256(data).hexdigest()
        meta = {"content_type": str(content_type), "size": len(data), "sha256": digest}
        sidecar = json.dumps(meta).encode("utf-8")
        # bytes and sidecar of one put, never of two (in process; puts of other
        # names go on in parallel: one lock of a few per name)
        with self._locks[hash((directory, name)) % len(self._locks)]:
            _write_atomically(directory, name, data)
            _write_atomically(directory, f".{name}{_META}", sidecar)
        _fsync_dir(directory)
        return StoredFile(os.path.join(directory, name), name, meta["content_type"],
                          len(data), digest)  # fmt: skip

    def lookup(self, job_id: str, name: str) -> StoredFile | None:
        """The stored file ``name`` of ``job_id``, or None (unknown, or its write
        never completed). Raises :class:`BadFileName` for an unsafe name."""
        directory = self._job_dir(job_id)
        check_name(name)
        try:
            with open(os.path.join(directory, f".{name}{_META}"), "rb") as f:
                meta = json.loads(f.read())
            size = os.stat(os.path.join(directory, name)).st_size
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        if size != meta.get("size"):
            return None  # replaced under us by another attempt: ask again later
        return StoredFile(os.path.join(directory, name), name, str(meta["content_type"]),
                          size, str(meta["sha256"]))  # fmt: skip

    def read(self, found: StoredFile, start: int, length: int) -> bytes:
        """``length`` bytes of a looked-up file from ``start`` (whole: small files,
        tests; answers stream through :meth:`open_range`)."""
        with open(found.path, "rb") as f:
            f.seek(start)
            return f.read(length)

    def open_range(self, found: StoredFile, start: int, length: int) -> FileRange:
        """A reader of ``length`` bytes of a looked-up file from ``start``, read a
        :data:`CHUNK` at a time. The file is opened now and the reader keeps that
        handle: a later attempt's replacement (a rename) never changes what it
        reads. Raises :class:`FileChanged` when the file is no longer the one
        looked up (its size differs), ``OSError`` when it cannot be opened."""
        f = open(found.path, "rb")  # noqa: SIM115 - the reader owns and closes it
        try:
            if os.fstat(f.fileno()).st_size != found.size:
                raise FileChanged(f"{found.name} was replaced since its lookup")
            f.seek(start)
        except BaseException:
            f.close()
            raise
        return _OpenFileRange(f, length)

    def clear(self, job_id: str, keep: Iterable[str] = ()) -> None:
        """Remove what an earlier attempt of ``job_id`` left (all but ``keep``)."""
        directory = self._job_dir(job_id)
        kept = set(keep) | {f".{k}{_META}" for k in keep} | {_ATTEMPT, _LOCK}
        try:
            entries = os.listdir(directory)
        except FileNotFoundError:
            return
        for entry in entries:
            if entry not in kept:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, entry))

    def remove(self, job_id: str) -> None:
        """Remove every file of ``job_id`` (nothing if it has none)."""
        shutil.rmtree(self._job_dir(job_id), ignore_errors=True)

    def job_ids(self, after: str = "", limit: int = SWEEP_BATCH) -> list[str]:
        """Up to ``limit`` job ids with files, in name order, after ``after``."""
        try:
            names = sorted(e for e in os.listdir(self.root) if e > after and _SAFE.fullmatch(e))
        except FileNotFoundError:
            return []
        return names[:limit]

    def close(self) -> None:
        """Remove the root if it is this process's own."""
        if self.owned:
            shutil.rmtree(self.root, ignore_errors=True)


#: a private root is ``<tmp>/mortred-results-<host tag>-<pid>-<random>``
PRIVATE_PREFIX = "mortred-results-"
_PRIVATE = re.compile(r"mortred-results-([0-9a-f]{8})-([0-9]{1,10})-[A-Za-z0-9_]+")


def _host_tag() -> str:
    """8 hex digits of this host's name: a root's pid means something only on the
    host (the container, the PID namespace) that made it."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def reclaim_private_roots(parent: str) -> list[str]:
    """Remove the private roots in ``parent`` whose process is gone: made on this
    host, by this user, by a pid that no longer runs. A root of a live process (a
    pid reused since is taken for live: kept, never a live one removed), another
    host's or another user's is left alone. Returns the roots removed."""
    removed: list[str] = []
    tag, me, uid = _host_tag(), os.getpid(), os.getuid()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        m = _PRIVATE.fullmatch(entry.name)
        if m is None or m.group(1) != tag or int(m.group(2)) == me:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        if not pid_alive(int(m.group(2))):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    if removed:
        log.info("reclaimed {n} result folder(s) of processes gone", n=len(removed))
    return removed


class ResultFiles(Protocol):
    """What every result-file store offers (:class:`DirectoryResultFiles`,
    ``result_files_s3.S3ResultFiles``); all blocking, all thread-safe. ``path`` of a
    :class:`StoredFile` is the store's own locator (a file path, an object key)."""

    owned: bool

    def sink(self, job_id: str) -> JobFiles: ...
    def put(self, job_id: str, name: str, data: bytes, content_type: str) -> StoredFile: ...
    def lookup(self, job_id: str, name: str) -> StoredFile | None: ...
    def read(self, found: StoredFile, start: int, length: int) -> bytes: ...
    def open_range(self, found: StoredFile, start: int, length: int) -> FileRange: ...
    def clear(self, job_id: str, keep: Iterable[str] = ()) -> None: ...
    def remove(self, job_id: str) -> None: ...
    def job_ids(self, after: str = "", limit: int = SWEEP_BATCH) -> list[str]: ...
    def close(self) -> None: ...


def open_result_files(config: Any, directory: Path | None, env: Mapping[str, str]) -> ResultFiles:
    """The store of a server's result files: S3 for an ``s3://`` ``result_files_dir``
    (credentials from ``env``), else ``directory`` (None: a private temporary one)."""
    if str(config.result_files_dir).startswith("s3://"):
        from mortred_twisted.stores.result_files_s3 import S3ResultFiles

        return S3ResultFiles.from_config(config, env)
    if directory is None:
        return DirectoryResultFiles.private()
    return DirectoryResultFiles(directory)


class JobFiles:
    """The files of one run of a job: ``sdk.outputs.FileSink`` (``url_prefix``,
    ``put`` on the worker thread). Its first put removes what an earlier attempt of
    the job left (a replica lost mid-run), so the job shows only this run's files."""

    __slots__ = ("_attempt", "_files", "_lock", "_names", "job_id", "url_prefix")

    def __init__(self, files: ResultFiles, job_id: str) -> None:
        self._files = files
        self.job_id = job_id
        self.url_prefix = f"/jobs/{job_id}/files/"
        self._names: list[str] = []
        self._lock = threading.Lock()
        #: this run's own token, ordered by when the run started (the sink is made
        #: as it starts, after the job store gave it the job): a store that can
        #: claim a job for an attempt (the directory store) refuses the puts of a
        #: run a later one superseded. Across replicas the order is their clocks'
        #: (a lease outlives any sane skew).
        self._attempt = (
            f"{time.time_ns():020d}-{uuid.uuid4().hex}" if hasattr(files, "claim") else None
        )

    def put(self, name: str, data: bytes, content_type: str) -> None:
        """Store one file of this run; the first removes an earlier attempt's (and,
        on the directory store, claims the job: from then on an earlier attempt's
        put raises :class:`Superseded`, as this one does once a later attempt
        claimed the job)."""
        attempt = self._attempt
        with self._lock:
            if not self._names:
                if attempt is None:
                    self._files.clear(self.job_id)
                else:
                    self._files.claim(self.job_id, attempt)  # type: ignore[attr-defined]
            self._names.append(name)
        if attempt is None:
            self._files.put(self.job_id, name, data, content_type)
        else:
            self._files.put(self.job_id, name, data, content_type, attempt)  # type: ignore[call-arg]

    @property
    def names(self) -> list[str]:
        return list(self._names)


#: ``states(job_ids)``: each id's state in the job store (None: unknown), without
#: refreshing anything's LRU position; a value or a Deferred of it.
StateReader = Callable[[list[str]], Maybe[Mapping[str, JobState | None]]]
ThreadRun = Callable[..., Any]


class ResultFileSweeper:
    """Ends result files with their jobs (see the module docstring): each
    :meth:`sweep` lists up to ``batch * batches`` job ids with files once (resuming
    where the last pass stopped, wrapping around), reads their states ``batch`` at a
    time and removes the files of unknown jobs and of jobs that ended without a
    result. A pass thus removes up to ``batch * batches`` jobs' files: the upkeep
    keeps up with that many finished jobs per tick. Reactor thread; IO through
    ``run_in_thread``."""

    def __init__(
        self,
        files: Any,
        states: StateReader,
        run_in_thread: ThreadRun,
        *,
        batch: int = SWEEP_BATCH,
        batches: int = SWEEP_BATCHES,
    ) -> None:
        self.files = files
        self._states = states
        self._run = run_in_thread
        self._batch = batch
        self._limit = batch * batches
        self._after = ""
        self._busy = False

    async def sweep(self) -> int:
        """One bounded pass; the number of jobs whose files it removed (0 while
        another pass is still under way)."""
        if self._busy:
            return 0
        self._busy = True
        try:
            ids: list[str] = await self._run(self.files.job_ids, self._after, self._limit)
            self._after = ids[-1] if len(ids) == self._limit else ""
            removed = 0
            for at in range(0, len(ids), self._batch):
                chunk = ids[at : at + self._batch]
                states = await settle(self._states(chunk))
                gone = [j for j in chunk if states.get(j) not in _KEEP]
                if gone:
                    await self._run(self._remove_all, gone)
                    removed += len(gone)
            return removed
        finally:
            self._busy = False

    def _remove_all(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self.files.remove(job_id)


#: states whose files stay: a job still running (or about to) and a finished one
_KEEP = frozenset({JobState.PENDING, JobState.RUNNING, JobState.DONE})


def ledger_states(ledger: Any) -> StateReader:
    """The memory store's :data:`StateReader` (``AsyncJobTable.state``: no lock, no
    LRU refresh)."""
    return lambda ids: {j: ledger.state(j) for j in ids}


def redis_states(store: Any) -> StateReader:
    """The Redis store's :data:`StateReader`: one pipelined ``HGET <job> state`` per
    id (no script: a snapshot would refresh the job's LRU position)."""
    from twisted.internet.defer import gatherResults

    from mortred_twisted.stores.redis_scripts import job_key

    def states(ids: list[str]) -> Any:
        prefix = store._prefix
        calls = [store.link.call("HGET", job_key(prefix, j), "state") for j in ids]

        def decode(replies: list[Any]) -> dict[str, JobState | None]:
            out: dict[str, JobState | None] = {}
            for job_id, raw in zip(ids, replies, strict=True):
                text = raw.decode() if isinstance(raw, bytes) else raw
                try:
                    out[job_id] = JobState(text) if text else None
                except ValueError:
                    out[job_id] = None
            return out

        return gatherResults(calls, consumeErrors=True).addCallback(decode)

    return states

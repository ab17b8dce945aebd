"""A length-framed answer read from a blocking source on worker threads, a chunk at
a time, at the pace the client reads (edge, reactor thread).

:class:`ThreadedBody` is the answer's push producer (``request.registerProducer``):
it asks the thread runner for the next chunk only while the connection is not
paused for its writes, and never has more than one read in flight. So an answer
holds at most one chunk plus the transport's buffer (Twisted pauses its producer
above ``bufferSize``), whatever the file's size and however slow the client: the
bytes stay on disk (or in the object store) until the client takes them.

Contract:

* :meth:`start` declares the length (``request.declare_length``), registers the
  producer and starts reading; it returns a Deferred that fires with ``b""`` (the
  last piece) once ``length`` bytes were written.
* The source's ``read(n)`` and ``close()`` run on the runner's threads, one at a
  time; ``close`` runs exactly once, whatever happens (end, failure, cancel).
* A read that fails before the head was sent fails the Deferred with that error
  (the route can still answer it, e.g. 503); after the head (or a source that ends
  early) it fails with :class:`~.messages.StreamCut`: the connection closes short of
  the declared length, so the client sees the answer cut.
* Cancelling the Deferred (the client went away) stops reading at once: the read
  in flight is dropped when it returns and the source closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from mortred_twisted.http11.messages import StreamCut

log = Logger()


class BlockingSource(Protocol):
    """What :class:`ThreadedBody` reads (``stores.result_files.FileRange``)."""

    chunk: int

    def read(self, n: int) -> bytes: ...
    def close(self) -> None: ...


#: ``run(f, *args)``: ``f(*args)`` on a worker thread, a Deferred of its result
ThreadRunner = Callable[..., "defer.Deferred[Any]"]


class ThreadedBody:
    """One answer's body from a :class:`BlockingSource` (see the module docstring)."""

    __slots__ = (
        "_closed", "_left", "_looping", "_paused", "_reading", "_request", "_run", "_source",
        "done",
    )  # fmt: skip

    def __init__(
        self, request: Any, source: BlockingSource, length: int, run: ThreadRunner
    ) -> None:
        self._request = request
        self._source = source
        self._left = length
        self._run = run
        self._paused = False
        self._reading = False
        self._closed = False
        self._looping = False
        self.done: defer.Deferred[bytes] = defer.Deferred(self._cancel)

    def start(self) -> defer.Deferred[bytes]:
        request = self._request
        request.declare_length(self._left)
        request.registerProducer(self, True)
        self._pull()
        return self.done

    # -- IPushProducer ----------------------------------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._pull()

    def stopProducing(self) -> None:
        if not self.done.called:
            self.done.cancel()

    # -- reading ----------------------------------------------------------------------

    def _pull(self) -> None:
        """Read the next chunk unless paused or one is in flight (a loop, not a
        recursion: a runner that answers at once must not grow the stack)."""
        if self._looping:
            return
        self._looping = True
        try:
            while not (self._paused or self._reading or self.done.called):
                if self._left <= 0:
                    self._finish(b"")
                    return
                self._reading = True
                want = min(self._source.chunk, self._left)
                self._run(self._source.read, want).addCallbacks(self._got, self._broke)
        finally:
            self._looping = False

    def _got(self, data: bytes) -> None:
        self._reading = False
        if self.done.called:  # cancelled while reading
            self._close()
            return
        if not data:
            self._broke(Failure(StreamCut("the source ended before its declared length")))
            return
        self._left -= len(data)
        self._request.write(data)  # may pause us (the client's buffer is full)
        self._pull()

    def _broke(self, failure: Failure) -> None:
        self._reading = False
        if self.done.called:
            self._close()
            return
        if self._request.started and not failure.check(StreamCut):
            log.warn("a streamed answer's source failed: {e}", e=failure.getErrorMessage())
            failure = Failure(StreamCut(failure.getErrorMessage()))
        self._finish(failure)

    def _finish(self, outcome: Any) -> None:
        request = self._request
        request.unregisterProducer()
        if isinstance(outcome, Failure) and not request.started:
            request.declare_length(None)  # nothing sent: the route answers otherwise
        self._close()
        if isinstance(outcome, Failure):
            self.done.errback(outcome)
        else:
            self.done.callback(outcome)

    def _cancel(self, _: Any) -> None:
        """The client went away (or the transport stops): read no more."""
        self._paused = True
        if not self._reading:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._source.close).addErrback(
            lambda f: log.warn("closing a streamed source: {e}", e=f.getErrorMessage())
        )

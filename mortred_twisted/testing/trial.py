"""Testing served models under trial: every call returns a Deferred.

::

    from mortred_twisted.testing.trial import ModelTestCase

    class SharpenTests(ModelTestCase):
        model = "models/sharpen.py:Sharpen"
        options = {"radius": 2}

        async def test_sharpens(self) -> None:
            result = await self.run_model(image=CAT, amount=2.0)
            self.assertIn("output.png", result.files)

        def test_refuses_a_big_amount(self):
            return self.assertFailure(self.validate(image=CAT, amount=9), InvalidRequest)

``run_model`` runs ``predict`` on a thread of the reactor's pool (as the server
runs it: off the reactor thread); the in-memory server (:meth:`serve`) runs on its
own clock, so its calls have finished when their Deferreds are returned.
Harnesses and servers are closed when the test ends.

**Under pytest too.** A file may hold pytest functions and these test cases, and
plain ``pytest`` runs both. pytest runs a trial ``TestCase`` through its unittest
support, and trial then waits for each test by running the reactor itself; with the
pytest-twisted plugin loaded (the ``test`` extra installs it), the reactor already
runs in pytest-twisted's greenlet, so trial's wait returned at once and the test
failed with ``DirtyReactorAggregateError``. :class:`ModelTestMixin` waits by
switching to that greenlet instead when it is there (pytest-twisted's
``_instances.gr_twisted``), and as trial does otherwise. Thread: the wait runs on
the main thread, outside the reactor's greenlet (where pytest runs tests).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet import defer, threads
from twisted.trial import unittest

from mortred_twisted.testing.harness import ModelHarness, RunResult, Target
from mortred_twisted.testing.server import Answer, MemoryServer


class DeferredServer:
    """A :class:`MemoryServer` whose job-API calls return Deferreds (``server``: the
    server itself, for its clock and runtime)."""

    _CALLS = (
        "submit", "status", "wait", "result", "cancel", "file", "events", "run", "files_of",
        "request",
    )  # fmt: skip

    def __init__(self, server: MemoryServer) -> None:
        self.server = server

    def request_d(self, method: str, path: str, **kw: Any) -> defer.Deferred[Answer]:
        return self.server.request_d(method, path, **kw)

    def __getattr__(self, name: str) -> Callable[..., defer.Deferred[Any]]:
        if name not in self._CALLS:
            raise AttributeError(name)
        call = getattr(self.server, name)
        return lambda *a, **kw: defer.maybeDeferred(call, *a, **kw)


def _reactor_greenlet() -> Any | None:
    """pytest-twisted's reactor greenlet when this process runs the reactor in it and
    we are outside it; None otherwise (under trial, or without the plugin)."""
    plugin = sys.modules.get("pytest_twisted")
    found = getattr(getattr(plugin, "_instances", None), "gr_twisted", None)
    if found is None or found.dead:
        return None
    import greenlet

    return None if greenlet.getcurrent() is found else found


def _wait_in_greenlet(reactor_greenlet: Any, d: defer.Deferred[Any]) -> None:
    """Run the reactor (in its greenlet) until ``d`` fires. The switch back comes from
    a timed call, not from ``d``'s callback: the reactor then has finished its calls
    from threads, so trial's janitor may iterate it from here without running one of
    them twice (``AlreadyCalledError``)."""
    import greenlet
    from twisted.internet import reactor

    here = greenlet.getcurrent()
    fired: list[Any] = []
    waiting = [False]

    def done(result: Any) -> Any:
        fired.append(result)
        if waiting[0]:
            reactor.callLater(0, here.switch)  # type: ignore[attr-defined]
        return result

    d.addBoth(done)
    if not fired:
        waiting[0] = True
        reactor_greenlet.switch()


class ModelTestMixin:
    """The calls of :class:`ModelTestCase` for any trial ``TestCase``: set ``model``
    (a class, ``module:Class`` or ``file.py:Class``) and ``options``. Mixed in before
    ``TestCase``, it also lets pytest run the test case (see the module docstring)."""

    model: Target | None = None
    options: Mapping[str, Any] | None = None
    addCleanup: Callable[..., None]

    def _wait(self, d: defer.Deferred[Any], *args: Any, **kw: Any) -> None:
        """trial's wait for a test's Deferred (its setUp, body, tearDown and
        cleanups), through pytest-twisted's reactor greenlet when there is one."""
        found = _reactor_greenlet()
        if found is None:
            super()._wait(d, *args, **kw)  # type: ignore[misc]
            return
        _wait_in_greenlet(found, d)  # trial's chain only succeeds: errors are on the result

    def harness(self, target: Target | None = None, **kw: Any) -> ModelHarness:
        """The test's harness of ``target`` (default: ``model``), made once."""
        chosen = target or self.model
        if chosen is None:
            raise ValueError("set the test case's model (or pass a target)")
        cache = self.__dict__.setdefault("_mortred_harnesses", {})
        key = (chosen, repr(sorted(kw.items())))  # options may be a dict: not hashable
        if key not in cache:
            options = kw.pop("options", self.options)
            cache[key] = ModelHarness(chosen, options, **kw)
            self.addCleanup(cache[key].close)
        return cache[key]

    def run_model(
        self, cancel_at_step: int | None = None, **inputs: Any
    ) -> defer.Deferred[RunResult]:
        """:meth:`ModelHarness.run` on a thread: fires with the :class:`RunResult`, or
        fails with what ended the run (``InvalidRequest``, ``RunCancelled``, …)."""
        harness = self.harness()
        return threads.deferToThread(harness.run, cancel_at_step=cancel_at_step, **inputs)

    def run_batch(self, items: list[Mapping[str, Any]]) -> defer.Deferred[list[RunResult]]:
        return threads.deferToThread(self.harness().run_batch, items)

    def validate(
        self, params: Mapping[str, Any] | None = None, **inputs: Any
    ) -> defer.Deferred[dict[str, Any]]:
        """:meth:`ModelHarness.validate` (no setup): fails with ``InvalidRequest``."""
        return defer.maybeDeferred(self.harness().validate, params, **inputs)

    def serve(self, target: Target | None = None, **kw: Any) -> DeferredServer:
        """An in-memory server of ``target`` (default: ``model``), closed at the end."""
        chosen = target or self.model
        if chosen is None:
            raise ValueError("set the test case's model (or pass a target)")
        kw.setdefault("options", self.options)
        server = MemoryServer(chosen, kw.pop("options"), **kw)
        self.addCleanup(server.close)
        return DeferredServer(server)

    def check_conformance(self, target: Target | None = None, **kw: Any) -> defer.Deferred[Any]:
        """:func:`~mortred_twisted.testing.conformance.check` on a thread."""
        from mortred_twisted.testing.conformance import check

        kw.setdefault("options", self.options)
        return threads.deferToThread(check, target or self.model, **kw)


class ModelTestCase(ModelTestMixin, unittest.TestCase):
    """A trial TestCase with :class:`ModelTestMixin`'s calls."""

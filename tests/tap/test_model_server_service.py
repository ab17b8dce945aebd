"""ModelServerService: long-lived objects are frozen once the models have loaded."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.internet.testing import MemoryReactorClock

from mortred_twisted.config.server import ServerConfig
from mortred_twisted.http.model_port import ModelPortFactory
from mortred_twisted.tap.model_server import ModelServerService


class Runtime:
    """Just what the service reads before and while loading."""

    def __init__(self) -> None:
        self.config = ServerConfig(id="T", host="127.0.0.1", port=0, model_type="fake")
        self.loading: Deferred[None] = Deferred()
        self.metrics = SimpleNamespace(registry=CollectorRegistry())

    def load_models(self) -> Deferred[None]:
        return self.loading

    def start_store(self) -> None:
        pass

    def close_store(self) -> None:
        pass


def test_freezes_after_the_models_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The port opens before the models load (torch is imported then), so a second
    gc.freeze() after loading keeps the model's objects out of full collections.
    The port is served by the project's HTTP server (ModelPortFactory)."""
    freezes: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(1))
    app: Any = SimpleNamespace(
        config=Runtime().config, hot_routes=lambda: None, record_request=lambda request: None,
        checks=SimpleNamespace(),
        app=SimpleNamespace(),
    )  # fmt: skip
    runtime = Runtime()
    reactor = MemoryReactorClock()
    service = ModelServerService(runtime, app, reactor=reactor, grace_s=1.0)  # type: ignore[arg-type]
    service.startService()
    assert isinstance(reactor.tcpServers[0][1], ModelPortFactory)
    assert service.listening.called and len(freezes) == 1  # start-up objects
    runtime.loading.callback(None)
    assert len(freezes) == 2  # and everything the models brought in

"""pytest fixtures for served models.

Load them in your suite's top ``conftest.py``::

    pytest_plugins = ["mortred_twisted.testing.pytest_plugin"]

(or run ``pytest -p mortred_twisted.testing.pytest_plugin``). Both fixtures are
factories; what they made is closed when the test ends::

    def test_sharpen(model_harness, served_model):
        harness = model_harness("models/sharpen.py:Sharpen", {"radius": 2})
        assert harness.run(image=Path("cat.png")).files["output.png"]
        server = served_model("models/sharpen.py:Sharpen")
        assert server.run(image=Path("cat.png"))["code"] == 0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mortred_twisted.testing.harness import ModelHarness
from mortred_twisted.testing.server import MemoryServer


@pytest.fixture
def model_harness() -> Iterator[Callable[..., ModelHarness]]:
    """``model_harness(target, options=None, **kw)``: a :class:`ModelHarness`."""
    made: list[ModelHarness] = []

    def make(target: Any, options: Any = None, **kw: Any) -> ModelHarness:
        harness = ModelHarness(target, options, **kw)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


@pytest.fixture
def served_model() -> Iterator[Callable[..., MemoryServer]]:
    """``served_model(target, options=None, server=None, **kw)``: a
    :class:`MemoryServer` (``served_model.from_config(path)`` for a server TOML)."""
    made: list[MemoryServer] = []

    def make(target: Any, options: Any = None, **kw: Any) -> MemoryServer:
        server = MemoryServer(target, options, **kw)
        made.append(server)
        return server

    def from_config(path: Any, **server: Any) -> MemoryServer:
        found = MemoryServer.from_config(path, **server)
        made.append(found)
        return found

    make.from_config = from_config  # type: ignore[attr-defined]
    yield make
    for server in made:
        server.close()

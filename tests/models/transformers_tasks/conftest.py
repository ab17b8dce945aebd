"""Fixtures: the tiny public-layout directories (built once per session) and an
in-memory model server of ``type = "transformers"`` over one of them."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mortred_twisted.models.registry import create_model
from mortred_twisted.testing.server import MemoryServer
from tests.models.transformers_tasks import layouts


class TransformersServer(MemoryServer):
    """The in-memory server of a ``type = "transformers"`` server file: the model is
    built by the registry's factory, as ``twistd mortred-model`` builds it."""

    def __init__(self, directory: Path, **options: Any) -> None:
        from mortred_twisted.config.server import build_server_config

        doc = {
            "server": {"id": "tf", "server_uri": "/infer", "worker_nums": 1, "async_enabled": True},
            "model": {"type": "transformers", "pretrained": str(directory), **options},
        }
        self._start(build_server_config(doc, root=Path.cwd(), env={}), None, create_model)


def png(width: int = 200, height: int = 150, seed: int = 0) -> bytes:
    """A noisy RGB PNG of ``width`` × ``height``."""
    from PIL import Image

    rgb = np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="session")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``layout(task)``: the tiny directory of ``task`` (built once per session)."""
    built: dict[str, Path] = {}

    def get(task: str) -> Path:
        if task not in built:
            built[task] = layouts.build(task, tmp_path_factory.mktemp(task))
        return built[task]

    return get


@pytest.fixture
def serve() -> Iterator[Callable[..., TransformersServer]]:
    """``serve(directory, **options)``: a running in-memory server, closed after."""
    started: list[TransformersServer] = []

    def start(directory: Path, **options: Mapping[str, Any]) -> TransformersServer:
        server = TransformersServer(directory, **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()

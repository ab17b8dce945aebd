"""The Patterns example: a streaming generator with previews that keeps the model
contract and serves from its server TOML."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from mortred_twisted.model_api.base import RunCancelled
from mortred_twisted.testing import MemoryServer, ModelHarness, conformance

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "patterns"
TARGET = f"{EXAMPLE / 'patterns.py'}:Patterns"
SMALL = {"width": 32, "height": 24, "frames": 3}


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(PILImage.open(io.BytesIO(data)))


def test_the_example_keeps_the_model_contract() -> None:
    """Conformance, with small frames."""
    report = conformance.check(TARGET, inputs=SMALL)
    assert report.ok, str(report)


def test_each_frame_streams_after_its_preview() -> None:
    """preview, output per frame; the result lists the frames, each a PNG file of the
    asked size; previews are quarter size."""
    result = ModelHarness(TARGET).run(**SMALL)
    assert [name for name, _ in result.events] == ["preview", "output"] * 3
    assert result.progress == [(1, 3), (2, 3), (3, 3)]
    frames = [result.files[item["name"]] for item in result.output]
    assert [pixels(f).shape for f in frames] == [(24, 32, 3)] * 3
    preview = result.events_named("preview")[0]
    assert pixels(result.files[preview["name"]]).shape == (6, 8, 3)
    assert not (pixels(frames[0]) == pixels(frames[1])).all()  # the pattern moves


def test_the_same_seed_gives_the_same_frames() -> None:
    """Deterministic per seed; another seed differs."""
    harness = ModelHarness(TARGET)
    a = harness.run(**SMALL, seed=7).output
    b = harness.run(**SMALL, seed=7).output
    c = harness.run(**SMALL, seed=8).output
    assert [f["sha256"] for f in a] == [f["sha256"] for f in b] != [f["sha256"] for f in c]


def test_a_cancel_stops_the_stream() -> None:
    """Cancelled after frame 2 of 10, no third frame is made."""
    with pytest.raises(RunCancelled) as cancelled:
        ModelHarness(TARGET).run(width=16, height=16, frames=10, cancel_at_step=2)
    run = cancelled.value.run
    assert len(run.events_named("output")) <= 2 and run.progress[-1] == (2, 10)


def test_its_server_toml_serves_it() -> None:
    """examples/patterns/server.toml serves it; the result lists its frames, the event
    stream has a preview and an output per frame."""
    with MemoryServer.from_config(EXAMPLE / "server.toml") as server:
        job = server.submit(width=16, height=16, frames=2, palette="ocean").json()["job_id"]
        assert server.wait(job)["state"] == "done"
        doc = server.result(job)
        assert len(doc["data"]) == 2
        assert len(server.files_of(doc["data"])) == 2
        names = [name for name, _ in server.events(job)]
        assert names.count("preview") == 2 and names.count("output") == 2

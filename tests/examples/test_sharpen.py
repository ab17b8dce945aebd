"""The Sharpen example: it keeps the model contract, sharpens, and serves from its
server TOML."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from mortred_twisted.model_api.base import InvalidRequest, RunCancelled
from mortred_twisted.testing import MemoryServer, ModelHarness, conformance

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sharpen"
TARGET = f"{EXAMPLE / 'sharpen.py'}:Sharpen"


def soft_edge() -> bytes:
    """A 32×32 picture: a smooth ramp from dark to light across the middle."""
    ramp = np.clip((np.arange(32) - 12) / 8.0, 0, 1) * 200 + 20
    pixels = np.repeat(np.tile(ramp, (32, 1))[..., None], 3, axis=2).astype(np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def contrast(png: bytes) -> float:
    """The largest step between neighbouring columns (sharper edges: larger)."""
    row = np.asarray(PILImage.open(io.BytesIO(png)).convert("L"), dtype=np.float64)[16]
    return float(np.abs(np.diff(row)).max())


def test_the_example_keeps_the_model_contract() -> None:
    """Conformance: cheap validation, monotone progress, cancel, batch, an image out."""
    report = conformance.check(TARGET, inputs={"image": soft_edge(), "steps": 4})
    assert report.ok, str(report)


@pytest.mark.parametrize("mode", ["unsharp", "laplace"])
def test_it_sharpens_in_passes_with_progress(mode: str) -> None:
    """The edge gets steeper; one progress report per pass."""
    picture = soft_edge()
    result = ModelHarness(TARGET, {"radius": 2.0}).run(
        image=picture, amount=3.0, mode=mode, steps=5
    )
    assert result.progress == [(i, 5) for i in range(1, 6)]
    assert result.output["content_type"] == "image/png"
    assert contrast(result.files["output.png"]) > contrast(picture) * 1.2


def test_amount_zero_leaves_the_picture_as_it_was() -> None:
    """No detail added: the same pixels come back."""
    picture = soft_edge()
    out = ModelHarness(TARGET).run(image=picture, amount=0.0, steps=2).files["output.png"]
    same = np.asarray(PILImage.open(io.BytesIO(out)))
    assert (same == np.asarray(PILImage.open(io.BytesIO(picture)))).all()


def test_a_cancel_stops_between_passes() -> None:
    """Cancelled after pass 3 of 100, the run ends there."""
    with pytest.raises(RunCancelled) as cancelled:
        ModelHarness(TARGET).run(image=soft_edge(), steps=100, cancel_at_step=3)
    assert cancelled.value.run.progress[-1] == (3, 100)


def test_bad_inputs_are_refused_by_name() -> None:
    """A bad mode is a 422 naming params.mode."""
    with pytest.raises(InvalidRequest, match="must be one of 'unsharp', 'laplace'") as bad:
        ModelHarness(TARGET).validate(image=soft_edge(), mode="blur")
    assert bad.value.field == "params.mode"


def test_its_server_toml_serves_it() -> None:
    """examples/sharpen/server.toml names the model by file path; a job runs."""
    with MemoryServer.from_config(EXAMPLE / "server.toml") as server:
        assert server.config.id == "SHARPEN"
        doc = server.run(image=soft_edge(), amount=2.0, steps=2)
        files = server.files_of(doc["data"])
        assert contrast(files["output.png"]) > contrast(soft_edge())

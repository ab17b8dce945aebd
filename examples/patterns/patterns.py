"""Patterns: a streaming procedural image generator served with the mortred SDK.

Runs on the CPU with numpy (no weights, nothing to download). ``predict`` is a
generator: each of ``frames`` frames of an interference pattern (sums of plane
waves whose phase moves from frame to frame) is yielded — an ``output`` event on
the job's event stream, and a result file — after a small ``preview`` (a quarter-
size thumbnail) emitted as soon as the frame is computed. Progress is reported per
frame; a cancel stops between frames. The same ``seed`` gives the same frames.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mortred_twisted.sdk import Context, Image, Input, ServedModel

PALETTES = {
    "ember": ((0.05, 0.0, 0.1), (1.0, 0.45, 0.05), (1.0, 0.95, 0.6)),
    "ocean": ((0.0, 0.05, 0.2), (0.0, 0.5, 0.7), (0.8, 1.0, 1.0)),
    "mono": ((0.0, 0.0, 0.0), (0.5, 0.5, 0.5), (1.0, 1.0, 1.0)),
}


class Patterns(ServedModel):
    """Generates frames of a moving interference pattern, with previews."""

    def setup(self) -> None:
        self.waves = int(self.options.get("waves", 5))

    def predict(
        self,
        ctx: Context,
        width: int = Input(256, ge=16, le=1024),
        height: int = Input(256, ge=16, le=1024),
        frames: int = Input(4, ge=1, le=64, description="frames to generate"),
        palette: str = Input("ember", choices=sorted(PALETTES)),
        seed: int = Input(0, ge=0, le=2**31 - 1),
    ) -> Iterator[Image]:
        import numpy as np

        rng = np.random.default_rng(seed)
        angles = rng.uniform(0, np.pi, self.waves)
        freqs = rng.uniform(4.0, 24.0, self.waves)
        speeds = rng.uniform(0.5, 2.0, self.waves)
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        x, y = x / max(width, height), y / max(width, height)
        stops = np.asarray(PALETTES[palette], dtype=np.float32)
        for frame in range(frames):
            ctx.check_cancelled()
            phase = 2 * np.pi * frame / frames
            field = sum(
                np.sin(2 * np.pi * f * (x * np.cos(a) + y * np.sin(a)) + s * phase)
                for a, f, s in zip(angles, freqs, speeds, strict=True)
            )
            level = (field / self.waves + 1.0) / 2.0  # 0..1
            picture = _colour(level, stops)
            ctx.emit("preview", Image.from_array(picture[::4, ::4]))
            ctx.progress(frame + 1, frames)
            yield Image.from_array(picture)


def _colour(level: Any, stops: Any) -> Any:
    """Map 0..1 levels through a three-stop palette to H×W×3 floats."""
    import numpy as np

    low = np.clip(level * 2.0, 0.0, 1.0)[..., None]
    high = np.clip(level * 2.0 - 1.0, 0.0, 1.0)[..., None]
    return stops[0] + (stops[1] - stops[0]) * low + (stops[2] - stops[1]) * high

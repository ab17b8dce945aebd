"""Sharpen: an unsharp-mask image filter served with the mortred SDK.

Runs on the CPU with Pillow and numpy (no weights, nothing to download). Each of
``steps`` passes adds ``amount / steps`` of the picture's detail (the picture minus
its blur) back to it, reporting progress and checking for cancellation between
passes. ``mode = "laplace"`` uses a 3×3 Laplacian as the detail instead of a blur.

Options (the ``[model]`` table of ``server.toml``): ``radius``, the blur radius in
pixels (default 2.0).
"""

from __future__ import annotations

from typing import Any

from mortred_twisted.sdk import Context, Image, Input, ServedModel


class Sharpen(ServedModel):
    """Sharpens a picture (unsharp mask or Laplacian), in passes."""

    def setup(self) -> None:
        self.radius = float(self.options.get("radius", 2.0))
        if not 0.1 <= self.radius <= 50:
            raise ValueError(f"radius {self.radius} is outside 0.1..50")

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture (PNG, JPEG, WebP)"),
        amount: float = Input(1.0, ge=0.0, le=4.0, description="how much detail to add"),
        mode: str = Input("unsharp", choices=["unsharp", "laplace"]),
        steps: int = Input(10, ge=1, le=1000, description="passes (progress per pass)"),
    ) -> Image:
        import numpy as np
        from PIL import Image as PILImage
        from PIL import ImageFilter

        picture = image.to_pil("RGB")
        pixels = np.asarray(picture, dtype=np.float32) / 255.0
        gain = amount / steps
        for i in range(steps):
            ctx.check_cancelled()
            if mode == "unsharp":
                current = PILImage.fromarray((np.clip(pixels, 0, 1) * 255 + 0.5).astype(np.uint8))
                blurred = current.filter(ImageFilter.GaussianBlur(self.radius))
                detail = pixels - np.asarray(blurred, dtype=np.float32) / 255.0
            else:
                detail = _laplacian(pixels)
            pixels = np.clip(pixels + gain * detail, 0.0, 1.0)
            ctx.progress(i + 1, steps)
        return Image.from_array(pixels)


def _laplacian(pixels: Any) -> Any:
    """4-neighbour Laplacian (edges repeated), per channel: the picture's detail."""
    import numpy as np

    padded = np.pad(pixels, ((1, 1), (1, 1), (0, 0)), mode="edge")
    neighbours = padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
    return pixels - neighbours / 4.0

"""SDK models the end-to-end tests serve (named by file path in their server TOMLs)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from mortred_twisted.sdk import Context, Image, Input, ServedModel


class Sharpen(ServedModel):
    """Sharpens a picture in `steps` passes (progress, cancel between passes)."""

    def setup(self) -> None:
        self.pass_s = float(self.options.get("pass_s", 0.02))

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture"),
        amount: float = Input(1.0, ge=0.0, le=4.0),
        steps: int = Input(3, ge=1, le=1000),
    ) -> Image:
        from PIL import ImageFilter

        picture = image.to_pil("RGB")
        for i in range(steps):
            ctx.check_cancelled()
            time.sleep(self.pass_s)
            picture = picture.filter(ImageFilter.UnsharpMask(percent=int(50 * amount)))
            ctx.progress(i + 1, steps)
        return Image.from_pil(picture)


class BrokenSetup(ServedModel):
    """Its weights are missing."""

    def setup(self) -> None:
        raise FileNotFoundError(str(self.path("weights/none.safetensors")))

    def predict(self) -> int:
        return 0


class Frames(ServedModel):
    """Yields `n` frames, a preview before each (a streaming predict)."""

    def predict(self, ctx: Context, n: int = Input(3, ge=1, le=50)) -> Iterator[Image]:
        for i in range(n):
            time.sleep(0.05)
            ctx.emit("preview", {"frame": i})
            ctx.progress(i + 1, n)
            yield Image.from_array([[i * 20, 255 - i * 20]])

"""A text-to-image shaped SDK model for ``bench/protocol_doors.py``: the inputs the
OpenAI door maps onto (prompt, num_images, width, height), ``num_images`` tiny PNGs
out (the same bytes each time: the bench measures the doors, not a sampler)."""

import base64
from dataclasses import dataclass

from mortred_twisted.sdk import Image, Input, ServedModel

#: a 1x1 PNG
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@dataclass
class Pictures:
    images: list[Image]
    width: int
    height: int


class Painter(ServedModel):
    """Answers ``num_images`` pictures at once."""

    def predict(
        self,
        prompt: str = Input(description="what to draw", max_length=1000),
        num_images: int = Input(1, ge=1, le=8),
        width: int = Input(8, ge=8, le=64),
        height: int = Input(8, ge=8, le=64),
    ) -> Pictures:
        return Pictures([Image(PNG, "image/png") for _ in range(num_images)], width, height)

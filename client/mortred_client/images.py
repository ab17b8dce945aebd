"""Input images to the envelope's base64 strings (pure; Pillow/numpy only if used).

Accepted: ``bytes``/``bytearray``/``memoryview`` (an encoded image, sent as is), a
path (``str`` or ``os.PathLike``; the file's bytes), a PIL image (encoded as PNG) or
a numpy array (``uint8``, HxW or HxWxC; encoded as PNG through Pillow). The shipped
generative models ignore the pixels but still need one valid image; a model declared
with the SDK takes its inputs by name in ``params`` and may need none (``None`` or an
empty list: the envelope then has no ``images`` key).
"""

from __future__ import annotations

import base64
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def encode_image(image: Any) -> str:
    """One image as the base64 text of its encoded bytes; ``TypeError`` otherwise."""
    if isinstance(image, bytes | bytearray | memoryview):
        raw = bytes(image)
    elif isinstance(image, str | os.PathLike):
        raw = Path(image).read_bytes()
    elif hasattr(image, "save") and hasattr(image, "mode"):  # a PIL image
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        raw = buffer.getvalue()
    elif hasattr(image, "__array_interface__") and hasattr(image, "shape"):  # numpy
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        raw = buffer.getvalue()
    else:
        raise TypeError(
            f"an image is bytes, a path, a PIL image or a numpy array, not {type(image).__name__}"
        )
    return base64.b64encode(raw).decode("ascii")


def encode_images(images: Iterable[Any] | None) -> list[str]:
    """Every image encoded, in order; ``[]`` for ``None`` or no image (the server
    says whether the model needs one: a 422 naming ``images`` or the input)."""
    if images is None:
        return []
    if isinstance(images, bytes | bytearray | memoryview | str | os.PathLike):
        images = [images]  # one image given alone
    return [encode_image(i) for i in images]

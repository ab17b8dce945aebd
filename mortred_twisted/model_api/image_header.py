"""An image's size from its header alone (Pillow parses the header; nothing is
decompressed): what input limits are checked with before admission, and the
decoders' (``models/codec.py``) first step. Imported lazily by
:mod:`~mortred_twisted.model_api.input_limits` (the config loader needs no Pillow)."""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

from mortred_twisted.model_api.base import InputDecodeError, InputTooLarge
from mortred_twisted.model_api.input_limits import MAX_PIXELS_CEILING

#: Refuse pictures larger than this many pixels (decompression bombs): the ceiling
#: of every model's ``max_pixels``, below Pillow's own ``Image.MAX_IMAGE_PIXELS``.
MAX_PIXELS = MAX_PIXELS_CEILING
#: The formats Pillow may open for a request.
ACCEPTED_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP")
OPEN_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError)


def open_header(data: bytes) -> Image.Image:
    """``Image.open`` on ``data``: the header is parsed, nothing is decompressed.

    Raises :class:`InputDecodeError` (empty, unreadable, another format) or
    :class:`InputTooLarge` (over Pillow's decompression-bomb guard, which raises at
    open from the declared size).
    """
    if not data:
        raise InputDecodeError("empty image")
    try:
        return Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except Image.DecompressionBombError as exc:
        raise InputTooLarge("image", str(exc), limit="max_pixels", value=MAX_PIXELS) from None
    except OPEN_ERRORS as exc:
        raise InputDecodeError(f"cannot decode image: {exc}") from exc


def image_header_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of an image from its header alone (nothing decoded).

    Raises :class:`InputDecodeError` for empty data or a header that cannot be read
    (truncated, not an accepted format); :class:`InputTooLarge` when the declared
    size is over Pillow's own decompression-bomb guard.
    """
    with open_header(data) as img:
        width, height = img.size
    if width <= 0 or height <= 0:
        raise InputDecodeError(f"cannot decode image: size {width}x{height}")
    return width, height

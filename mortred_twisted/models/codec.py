"""Image bytes <-> arrays (Pillow + numpy; no torch).

Accepted input formats: :data:`ACCEPTED_FORMATS` (PNG and JPEG, also BMP, GIF,
TIFF and WebP), decoded to RGB ``uint8`` arrays of shape ``(H, W, 3)``; Pillow's
other formats are refused unread (some hand the bytes to outside programs, e.g.
EPS to Ghostscript). Output images are PNG, base64-encoded as ASCII strings.

Sizes are read from the header first (:func:`image_header_size`: ``Image.open``
parses the header, ``.size`` is known before ``load()``), so a picture over the
limit is refused before a pixel is decompressed: by the request's limits at
validation (:mod:`mortred_twisted.models.input_limits`), and again here, in
:func:`decode_image`, against :data:`MAX_PIXELS` as the decoder's own backstop.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from mortred_twisted.models.base import InputDecodeError, InputTooLarge
from mortred_twisted.models.input_limits import MAX_PIXELS_CEILING

#: Refuse pictures larger than this many pixels (decompression bombs): the ceiling
#: of every model's ``max_pixels``, below Pillow's own ``Image.MAX_IMAGE_PIXELS``.
MAX_PIXELS = MAX_PIXELS_CEILING
#: The formats Pillow may open for a request.
ACCEPTED_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP")
_OPEN_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError)


def _open(data: bytes) -> Image.Image:
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
    except _OPEN_ERRORS as exc:
        raise InputDecodeError(f"cannot decode image: {exc}") from exc


def image_header_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of an image from its header alone (nothing decoded).

    Raises :class:`InputDecodeError` for empty data or a header that cannot be read
    (truncated, not an accepted format); :class:`InputTooLarge` when the declared
    size is over Pillow's own decompression-bomb guard.
    """
    with _open(data) as img:
        width, height = img.size
    if width <= 0 or height <= 0:
        raise InputDecodeError(f"cannot decode image: size {width}x{height}")
    return width, height


def decode_image(data: bytes, *, mode: str = "RGB") -> np.ndarray:
    """Decode image bytes to a ``uint8`` array (``(H, W, 3)`` for RGB).

    The size is checked from the header against :data:`MAX_PIXELS` before decoding.
    Raises :class:`InputDecodeError` for empty, undecodable or too large data (on a
    worker this is the backstop: requests were checked against the model's own
    limits at validation).
    """
    try:
        with _open(data) as img:
            if img.width * img.height > MAX_PIXELS:
                raise InputDecodeError(
                    f"image too large: {img.width}x{img.height} pixels (at most {MAX_PIXELS})"
                )
            return np.asarray(img.convert(mode)).copy()
    except InputTooLarge as exc:
        raise InputDecodeError(f"image too large: {exc.message}") from None
    except InputDecodeError:
        raise
    except (*_OPEN_ERRORS, Image.DecompressionBombError) as exc:
        raise InputDecodeError(f"cannot decode image: {exc}") from exc


def encode_png(array: np.ndarray) -> bytes:
    """Encode a ``uint8`` array (``(H, W)``, ``(H, W, 3)`` or ``(H, W, 4)``) as PNG."""
    if array.dtype != np.uint8:
        raise ValueError(f"expected uint8 array, got {array.dtype}")
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def png_base64(array: np.ndarray) -> str:
    """PNG-encode ``array`` and return it as a base64 ASCII string."""
    return base64.b64encode(encode_png(array)).decode("ascii")

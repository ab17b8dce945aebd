"""Image bytes <-> arrays (Pillow + numpy; no torch).

Accepted input formats: :data:`ACCEPTED_FORMATS` (PNG and JPEG, also BMP, GIF,
TIFF and WebP), decoded to RGB ``uint8`` arrays of shape ``(H, W, 3)``; Pillow's
other formats are refused unread (some hand the bytes to outside programs, e.g.
EPS to Ghostscript). Output images are PNG, base64-encoded as ASCII strings.

Sizes are read from the header first (:func:`image_header_size`: ``Image.open``
parses the header, ``.size`` is known before ``load()``), so a picture over the
limit is refused before a pixel is decompressed: by the request's limits at
validation (:mod:`mortred_twisted.model_api.input_limits`), and again here, in
:func:`decode_image`, against :data:`MAX_PIXELS` as the decoder's own backstop.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from mortred_twisted.model_api.base import InputDecodeError, InputTooLarge
from mortred_twisted.model_api.image_header import (
    ACCEPTED_FORMATS,
    MAX_PIXELS,
    OPEN_ERRORS,
    image_header_size,
    open_header,
)

# the header reader lives below models/ and sdk/ (input limits are checked before
# admission with it); re-exported here for the decoders
__all__ = [
    "ACCEPTED_FORMATS",
    "MAX_PIXELS",
    "decode_image",
    "encode_png",
    "image_header_size",
    "png_base64",
]


def decode_image(data: bytes, *, mode: str = "RGB") -> np.ndarray:
    """Decode image bytes to a ``uint8`` array (``(H, W, 3)`` for RGB).

    The size is checked from the header against :data:`MAX_PIXELS` before decoding.
    Raises :class:`InputDecodeError` for empty, undecodable or too large data (on a
    worker this is the backstop: requests were checked against the model's own
    limits at validation).
    """
    try:
        with open_header(data) as img:
            if img.width * img.height > MAX_PIXELS:
                raise InputDecodeError(
                    f"image too large: {img.width}x{img.height} pixels (at most {MAX_PIXELS})"
                )
            return np.asarray(img.convert(mode)).copy()
    except InputTooLarge as exc:
        raise InputDecodeError(f"image too large: {exc.message}") from None
    except InputDecodeError:
        raise
    except (*OPEN_ERRORS, Image.DecompressionBombError) as exc:
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

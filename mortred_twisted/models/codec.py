"""Image bytes <-> arrays (Pillow + numpy; no torch).

Accepted input formats: PNG and JPEG (also anything else Pillow reads, e.g. BMP),
decoded to RGB ``uint8`` arrays of shape ``(H, W, 3)``. Output images are PNG,
base64-encoded as ASCII strings.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from mortred_twisted.models.base import InputDecodeError

#: Refuse pictures larger than this many pixels (decompression bombs).
MAX_PIXELS = 4096 * 4096


def decode_image(data: bytes, *, mode: str = "RGB") -> np.ndarray:
    """Decode PNG/JPEG bytes to a ``uint8`` array (``(H, W, 3)`` for RGB).

    Raises :class:`InputDecodeError` for empty or undecodable data.
    """
    if not data:
        raise InputDecodeError("empty image")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > MAX_PIXELS:
                raise InputDecodeError(f"image too large: {img.width}x{img.height} pixels")
            return np.asarray(img.convert(mode)).copy()
    except InputDecodeError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
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

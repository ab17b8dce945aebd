"""``Image`` and ``File``: the binary values a served model takes and returns.

Contract:

* An input value is built by the server from bytes it already holds (a base64 or
  ``data:`` field, a multipart part, the seed envelope's ``images``); nothing is
  decoded until the model asks: :meth:`File.read` returns the bytes,
  :meth:`Image.to_pil` / :meth:`Image.to_numpy` decode on the calling thread (the
  worker's, never the reactor's), :attr:`File.path` writes the bytes to a private
  temporary file on first use (removed when the value is garbage collected).
* An output value holds bytes and a content type; :meth:`Image.from_pil` and
  :meth:`Image.from_array` encode PNG (or the format asked) on the calling thread.
* Values are immutable after construction and safe to pass between threads.

This module imports neither Pillow nor numpy at import time (the declaration is read
by the server without them).
"""

from __future__ import annotations

import contextlib
import io
import mimetypes
import os
import re
import tempfile
import weakref
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import InputDecodeError, InvalidRequest

#: Content types an ``Image`` input accepts when the sender names one.
IMAGE_CONTENT_TYPES = (
    "image/png",
    "image/jpeg",
    "image/webp",
    "image/bmp",
    "image/gif",
    "image/tiff",
)
#: The picture formats an ``Image`` input takes (Pillow reads no other for a
#: request: ``model_api/image_header.ACCEPTED_FORMATS``), as messages name them.
ACCEPTED_IMAGES = "PNG, JPEG, WebP, BMP, GIF or TIFF"

_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


class UnreadableImage(InvalidRequest, InputDecodeError):
    """An ``Image`` input whose bytes are no picture the server reads: empty, not an
    accepted format, or a header cut short. Found before admission (from the header:
    nothing is decoded), it names the input (``field``: ``params.<input>``) and the
    accepted formats. It is an :class:`InvalidRequest` (what a harness test catches)
    *and* an :class:`InputDecodeError`: the server answers it like every undecodable
    image, HTTP 400 with code 3 (``invalid input: params.image: …``)."""


def unreadable_reason(message: str) -> str:
    """Pillow's complaint about undecodable bytes, for a client: no object reprs
    (``<_io.BytesIO object at 0x…>``), "cannot identify" said as an unknown format."""
    text = message.removeprefix("cannot decode image: ").strip()
    if text.startswith("cannot identify image file"):
        return "not a known image format"
    if "truncated" in text.lower():
        return "truncated"
    text = _OBJECT_REPR.sub("", text).strip()
    return text or "unreadable"


def unreadable_message(reason: str) -> str:
    """What an unreadable ``Image`` input is told (after its ``params.<input>: ``)."""
    return f"not a readable image ({reason}); accepted: {ACCEPTED_IMAGES}"


_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")

_SNIFF = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)


def sniff_image_type(data: bytes) -> str | None:
    """The image content type ``data`` starts like, or None."""
    for magic, content_type in _SNIFF:
        if data.startswith(magic):
            return content_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class File:
    """Bytes with a content type and an optional file name (see the module docstring)."""

    __slots__ = ("__weakref__", "_data", "_path", "content_type", "name", "source")

    def __init__(
        self,
        data: bytes | bytearray | memoryview,
        content_type: str | None = None,
        *,
        name: str | None = None,
    ) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"{type(self).__name__} data must be bytes, not {type(data).__name__}")
        self._data = bytes(data)
        self.content_type = content_type or self._guess_type(name)
        self.name = name
        self._path: str | None = None
        #: the request field this value came from (``params.image``), set by the
        #: server for an input; decoding errors name it
        self.source: str | None = None

    def _guess_type(self, name: str | None) -> str:
        guessed = mimetypes.guess_type(name)[0] if name else None
        return guessed or "application/octet-stream"

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], content_type: str | None = None) -> File:
        """The file at ``path`` (read now), named after it."""
        p = Path(path)
        return cls(p.read_bytes(), content_type, name=p.name)

    def read(self) -> bytes:
        """The bytes."""
        return self._data

    @property
    def size(self) -> int:
        return len(self._data)

    @property
    def path(self) -> str:
        """A private temporary file holding the bytes (written on first use)."""
        if self._path is None:
            # the sender's file name only lends its extension, and only a plain one
            suffix = Path(self.name).suffix if self.name else ""
            if not _SUFFIX.fullmatch(suffix):
                suffix = ""
            fd, path = tempfile.mkstemp(prefix="mortred-input-", suffix=suffix)
            with os.fdopen(fd, "wb") as out:
                out.write(self._data)
            self._path = path
            weakref.finalize(self, _remove, path)
        return self._path

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, File):
            return NotImplemented
        return (type(self), self._data, self.content_type) == (
            type(other),
            other._data,
            other.content_type,
        )

    def __hash__(self) -> int:
        return hash((type(self), self._data, self.content_type))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.size} bytes, {self.content_type!r})"


class Image(File):
    """A picture: :class:`File` with decoding helpers. Input images are checked from
    their header (format, pixels) before admission; decoding happens on demand."""

    __slots__ = ()

    def __init__(
        self,
        data: bytes | bytearray | memoryview,
        content_type: str | None = None,
        *,
        name: str | None = None,
    ) -> None:
        super().__init__(data, content_type or sniff_image_type(bytes(data[:16])), name=name)

    def _guess_type(self, name: str | None) -> str:
        return super()._guess_type(name) if name else "image/png"

    @classmethod
    def from_pil(cls, picture: Any, format: str = "PNG") -> Image:
        """Encode a Pillow image (PNG unless ``format`` says otherwise)."""
        buf = io.BytesIO()
        picture.save(buf, format=format)
        content_type = f"image/{format.lower()}".replace("image/jpg", "image/jpeg")
        return cls(buf.getvalue(), content_type)

    @classmethod
    def from_array(cls, array: Any, format: str = "PNG") -> Image:
        """Encode an ``H×W`` (grayscale) or ``H×W×C`` uint8 array (floats in [0, 1]
        are scaled)."""
        import numpy as np
        from PIL import Image as PILImage

        arr = np.asarray(array)
        if arr.dtype != np.uint8:
            arr = (np.clip(arr.astype(np.float64), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        return cls.from_pil(PILImage.fromarray(arr), format=format)

    def to_pil(self, mode: str | None = None) -> Any:
        """The decoded picture (Pillow), converted to ``mode`` when given.

        Raises :class:`~mortred_twisted.model_api.base.InputDecodeError` (HTTP 400,
        code 3) when the bytes are not a picture of an accepted format or their pixels
        do not decode (a file cut short after a readable header): the message names
        the input (:attr:`source`) and the accepted formats."""
        from PIL import Image as PILImage

        from mortred_twisted.model_api.image_header import ACCEPTED_FORMATS, OPEN_ERRORS

        try:
            if not self._data:
                raise ValueError("empty")
            picture = PILImage.open(io.BytesIO(self._data), formats=ACCEPTED_FORMATS)
            picture.load()
        except (*OPEN_ERRORS, PILImage.DecompressionBombError) as exc:
            where = self.source or "image"
            reason = unreadable_reason(str(exc))
            raise InputDecodeError(f"{where}: {unreadable_message(reason)}") from None
        return picture.convert(mode) if mode else picture

    def to_numpy(self, mode: str | None = "RGB") -> Any:
        """The decoded picture as a ``uint8`` array (``H×W×3`` for RGB)."""
        import numpy as np

        return np.asarray(self.to_pil(mode))

"""Inputs that pass a declaration's validation, made from the declaration alone (the
conformance check's default inputs): defaults, the lower bound or first choice of a
required input, a small PNG for an image (written by hand: no Pillow needed)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from mortred_twisted.sdk.declaration import Declaration, InputDecl


def tiny_png(width: int = 16, height: int = 16) -> bytes:
    """A small RGB gradient PNG (written by hand: no Pillow needed)."""
    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in (x * 16 % 256, y * 16 % 256, 128))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _sample_value(decl: InputDecl) -> Any:
    if decl.kind == "image":
        return tiny_png()
    if decl.kind == "file":
        return b"conformance sample\n"
    if decl.choices:
        return decl.choices[0]
    if decl.kind == "bool":
        return False
    if decl.kind in ("int", "float"):
        low = decl.ge if decl.ge is not None else (min(0, decl.le) if decl.le is not None else 0)
        return int(-(-low // 1)) if decl.kind == "int" else float(low)
    return "a" * max(decl.min_length or 1, 1)


def sample_inputs(declaration: Declaration) -> dict[str, Any]:
    """Inputs that should pass validation: every required input given a value."""
    out: dict[str, Any] = {}
    for decl in declaration.inputs:
        if decl.required:
            value = _sample_value(decl)
            out[decl.name] = [value] if decl.is_list else value
    return out

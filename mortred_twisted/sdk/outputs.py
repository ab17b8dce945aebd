"""Turning what ``predict`` returns into the envelope's ``data`` and result files.

Runs on the worker thread (hashing and base64 never touch the reactor). Every
:class:`~mortred_twisted.sdk.media.File`/``Image`` found in the output (at any depth:
a dataclass's fields, lists, dict values) is replaced by its description:

* with a :class:`FileSink` (a job whose results are stored as files):
  ``{"url": "/jobs/<job>/files/<name>", "name", "content_type", "size", "sha256"}``,
  the bytes given to the sink;
* without one (the sync path, ``Prefer: return=inline``, ``output_files = "inline"``):
  ``{"name", "content_type", "size", "sha256", "base64"}``.

File names come from where the file sits: ``output.png`` for a single output,
``output-<i>.png`` for a list's items, ``<field>.png`` for a dataclass field or a dict
key (``<field>-<i>.png`` in a list), made unique with a numeric suffix when needed;
the extension follows the content type. Other values must be JSON values (numpy
scalars and arrays are turned into numbers and lists); anything else raises
``TypeError`` naming where it was, and a NaN or infinite float ``ValueError`` (JSON
has neither).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import mimetypes
import re
from collections.abc import Mapping
from typing import Any, Protocol

from mortred_twisted.sdk.media import File

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp"}
MAX_NAME = 100


class FileSink(Protocol):
    """Where a job's result files go (see ``stores/result_files.py``). ``put`` is
    called from the worker thread; ``url_prefix`` is ``/jobs/<job>/files/``."""

    url_prefix: str

    def put(self, name: str, data: bytes, content_type: str) -> None: ...


def extension_for(content_type: str) -> str:
    return _EXTENSIONS.get(content_type) or mimetypes.guess_extension(content_type) or ".bin"


class OutputEncoder:
    """Encodes one run's outputs; keeps the names it gave (one per run, one thread)."""

    __slots__ = ("_names", "sink")

    def __init__(self, sink: FileSink | None) -> None:
        self.sink = sink
        self._names: set[str] = set()

    def _name(self, stem: str, content_type: str) -> str:
        stem = _SAFE.sub("_", stem).strip("._")[:MAX_NAME] or "output"
        ext = extension_for(content_type)
        name, n = f"{stem}{ext}", 1
        while name in self._names:
            name, n = f"{stem}_{n}{ext}", n + 1
        self._names.add(name)
        return name

    def describe(self, value: File, stem: str) -> dict[str, Any]:
        data = value.read()
        name = self._name(stem, value.content_type)
        out: dict[str, Any] = {
            "name": name,
            "content_type": value.content_type,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        if self.sink is not None:
            self.sink.put(name, data, value.content_type)
            return {"url": self.sink.url_prefix + name, **out}
        out["base64"] = base64.b64encode(data).decode("ascii")
        return out

    def encode(self, value: Any, stem: str = "output") -> Any:
        """``value`` as JSON-ready data (files described, see the module docstring)."""
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float):
            if not math.isfinite(value):  # JSON has no NaN/Infinity: clients would choke
                raise ValueError(f"output {stem}: {value} is not a JSON number")
            return value
        if isinstance(value, File):
            return self.describe(value, stem)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: self.encode(getattr(value, f.name), f.name)
                for f in dataclasses.fields(value)
            }
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError(f"output {stem}: dict keys must be strings, not {key!r}")
                out[key] = self.encode(item, key)
            return out
        if isinstance(value, (list, tuple)):
            return [self.encode(item, f"{stem}-{i}") for i, item in enumerate(value)]
        tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
        if callable(tolist):
            return self.encode(tolist(), stem)
        raise TypeError(f"output {stem}: {type(value).__name__} is not a JSON value, Image or File")


def encode_outcome(encoder: Any, out: Any) -> Any:
    """One item's outcome as the server takes it: an exception as it is, an output
    encoded (an output the encoder refuses becomes that item's error)."""
    if isinstance(out, BaseException):
        return out
    try:
        return encoder.encode(out)
    except (TypeError, ValueError) as exc:
        return exc

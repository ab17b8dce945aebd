"""Checking a request's inputs against a declaration (pure; the reactor's side).

:func:`validate_inputs` runs before admission, on the reactor thread: it must stay
cheap (no decoding beyond base64 and image headers). It takes the request's
``params`` (JSON values, or :class:`Upload` parts of a multipart submit) and the seed
envelope's ``images``, and returns:

* the normalised params: every declared input present (defaults filled in), scalars
  coerced (a multipart field's text ``"2"`` becomes ``2`` for an ``int``), and each
  binary input replaced by a *file reference* ``{"$file": i, "content_type": …,
  "name": …}`` (or a list of them);
* the bytes those references index, in order: they travel as the request's
  ``images`` (raw bytes on the Redis wire, never base64 in JSON).

Every problem raises :class:`~mortred_twisted.model_api.base.InvalidRequest` naming
``params.<input>`` (``params.<input>[i]`` for a list item): unknown key (with the
closest name), required input missing, wrong type, bound, choice, length, item count.
Image inputs are checked from their headers (nothing is decoded): over the model's
input limits is :class:`~mortred_twisted.model_api.base.InputTooLarge` (413); empty,
not an accepted format or a header cut short is
:class:`~mortred_twisted.sdk.media.UnreadableImage` (an ``InvalidRequest`` and an
``InputDecodeError``: 400, code 3), naming the input and the accepted formats.

The declaration's cross-input rules apply here as on the seed contract:

* ``renamed_inputs``: an old name is taken as the new one (both given: a 422 on the
  old); an error about such an input names the old name and says
  ``(<old> is now <new>)``.
* ``only_when``: an input given while its condition does not hold is a 422
  (``applies only to …``), its default is then not filled in (``predict`` gets
  None), and a required one is required only while it applies
  (:func:`~mortred_twisted.sdk.constraints.drop_inapplicable`). A null value counts
  as not given, as everywhere on this contract.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mortred_twisted.model_api.base import InputDecodeError, InputTooLarge, InvalidRequest
from mortred_twisted.sdk.media import (
    IMAGE_CONTENT_TYPES,
    UnreadableImage,
    sniff_image_type,
    unreadable_message,
    unreadable_reason,
)

if TYPE_CHECKING:
    from mortred_twisted.model_api.input_limits import InputLimits
    from mortred_twisted.sdk.declaration import Declaration, InputDecl

FILE_REF = "$file"


@dataclass(frozen=True)
class Upload:
    """One file part of a multipart submit (bytes as received)."""

    data: bytes
    content_type: str | None = None
    filename: str | None = None


def _bad(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(where, message)


def _from_text(decl: InputDecl, value: str, where: str) -> Any:
    """A multipart field's text as the input's scalar type."""
    kind = decl.kind
    text = value.strip()
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise _bad(where, f"must be {'an integer' if kind == 'int' else 'a number'}") from None
    if kind == "bool":
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise _bad(where, "must be a boolean (true or false)")
    return value


def check_scalar(decl: InputDecl, value: Any, where: str, *, from_text: bool = False) -> Any:
    """One scalar value of ``decl`` checked and coerced (raises InvalidRequest)."""
    kind = decl.kind
    if from_text and isinstance(value, str) and kind != "str":
        value = _from_text(decl, value, where)
    if kind == "bool":
        if not isinstance(value, bool):
            raise _bad(where, "must be a boolean")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(where, "must be an integer")
        if isinstance(value, float):
            if not value.is_integer():
                raise _bad(where, "must be an integer")
            value = int(value)
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(where, "must be a number")
        value = float(value)
        if not math.isfinite(value):
            raise _bad(where, "must be finite")
    elif kind == "str":
        if not isinstance(value, str):
            raise _bad(where, "must be a string")
        if decl.min_length is not None and len(value) < decl.min_length:
            raise _bad(where, f"must be at least {_count(decl.min_length, 'character')}")
        if decl.max_length is not None and len(value) > decl.max_length:
            raise _bad(where, f"must be at most {_count(decl.max_length, 'character')}")
    if decl.ge is not None and value < decl.ge:
        raise _bad(where, f"must be >= {decl.ge} (got {value})")
    if decl.le is not None and value > decl.le:
        raise _bad(where, f"must be <= {decl.le} (got {value})")
    if decl.choices is not None and value not in decl.choices:
        allowed = ", ".join(repr(c) for c in decl.choices)
        raise _bad(where, f"must be one of {allowed} (got {value!r})")
    return value


def decode_text(value: str, where: str) -> tuple[bytes, str | None]:
    """A base64 string or a ``data:`` URI → (bytes, the URI's content type)."""
    text = value.strip()
    content_type = None
    if text.startswith("data:"):
        head, sep, text = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise _bad(where, "a data: URI must be base64 (data:<type>;base64,<data>)")
        content_type = head[5 : -len(";base64")].split(";", 1)[0] or None
    try:
        return base64.b64decode(text, validate=True), content_type
    except (binascii.Error, ValueError):
        raise _bad(where, "is not valid base64 (or a data: URI)") from None


class _Files:
    """The bytes of the request's binary inputs, collected in order."""

    __slots__ = ("data", "images", "limits")

    def __init__(self, limits: InputLimits | None) -> None:
        self.data: list[bytes] = []
        self.images: list[tuple[str, bytes]] = []
        self.limits = limits

    def add(self, decl: InputDecl, value: Any, where: str) -> dict[str, Any]:
        if isinstance(value, Upload):
            data, content_type, name = value.data, value.content_type, value.filename
        elif isinstance(value, (bytes, bytearray)):  # the seed envelope's images
            data, content_type, name = bytes(value), None, None
        elif isinstance(value, str):
            data, content_type = decode_text(value, where)
            name = None
        else:
            raise _bad(where, "must be a base64 string, a data: URI or a multipart file part")
        if not data:
            if decl.kind == "image":
                raise UnreadableImage(where, unreadable_message("empty"))
            raise _bad(where, "is empty")
        if decl.kind == "image":
            sniffed = sniff_image_type(data[:16])
            if content_type not in (None, "application/octet-stream") and (
                content_type not in IMAGE_CONTENT_TYPES
            ):
                raise _bad(where, f"must be an image, not {content_type}")
            content_type = sniffed or content_type
            self.images.append((where, data))
        ref = {FILE_REF: len(self.data), "content_type": content_type, "name": name}
        self.data.append(data)
        return ref

    def check_images(self) -> None:
        """Every image input's header read (nothing decoded): readable, an accepted
        format, within the limits."""
        if not self.images:
            return
        from mortred_twisted.model_api.input_limits import check_input_limits

        limits = self.limits
        max_images = limits.max_images if limits is not None else None
        if limits is not None and max_images is not None and len(self.images) > max_images:
            check_input_limits([b for _, b in self.images], limits)  # raises 413
        from mortred_twisted.model_api.image_header import MAX_PIXELS, image_header_size

        max_pixels = limits.max_pixels if limits is not None else None
        for where, data in self.images:
            try:
                width, height = image_header_size(data)
            except InputTooLarge as exc:  # over Pillow's own decompression-bomb guard
                raise InputTooLarge(
                    where,
                    f"{exc.message}; this model takes at most max_pixels = "
                    f"{max_pixels or MAX_PIXELS} per image",
                    limit="max_pixels",
                    value=max_pixels or MAX_PIXELS,
                ) from None
            except InputDecodeError as exc:
                reason = unreadable_reason(str(exc))
                raise UnreadableImage(where, unreadable_message(reason)) from None
            if max_pixels is not None and width * height > max_pixels:
                raise InputTooLarge(
                    where,
                    f"{width}x{height} = {width * height} pixels; this model takes at "
                    f"most max_pixels = {max_pixels} per image",
                    limit="max_pixels",
                    value=max_pixels,
                )


def _count(n: int, noun: str) -> str:
    """``1 character``, ``2 characters``: a count that agrees with its noun."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _value(decl: InputDecl, value: Any, where: str, files: _Files, from_text: bool) -> Any:
    if decl.binary:
        return files.add(decl, value, where)
    return check_scalar(decl, value, where, from_text=from_text)


def _renames(
    declaration: Declaration, params: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``params`` with renamed inputs' old names taken as the new ones, and the old
    name each new one was given under."""
    out = dict(params)
    given_as: dict[str, str] = {}
    for old, new in declaration.renamed:
        if old in out:
            if new in out:
                raise _bad(f"params.{old}", f"replaced by params.{new}; give only {new}")
            out[new] = out.pop(old)
            given_as[new] = old
    return out, given_as


def _named_as_given(exc: InvalidRequest, given_as: Mapping[str, str]) -> InvalidRequest:
    """``exc`` about an input the request named by its old name, naming that name
    (``params.timesteps: … (timesteps is now sample_steps)``); others as they are."""
    field = exc.field
    if not field.startswith("params."):
        return exc
    rest = field.removeprefix("params.")
    name = rest.split("[", 1)[0]
    old = given_as.get(name)
    if old is None:
        return exc
    exc.field = f"params.{old}{rest[len(name) :]}"
    exc.message = f"{exc.message} ({old} is now {name})"
    exc.args = (f"{exc.field}: {exc.message}",)
    return exc


def validate_inputs(
    declaration: Declaration,
    params: Mapping[str, Any] | None,
    images: Sequence[bytes] = (),
    *,
    limits: InputLimits | None = None,
    from_text: bool = False,
) -> tuple[dict[str, Any], tuple[bytes, ...]]:
    """See the module docstring. ``from_text``: scalar values may be text (a
    multipart submit's fields)."""
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise InvalidRequest("params", "must be a JSON object")
    params, given_as = _renames(declaration, params)
    try:
        return _validate(declaration, params, images, limits, from_text)
    except InvalidRequest as exc:
        raise _named_as_given(exc, given_as) from None


def _validate(
    declaration: Declaration,
    params: dict[str, Any],
    images: Sequence[bytes],
    limits: InputLimits | None,
    from_text: bool,
) -> tuple[dict[str, Any], tuple[bytes, ...]]:
    from mortred_twisted.sdk.constraints import drop_inapplicable
    from mortred_twisted.sdk.declaration import DEFAULT_MAX_ITEMS

    names = [d.name for d in declaration.inputs]
    for key in params:
        if declaration.input(str(key)) is None:
            hint = difflib.get_close_matches(str(key), names, n=1)
            suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise _bad(
                f"params.{key}",
                f"unknown input{suffix}; accepted: {', '.join(names) or 'none'}",
            )
    if images:
        target = declaration.image_input
        if target is None:
            raise _bad("images", "this model takes no images (or several: name them in params)")
        if target.name in params:
            raise _bad("images", f"give the picture(s) either as images or params.{target.name}")
        params[target.name] = list(images) if target.is_list else images[0]
        if not target.is_list and len(images) > 1:
            raise _bad("images", f"this model takes one image (params.{target.name})")
    files = _Files(limits)
    out: dict[str, Any] = {}
    missing: list[str] = []
    for decl in declaration.inputs:
        where = f"params.{decl.name}"
        value = params.get(decl.name)
        if value is None:
            if decl.required:
                if decl.only_when is None:
                    raise _bad(where, "is required")
                missing.append(decl.name)  # required only while it applies
                continue
            out[decl.name] = (
                decl.default if not decl.is_list or decl.default is None else list(decl.default)
            )
            continue
        if decl.is_list:
            if not isinstance(value, (list, tuple)):
                if from_text or isinstance(value, Upload):
                    value = [value]  # one multipart part of a list input
                else:
                    raise _bad(where, "must be an array")
            cap = decl.max_items or DEFAULT_MAX_ITEMS
            if len(value) > cap:
                raise _bad(where, f"at most {_count(cap, 'item')} (got {len(value)})")
            out[decl.name] = [
                _value(decl, item, f"{where}[{i}]", files, from_text)
                for i, item in enumerate(value)
            ]
        else:
            if isinstance(value, (list, tuple)) and not decl.binary:
                raise _bad(where, f"must be a single {decl.kind}, not an array")
            out[decl.name] = _value(decl, value, where, files, from_text)
    given = {name for name, value in params.items() if value is not None}
    drop_inapplicable(declaration, out, given, missing=missing)
    files.check_images()
    return out, tuple(files.data)

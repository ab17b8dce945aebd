"""What every ``mortred-v1`` adapter shares: the task instance, the seed's pictures,
the fan-out of several pictures per request over one task call.

Contract:

* :func:`task_instance` sets a task :class:`~mortred_twisted.sdk.ServedModel` up
  *inside* an adapter (loader thread): same options and root, its ``setup`` run, no
  wire of its own. The adapter serves it, so a fix to the task serves both contracts.
* :func:`decode_pictures` decodes a request's ``images`` the seed's way
  (:func:`~mortred_twisted.models.codec.decode_image`: its 400 messages, its size
  backstop) to RGB pictures (PIL).
* :func:`fan_out` runs a batch of requests (each with one or more pictures) as *one*
  call over all their good pictures and hands each request its slice; a request
  whose pictures do not decode fails alone, a failing call fails every request it
  carried. Worker threads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from PIL import Image as PILImage

from mortred_twisted.model_api.base import InputDecodeError
from mortred_twisted.models.codec import decode_image
from mortred_twisted.sdk import Image, ServedModel

T = TypeVar("T", bound=ServedModel)


def task_instance(cls: type[T], options: Mapping[str, Any], root: Path) -> T:
    """One ``cls`` (a task model) with ``options`` and ``root``, set up. Its load
    errors (:class:`~mortred_twisted.model_api.base.ModelLoadError`) propagate."""
    task = cls()
    task.options = dict(options)
    task.root = Path(root)
    task.setup()
    return task


def decode_pictures(images: Sequence[Image]) -> list[PILImage.Image]:
    """A request's images as RGB pictures; InputDecodeError for none or for one that
    does not decode (the seed's messages)."""
    if not images:
        raise InputDecodeError("no image in request")
    return [PILImage.fromarray(decode_image(image.read())) for image in images]


def fan_out(
    items: Sequence[Mapping[str, Any]],
    run: Callable[[list[PILImage.Image]], Sequence[Any]],
    answer: Callable[[Mapping[str, Any], Sequence[Any]], Any],
) -> list[Any]:
    """One entry per item: ``answer(item, outputs of its pictures)`` or the exception
    that item alone raised. ``run(pictures)`` is called once over every good item's
    pictures (in item order) and returns one output per picture."""
    prepared: list[list[PILImage.Image] | BaseException] = []
    for item in items:
        try:
            prepared.append(decode_pictures(item["images"]))
        except Exception as exc:
            prepared.append(exc)
    flat = [p for part in prepared if isinstance(part, list) for p in part]
    if not flat:
        return list(prepared)
    try:
        outputs = list(run(flat))
    except Exception as exc:
        return [exc if isinstance(part, list) else part for part in prepared]
    answers: list[Any] = []
    offset = 0
    for item, part in zip(items, prepared, strict=True):
        if isinstance(part, BaseException):
            answers.append(part)
            continue
        try:
            answers.append(answer(item, outputs[offset : offset + len(part)]))
        except Exception as exc:
            answers.append(exc)
        offset += len(part)
    return answers

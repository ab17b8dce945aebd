"""Per-model input limits: images per request and pixels per image (pure policy).

A request's images are checked **from their headers** when the request is validated
(on the reactor thread, before admission, on ``/infer`` and ``POST /jobs`` alike),
before any of them is decoded: :func:`check_input_limits` reads each image's width
and height with Pillow's ``Image.open`` (which parses the header only; nothing is
decompressed) and refuses the request when there are too many images or one has too
many pixels. A refused request costs its body bytes and a header parse per image,
never a decoded picture.

The limits are model-config keys (``[model]`` of a server TOML, or the model TOML it
names), taken out of the options before the model family sees them:

* ``max_images``: images per request (1 .. :data:`MAX_IMAGES_CEILING`, the
  envelope's own cap);
* ``max_pixels``: width x height of each image (1 .. :data:`MAX_PIXELS_CEILING`).

Defaults per model type: :data:`DEFAULT_INPUT_LIMITS`, else
:data:`GENERIC_INPUT_LIMITS` (sizing in docs/configuration.md, "Input limits").
This module imports neither Pillow nor numpy (the config loader uses it); the header
reader lives in :mod:`mortred_twisted.model_api.image_header`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mortred_twisted.model_api.base import InputDecodeError, InputTooLarge

#: The envelope's own cap on images per request (http/envelope.py, 422 above it).
MAX_IMAGES_CEILING = 64
#: The largest picture any model decodes (codec.decode_image refuses larger ones
#: too). Pillow's decompression-bomb guard (``Image.MAX_IMAGE_PIXELS``, 89.5 M
#: pixels: a warning above it, an error above twice it) lies above this ceiling, so
#: an image a limit admits never trips it, and its error is answered like ours.
MAX_PIXELS_CEILING = 4096 * 4096
#: The config keys, as written in ``[model]`` or a model TOML.
INPUT_LIMIT_KEYS = ("max_images", "max_pixels")


@dataclass(frozen=True)
class InputLimits:
    """What one request may carry. ``None`` = not checked: ``max_images`` None leaves
    only the envelope's cap; ``max_pixels`` None reads no header (for models whose
    ``images`` are not pictures, such as the fake model)."""

    max_images: int | None = None
    max_pixels: int | None = None


#: For a model type not in :data:`DEFAULT_INPUT_LIMITS`: 16 images of up to
#: 2048 x 2048 (4.2 M pixels); decoded all at once as RGB that is 16 x 12.6 MB
#: = 201 MB, about 0.4 GB with the decoder's own buffer.
GENERIC_INPUT_LIMITS = InputLimits(max_images=16, max_pixels=2048 * 2048)

#: Defaults by ``[model] type``. SAM_AMG: 4 images of up to 1024 x 1024 (1 M pixels);
#: the pictures are decoded up front (4 x 3 MB) and segmented one after another, and
#: such a request measured +239 MiB above the loaded model with the default AMG params
#: (bench/input_memory.py; docs/configuration.md, "Input limits", also says what its
#: request params can add). The fake model's images are arbitrary bytes: no header
#: is read.
DEFAULT_INPUT_LIMITS: Mapping[str, InputLimits] = {
    "SAM_AMG": InputLimits(max_images=4, max_pixels=1024 * 1024),
    "fake": InputLimits(max_images=None, max_pixels=None),
}

_CEILINGS = {"max_images": MAX_IMAGES_CEILING, "max_pixels": MAX_PIXELS_CEILING}


def input_limit_problems(options: Mapping[str, Any], where: str = "model") -> list[str]:
    """Problems of the limit keys in a model's options (empty when they are valid):
    each must be an integer from 1 to its ceiling."""
    problems = []
    for key, ceiling in _CEILINGS.items():
        if key not in options:
            continue
        value = options[key]
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{where}.{key}: expected an integer, got {value!r}")
        elif not 1 <= value <= ceiling:
            problems.append(f"{where}.{key}: must be between 1 and {ceiling} (got {value})")
    return problems


#: Model types that take no input images (generative): their ``max_images`` option is
#: their own (the bound on ``params.num_images``), never an input limit.
GENERATIVE_TYPES = frozenset({"DDPM", "DDIM", "CLS_COND_DDIM", "LDM"})


def takes_input_limits(model_type: str) -> bool:
    """Whether ``max_images``/``max_pixels`` in a ``model_type`` model's options are the
    input limits of this module (False for the generative types)."""
    return model_type not in GENERATIVE_TYPES


def split_input_limits(
    model_type: str, options: Mapping[str, Any]
) -> tuple[InputLimits, dict[str, Any]]:
    """The limits of a ``model_type`` model configured with ``options`` (its keys
    override the type's default), and the options without them (what the model
    family receives). Raises ValueError naming a bad value."""
    problems = input_limit_problems(options)
    if problems:
        raise ValueError("; ".join(problems))
    default = DEFAULT_INPUT_LIMITS.get(model_type, GENERIC_INPUT_LIMITS)
    limits = InputLimits(
        max_images=options.get("max_images", default.max_images),
        max_pixels=options.get("max_pixels", default.max_pixels),
    )
    rest = {k: v for k, v in options.items() if k not in INPUT_LIMIT_KEYS}
    return limits, rest


def check_input_limits(images: Sequence[bytes], limits: InputLimits) -> None:
    """Refuse a request whose images exceed ``limits``, reading headers only.

    Raises :class:`InputTooLarge` (HTTP 413) naming the limit and its value: too many
    images (before any header is read), or an image whose header declares more than
    ``max_pixels`` (a decompression bomb included). Raises :class:`InputDecodeError`
    (HTTP 400) for an image whose header cannot be read (empty, truncated, not a
    format the decoder takes). Nothing is decoded.
    """
    if limits.max_images is not None and len(images) > limits.max_images:
        raise InputTooLarge(
            "images",
            f"{len(images)} images; this model takes at most max_images = "
            f"{limits.max_images} per request",
            limit="max_images",
            value=limits.max_images,
        )
    if limits.max_pixels is None:
        return
    from mortred_twisted.model_api.image_header import image_header_size

    for i, data in enumerate(images):
        try:
            width, height = image_header_size(data)
        except InputTooLarge as exc:  # over Pillow's own bomb guard
            raise InputTooLarge(
                f"images[{i}]",
                f"{exc.message}; this model takes at most max_pixels = "
                f"{limits.max_pixels} per image",
                limit="max_pixels",
                value=limits.max_pixels,
            ) from None
        except InputDecodeError as exc:
            raise InputDecodeError(f"images[{i}]: {exc}") from None
        if width * height > limits.max_pixels:
            raise InputTooLarge(
                f"images[{i}]",
                f"{width}x{height} = {width * height} pixels; this model takes at most "
                f"max_pixels = {limits.max_pixels} per image",
                limit="max_pixels",
                value=limits.max_pixels,
            )

"""SAM_AMG: automatic mask generation over a transformers ``SamModel``.

The model is a transformers checkpoint directory (``pretrained`` in the model config,
verified by :mod:`mortred_twisted.models.classification.pretrained`): the shipped small
SAM trained here (``weights/perception/sam_amg``) or SAM ViT-B/L/H downloaded
elsewhere. ``SamModel`` and ``SamImageProcessor`` are loaded from local files only; the
automatic mask generator around them is ours (:mod:`.amg`).

Input: PNG/JPEG images (RGB, any size). Output ``data`` for one image::

    {"width": W, "height": H,
     "masks": [{"segmentation": <see below>, "area": int, "bbox": [x, y, w, h],
                "predicted_iou": float, "stability_score": float,
                "point_coords": [[x, y]]}, ...],       # decreasing predicted_iou
     "overlay": "<base64 PNG>"}                         # only if return_overlay

``segmentation`` depends on ``output_mode``:

* ``"uncompressed_rle"`` (default, COCO's uncompressed RLE as SAM emits it):
  ``{"size": [H, W], "counts": [n0, n1, ...]}`` - run lengths of the mask read in
  column-major (Fortran) order, starting with a run of zeros (possibly 0);
* ``"binary_mask_png"``: a base64 PNG, 8-bit grey, 255 inside the mask, 0 outside.

Several images give ``{"results": [that object, ...]}``. Progress is reported as prompt
batches done / total over the whole request, and cancellation is checked between
batches (a cancelled run raises :class:`RunCancelled`).

Declared with the SDK (:class:`SamAmgModel`, the seed's ``"mortred-v1"`` contract:
the params, 422 messages and ``data`` of the seed); requests run one by one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mortred_twisted.model_api.base import InputDecodeError, Model, ModelLoadError
from mortred_twisted.models.classification.pretrained import (
    load_processor,
    quiet_transformers,
    verified_directory,
)
from mortred_twisted.models.classification.weights import (
    option,
    resolve_device,
)
from mortred_twisted.models.codec import decode_image, png_base64
from mortred_twisted.models.schemas import SAM_AMG_OUTPUT
from mortred_twisted.models.segment_anything.amg import (
    MAX_MASKS,
    AmgConfig,
    AutomaticMaskGenerator,
)
from mortred_twisted.models.segment_anything.prompter import SamPrompter
from mortred_twisted.sdk import Context, Image, Input, ServedModel

MODEL_TYPE = "SAM_AMG"
DEFAULT_PRETRAINED = "weights/perception/sam_amg"
OUTPUT_MODES = ("uncompressed_rle", "binary_mask_png")


def mask_to_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO uncompressed RLE of a boolean ``(H, W)`` mask (column-major runs)."""
    h, w = mask.shape
    flat = mask.T.reshape(-1).astype(np.int8)
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0] == 1:
        counts = [0, *counts]
    return {"size": [int(h), int(w)], "counts": [int(c) for c in counts]}


def rle_to_mask(rle: Mapping[str, Any]) -> np.ndarray:
    """Inverse of :func:`mask_to_rle`."""
    h, w = rle["size"]
    flat = np.zeros(h * w, dtype=bool)
    pos, value = 0, False
    for count in rle["counts"]:
        flat[pos : pos + count] = value
        pos += count
        value = not value
    return flat.reshape(w, h).T


PALETTE = np.array(
    [
        [230, 25, 75],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [210, 245, 60],
        [250, 190, 212],
    ],
    dtype=np.float32,
)


def mask_boundary(mask: np.ndarray) -> np.ndarray:
    """Pixels of ``mask`` with a 4-neighbour outside it (or on the picture's edge)."""
    padded = np.pad(mask, 1, constant_values=False)
    inner = padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    return mask & ~inner


def overlay(rgb: np.ndarray, masks: Sequence[np.ndarray], alpha: float = 0.5) -> np.ndarray:
    """The picture with each mask tinted a palette colour and outlined in it (largest
    first, so small masks stay visible on top)."""
    out = rgb.astype(np.float32).copy()
    order = sorted(range(len(masks)), key=lambda i: -int(masks[i].sum()))
    for rank, i in enumerate(order):
        colour = PALETTE[rank % len(PALETTE)]
        m = masks[i]
        out[m] = (1 - alpha) * out[m] + alpha * colour
        out[mask_boundary(m)] = colour
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


_AMG_KEYS = {f.name for f in fields(AmgConfig)}


class SamAmgModel(ServedModel):
    """Automatic mask generation: every object's mask, with its predicted IoU and
    stability score (optionally a colourised overlay)."""

    contract = "mortred-v1"
    output_schema = SAM_AMG_OUTPUT

    generator: AutomaticMaskGenerator
    config: AmgConfig

    def setup(self) -> None:
        """Load the model; AMG defaults from the options.

        The model is a transformers ``SamModel`` directory named by ``pretrained``
        (verified against its manifest; default ``weights/perception/sam_amg``; shared
        by the workers of one process, read-only). Other options: ``device`` and the
        generator's keys (see :class:`AmgConfig`). Raises :class:`ModelLoadError`.
        """
        options = self.options
        unknown = set(options) - _AMG_KEYS - {"pretrained", "device"}
        if unknown:
            raise ModelLoadError(
                f"unknown model option(s) {sorted(unknown)}; known: pretrained, device, "
                + ", ".join(sorted(_AMG_KEYS))
            )
        config = amg_config_from_options(options)
        device = resolve_device(options.get("device", "cpu"))
        directory = verified_directory(options, self.root, DEFAULT_PRETRAINED, MODEL_TYPE)
        self.generator = AutomaticMaskGenerator(load(directory, device))
        self.config = config

    @classmethod
    def around(cls, generator: AutomaticMaskGenerator, config: AmgConfig) -> SamAmgModel:
        """An instance over an already built generator (no ``setup``: scripts, tests)."""
        instance = cls()
        instance.generator = generator
        instance.config = config
        return instance

    def _config(self, given: Mapping[str, Any]) -> AmgConfig:
        overrides = {k: v for k, v in given.items() if k in _AMG_KEYS and v is not None}
        return replace(self.config, **overrides)

    def predict(
        self,
        ctx: Context,
        images: list[Image] = Input(description="PNG/JPEG pictures, any size"),
        points_per_side: int = Input(
            None, ge=1, le=64, description="prompt grid is points_per_side^2 points"
        ),
        points_per_batch: int = Input(
            None,
            ge=1,
            le=256,
            description="prompts decoded per batch (one progress step each); at most 256 "
            "bounds the decoder's working memory",
        ),
        pred_iou_thresh: float = Input(None, ge=0.0, le=1.0),
        stability_score_thresh: float = Input(None, ge=0.0, le=1.0),
        stability_score_offset: float = Input(None, ge=0.0, le=100.0),
        box_nms_thresh: float = Input(None, ge=0.0, le=1.0),
        min_mask_region_area: int = Input(None, ge=0, le=1 << 24),
        crop_n_layers: int = Input(
            None,
            ge=0,
            le=3,
            description="extra layers of overlapping crops (layer i: 2^i x 2^i crops), "
            "each embedded once; 0 = the whole picture only",
        ),
        crop_overlap_ratio: float = Input(
            None,
            ge=0.0,
            le=0.9,
            description="overlap of neighbouring crops, as a share of the picture's short "
            "side (scaled by 2 / crops per side)",
        ),
        crop_n_points_downscale_factor: int = Input(
            None,
            ge=1,
            le=16,
            description="each crop layer's point grid has this factor fewer points per side",
        ),
        crop_nms_thresh: float = Input(
            None,
            ge=0.0,
            le=1.0,
            description="box IoU above which a mask of a larger crop is dropped",
        ),
        max_masks: int = Input(
            None,
            ge=1,
            le=MAX_MASKS,
            description="masks returned per image at most (highest predicted IoU first); "
            "bounds the full-size masks held",
        ),
        output_mode: str = Input("uncompressed_rle", choices=OUTPUT_MODES),
        return_overlay: bool = Input(
            False, description="also return a colourised overlay PNG (base64)"
        ),
    ) -> Any:
        """Generate masks for every image; progress per prompt batch; cancellable."""
        # the declared params by name, as the seed's validated ``params`` name them
        given = {k: v for k, v in locals().items() if k not in ("self", "ctx", "images")}
        if not images:
            raise InputDecodeError("no image in request")
        pictures = [decode_image(image.read()) for image in images]
        config = self._config(given)
        total = self.generator.batches(config) * len(pictures)
        done = 0
        ctx.progress(0, total)
        ctx.check_cancelled()

        def on_batch() -> None:
            nonlocal done
            done += 1
            ctx.progress(done, total)
            ctx.check_cancelled()

        # Each image's full-size masks are encoded and dropped before the next image
        # is segmented: one request holds at most one image's max_masks masks.
        results = [
            self._format(rgb, self.generator.generate(rgb, config, on_batch), given)
            for rgb in pictures
        ]
        return results[0] if len(results) == 1 else {"results": results}

    @staticmethod
    def _format(
        rgb: np.ndarray, records: list[dict[str, Any]], params: Mapping[str, Any]
    ) -> dict[str, Any]:
        mode = params.get("output_mode", "uncompressed_rle")
        masks = [r["segmentation"] for r in records]
        out_records = []
        for r in records:
            seg = r["segmentation"]
            encoded = (
                mask_to_rle(seg)
                if mode == "uncompressed_rle"
                else png_base64(seg.astype(np.uint8) * 255)
            )
            out_records.append({**r, "segmentation": encoded})
        data: dict[str, Any] = {
            "width": int(rgb.shape[1]),
            "height": int(rgb.shape[0]),
            "masks": out_records,
        }
        if params.get("return_overlay"):
            data["overlay"] = png_base64(overlay(rgb, masks))
        return data


def amg_config_from_options(options: Mapping[str, Any]) -> AmgConfig:
    """The generator's defaults from the model config (C++ key names)."""
    from mortred_twisted.sdk.loading import declaration_of
    from mortred_twisted.sdk.seed_contract import param_specs

    defaults = AmgConfig()
    values: dict[str, Any] = {}
    for f in fields(AmgConfig):
        kind = type(getattr(defaults, f.name))
        values[f.name] = option(options, f.name, getattr(defaults, f.name), kind)
    config = AmgConfig(**values)
    # The same ranges as the request params (a config must not allow what a request
    # may not).
    for spec in param_specs(declaration_of(SamAmgModel)):
        if spec.name in _AMG_KEYS:
            value = getattr(config, spec.name)
            low = -math.inf if spec.minimum is None else spec.minimum
            high = math.inf if spec.maximum is None else spec.maximum
            if not low <= value <= high:
                raise ModelLoadError(f"{spec.name} must lie in [{spec.minimum}, {spec.maximum}]")
    return config


_SHARED: dict[tuple[str, str], SamPrompter] = {}


def load(directory: Path, device: torch.device) -> SamPrompter:
    """The ``SamModel`` (eval mode, on ``device``) and processor of a verified directory
    as a :class:`SamPrompter`; workers of one process share it."""
    key = (str(directory), str(device))
    if key not in _SHARED:
        from transformers import SamModel

        quiet_transformers()
        try:
            model = SamModel.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"cannot load SamModel from {directory}: {exc}") from exc
        _SHARED[key] = SamPrompter(model.eval().to(device), load_processor(directory), device)
    return _SHARED[key]  # type: ignore[return-value]


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One mask generator set up and served through the SDK (no input limits: the
    registry's ``create_model`` sets the configured ones; the instance is the returned
    model's ``.instance``). Raises :class:`ModelLoadError`."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(SamAmgModel, options, root)


def serve_generator(generator: Any, config: AmgConfig) -> Model:
    """A served model (the seed's contract) over an already built generator, e.g. one
    around a scripted prompter (tests, evaluation scripts)."""
    from mortred_twisted.sdk.adapter import SdkModel
    from mortred_twisted.sdk.loading import declaration_of

    return SdkModel(declaration_of(SamAmgModel), SamAmgModel.around(generator, config))


def load_for_eval(prompter: SamPrompter, **overrides: Any) -> SamAmgModel:
    """An instance around an already loaded prompter (training and evaluation scripts:
    ``.generator``, ``.config``)."""
    return SamAmgModel.around(AutomaticMaskGenerator(prompter), replace(AmgConfig(), **overrides))

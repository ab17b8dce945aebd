"""Automatic mask generation with the seed's contract (``SAM_AMG``): an adapter over
the task model :class:`~mortred_twisted.models.transformers_tasks.mask_generation.
MaskGenerator` (its ``SamModel`` directory, its generator, its AMG defaults).

The directory (``pretrained``, default the shipped small SAM) must match its
``manifest.json``. The adapter maps the envelope's ``images`` (several per request,
segmented one after the other) and the legacy params (the AMG keys, ``output_mode``,
``return_overlay``) onto the generator, and its records onto the seed's ``data``::

    {"width": W, "height": H,
     "masks": [{"segmentation": <see below>, "area": int, "bbox": [x, y, w, h],
                "predicted_iou": float, "stability_score": float,
                "point_coords": [[x, y]], "crop_box": [x, y, w, h]}, ...],
     "overlay": "<base64 PNG>"}                         # only if return_overlay

``segmentation`` is COCO's uncompressed RLE (``output_mode = "uncompressed_rle"``,
:func:`~mortred_twisted.models.transformers_tasks.sam.masks.mask_to_rle`) or a base64 PNG,
8-bit grey, 255 inside (``"binary_mask_png"``). Several images give ``{"results":
[...]}``. Progress is prompt batches done / total over the whole request;
cancellation is checked between batches. Requests run one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from mortred_twisted.model_api.base import InputDecodeError, Model, ModelLoadError
from mortred_twisted.models.codec import decode_image, png_base64
from mortred_twisted.models.mortred_v1.common import task_instance
from mortred_twisted.models.pretrained import verified_directory
from mortred_twisted.models.schemas import SAM_AMG_OUTPUT
from mortred_twisted.models.transformers_tasks.mask_generation import (
    OUTPUT_MODES,
    MaskGenerator,
    amg_config_from_options,
)
from mortred_twisted.models.transformers_tasks.sam.amg import (
    MAX_MASKS,
    AmgConfig,
    AutomaticMaskGenerator,
)
from mortred_twisted.models.transformers_tasks.sam.masks import mask_to_rle, overlay
from mortred_twisted.models.transformers_tasks.sam.prompter import SamPrompter
from mortred_twisted.sdk import Context, Image, Input, ServedModel

MODEL_TYPE = "SAM_AMG"
DEFAULT_PRETRAINED = "weights/perception/sam_amg"
_AMG_KEYS = {f.name for f in fields(AmgConfig)}


class SamAmgModel(ServedModel):
    """Automatic mask generation: every object's mask, with its predicted IoU and
    stability score (optionally a colourised overlay)."""

    contract = "mortred-v1"
    output_schema = SAM_AMG_OUTPUT

    generator: AutomaticMaskGenerator
    config: AmgConfig

    def setup(self) -> None:
        """Check the options, verify the directory against its manifest and set the
        task model up on it (its generator and AMG defaults serve this contract).

        Options: ``pretrained`` (default ``weights/perception/sam_amg``), ``device``
        and the generator's keys (see :class:`AmgConfig`). Raises
        :class:`ModelLoadError`.
        """
        options = self.options
        unknown = set(options) - _AMG_KEYS - {"pretrained", "device"}
        if unknown:
            raise ModelLoadError(
                f"unknown model option(s) {sorted(unknown)}; known: pretrained, device, "
                + ", ".join(sorted(_AMG_KEYS))
            )
        amg_config_from_options(options)  # its errors before the directory's
        directory = verified_directory(options, self.root, DEFAULT_PRETRAINED, MODEL_TYPE)
        task = task_instance(MaskGenerator, {**options, "pretrained": str(directory)}, self.root)
        self.generator = task.generator
        self.config = task.config

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

"""``task = "mask-generation"``: automatic mask generation (SAM's AMG) over any
``SamModel`` directory (sam-vit-base/large/huge or smaller ones of that layout).

The generator is SAM_AMG's (:mod:`mortred_twisted.models.transformers_tasks.sam.amg`): the
same options, filters and records. The server file's ``[model]`` AMG keys
(``points_per_side``, ``pred_iou_thresh``, …) are the defaults; each is also an
input of the request (absent: the default). The checkpoint's geometry (input size,
patch size, embedding grid, low-resolution masks) is read from its config and
checked against its image processor at load (:func:`~mortred_twisted.models.transformers_tasks.
sam.prompter.check_sam_geometry`).

Inputs: ``image`` and the AMG keys, ``output_mode`` (``uncompressed_rle`` or
``binary_mask_png``), ``return_overlay``. Output: ``{"width", "height", "masks":
[{"segmentation", "area", "bbox", "predicted_iou", "stability_score",
"point_coords", "crop_box"}], "overlay"}``: ``segmentation`` is COCO uncompressed
RLE, or a PNG result file per mask; ``overlay`` a PNG result file or null. Progress
is one step per prompt batch; cancellation is checked after each. Not batched (one
picture is already many decoder calls).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.transformers_tasks.common import (
    COMMON_OPTIONS,
    check_options,
    load_parts,
)
from mortred_twisted.sdk import Context, Image, Input, ServedModel

#: ``sam.amg.MAX_MASKS`` (this module imports no torch until setup:
#: a server that isolates its workers reads the declaration without it; a test
#: checks that the two agree).
MAX_MASKS = 256
#: The fields of ``sam.amg.AmgConfig`` (a test checks they agree).
AMG_KEYS = frozenset(
    {
        "points_per_side",
        "points_per_batch",
        "pred_iou_thresh",
        "stability_score_thresh",
        "stability_score_offset",
        "box_nms_thresh",
        "min_mask_region_area",
        "mask_threshold",
        "crop_n_layers",
        "crop_overlap_ratio",
        "crop_n_points_downscale_factor",
        "crop_nms_thresh",
        "max_masks",
    }
)
OUTPUT_MODES = ("uncompressed_rle", "binary_mask_png")


@dataclass
class MaskGeneration:
    """Masks in decreasing predicted IoU (see the module docstring)."""

    width: int
    height: int
    masks: list[dict[str, Any]]
    #: an Image when return_overlay, else None (typed Any: the SDK declares no
    #: optional outputs, and a declared image must be a file)
    overlay: Any


class MaskGenerator(ServedModel):
    """Segments everything in a picture with SAM's automatic mask generator."""

    def setup(self) -> None:
        from mortred_twisted.models.transformers_tasks.sam.amg import AutomaticMaskGenerator
        from mortred_twisted.models.transformers_tasks.sam.prompter import SamPrompter

        check_options(self.options, COMMON_OPTIONS | AMG_KEYS)
        self.config = amg_config_from_options(
            {k: v for k, v in self.options.items() if k in AMG_KEYS}
        )
        parts = load_parts(self.options, self.root, "SamModel")
        self.generator = AutomaticMaskGenerator(
            SamPrompter(parts.model, parts.processor, parts.device)
        )

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture"),
        points_per_side: int | None = Input(None, ge=1, le=64, description="grid side"),
        points_per_batch: int | None = Input(None, ge=1, le=256),
        pred_iou_thresh: float | None = Input(None, ge=0.0, le=1.0),
        stability_score_thresh: float | None = Input(None, ge=0.0, le=1.0),
        stability_score_offset: float | None = Input(None, ge=0.0, le=100.0),
        box_nms_thresh: float | None = Input(None, ge=0.0, le=1.0),
        min_mask_region_area: int | None = Input(None, ge=0, le=1 << 24),
        crop_n_layers: int | None = Input(None, ge=0, le=3),
        crop_overlap_ratio: float | None = Input(None, ge=0.0, le=0.9),
        crop_n_points_downscale_factor: int | None = Input(None, ge=1, le=16),
        crop_nms_thresh: float | None = Input(None, ge=0.0, le=1.0),
        max_masks: int | None = Input(None, ge=1, le=MAX_MASKS),
        output_mode: str = Input("uncompressed_rle", choices=OUTPUT_MODES),
        return_overlay: bool = Input(False, description="also return a colour overlay PNG"),
    ) -> MaskGeneration:
        given = {
            "points_per_side": points_per_side,
            "points_per_batch": points_per_batch,
            "pred_iou_thresh": pred_iou_thresh,
            "stability_score_thresh": stability_score_thresh,
            "stability_score_offset": stability_score_offset,
            "box_nms_thresh": box_nms_thresh,
            "min_mask_region_area": min_mask_region_area,
            "crop_n_layers": crop_n_layers,
            "crop_overlap_ratio": crop_overlap_ratio,
            "crop_n_points_downscale_factor": crop_n_points_downscale_factor,
            "crop_nms_thresh": crop_nms_thresh,
            "max_masks": max_masks,
        }
        import numpy as np

        from mortred_twisted.models.transformers_tasks.sam.masks import mask_to_rle, overlay

        config = replace(self.config, **{k: v for k, v in given.items() if v is not None})
        rgb = image.to_numpy("RGB")
        total = self.generator.batches(config)
        done = 0
        ctx.progress(0, total)
        ctx.check_cancelled()

        def on_batch() -> None:
            nonlocal done
            done += 1
            ctx.progress(done, total)
            ctx.check_cancelled()

        records = self.generator.generate(rgb, config, on_batch)
        masks = []
        for record in records:
            seg = record["segmentation"]
            encoded: Any = (
                mask_to_rle(seg)
                if output_mode == "uncompressed_rle"
                else Image.from_array(seg.astype(np.uint8) * 255)
            )
            masks.append({**record, "segmentation": encoded})
        shown = (
            Image.from_array(overlay(rgb, [r["segmentation"] for r in records]))
            if return_overlay
            else None
        )
        return MaskGeneration(
            width=int(rgb.shape[1]), height=int(rgb.shape[0]), masks=masks, overlay=shown
        )


def amg_config_from_options(options: Mapping[str, Any]) -> Any:
    """The generator's defaults (an ``AmgConfig``) from the server file's AMG keys,
    typed and within the same bounds as the request's inputs (a config must not
    allow what a request may not); ModelLoadError naming the key otherwise. The
    ``mortred-v1`` adapter reads its defaults here too."""
    from dataclasses import fields

    from mortred_twisted.models.transformers_tasks.sam.amg import AmgConfig
    from mortred_twisted.models.weights import option
    from mortred_twisted.sdk.loading import declaration_of

    defaults = AmgConfig()
    values: dict[str, Any] = {}
    for f in fields(AmgConfig):
        kind = type(getattr(defaults, f.name))
        values[f.name] = option(options, f.name, getattr(defaults, f.name), kind)
    config = AmgConfig(**values)
    for decl in declaration_of(MaskGenerator).inputs:
        if decl.name in AMG_KEYS:
            value = getattr(config, decl.name)
            low = -math.inf if decl.ge is None else decl.ge
            high = math.inf if decl.le is None else decl.le
            if not low <= value <= high:
                raise ModelLoadError(f"{decl.name} must lie in [{decl.ge}, {decl.le}]")
    return config

"""Point prompting of a transformers ``SamModel``: one image embedding, many prompts.

:class:`SamPrompter` is what the automatic mask generator (:mod:`.amg`) needs of a
promptable segmenter:

* :meth:`SamPrompter.embed` preprocesses an RGB picture with the checkpoint's
  ``SamImageProcessor`` (longest side resized to the model's input, rescaled,
  normalised, padded bottom/right) and runs the vision encoder **once**
  (``SamModel.get_image_embeddings``);
* :meth:`SamPrompter.predict_points` decodes a batch of single-point prompts against
  that embedding through the prompt encoder and mask decoder (``SamModel.forward``
  with ``image_embeddings``), returning the low-resolution mask logits (the decoder's
  output, ``4 x`` the embedding grid) cropped to the picture's area, and the predicted
  IoU of each of the ``K`` masks per prompt.

Point coordinates are the picture's pixels, continuous (``(x + 0.5, y + 0.5)`` is the
centre of pixel ``(x, y)``), as SAM's own generator passes them. Thread contract:
read-only use of the shared model; one call at a time per embedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from mortred_twisted.model_api.base import ModelLoadError


@dataclass(frozen=True)
class Embedded:
    """One picture's image embedding and the geometry that maps prompts onto it."""

    embeddings: Any  # the image embedding, on the model's device
    scale_x: float  # picture px -> model input px
    scale_y: float
    valid_h: int  # rows / columns of the low-res masks that cover the picture
    valid_w: int


def _side(value: Any) -> int:
    """A config size that may be an int or a ``[h, w]`` pair (square only here)."""
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ModelLoadError(f"non-square SAM sizes are not supported: {value}")
        value = value[0]
    return int(value)


def _processor_side(processor: Any, key: str, field: str) -> int | None:
    value = getattr(processor, key, None)
    if value is None:
        return None
    value = value.get(field) if isinstance(value, dict) else getattr(value, field, None)
    return None if value is None else int(value)


def check_sam_geometry(config: Any, processor: Any) -> tuple[int, int]:
    """The checkpoint's ``(input size, embedding grid side)``, read from its vision
    config (the encoder's weights are sized by it), after checking that the rest of
    the config and the image processor agree with it; a disagreement is a
    :class:`ModelLoadError` naming the keys. Such a directory cannot run: the
    ``SamModel`` would fail inside its first forward pass (e.g. a width-64 layout
    left with sam-vit-base's ``num_pos_feats = 128``: ``The size of tensor a (64)
    must match the size of tensor b (256)``)."""
    vision, prompt, decoder = (
        config.vision_config,
        config.prompt_encoder_config,
        config.mask_decoder_config,
    )
    size = _side(vision.image_size)
    patch = _side(vision.patch_size)
    if size % patch:
        raise ModelLoadError(
            f"vision_config.image_size {size} is not a multiple of its patch_size {patch}"
        )
    grid = size // patch
    problems = []
    width = int(prompt.hidden_size)
    if 2 * int(vision.num_pos_feats) != width:
        problems.append(
            f"vision_config.num_pos_feats = {vision.num_pos_feats} makes "
            f"{2 * int(vision.num_pos_feats)}-channel positional encodings but "
            f"prompt_encoder_config.hidden_size = {width} (SAM needs num_pos_feats = "
            "hidden_size / 2)"
        )
    for name, value in (
        ("vision_config.output_channels", vision.output_channels),
        ("mask_decoder_config.hidden_size", decoder.hidden_size),
    ):
        if int(value) != width:
            problems.append(f"{name} = {value} but prompt_encoder_config.hidden_size = {width}")
    if _side(prompt.image_size) != size:
        problems.append(
            f"prompt_encoder_config.image_size = {prompt.image_size} but "
            f"vision_config.image_size = {size}"
        )
    embedding = int(getattr(prompt, "image_embedding_size", grid))
    if embedding != grid:
        problems.append(
            f"prompt_encoder_config.image_embedding_size = {embedding} but the vision "
            f"encoder's grid is {size} / {patch} = {grid}"
        )
    for key, field in (("pad_size", "height"), ("pad_size", "width"), ("size", "longest_edge")):
        side = _processor_side(processor, key, field)
        if side is not None and side != size:
            problems.append(
                f"the image processor's {key}.{field} = {side} but vision_config.image_size "
                f"= {size}"
            )
    if problems:
        raise ModelLoadError("inconsistent SAM checkpoint: " + "; ".join(problems))
    return size, grid


class SamPrompter:
    """A ``SamModel`` and its processor, shared read-only by the workers of a process.

    The geometry follows the checkpoint's config (:func:`check_sam_geometry`): the
    input size and embedding grid of its vision encoder, the mask decoder's
    low-resolution masks at 4x that grid (128 px for the shipped model, 256 px for
    sam-vit-base). Raises :class:`ModelLoadError` for a config that cannot run."""

    def __init__(self, model: torch.nn.Module, processor: Any, device: torch.device) -> None:
        self.model = model
        self.processor = processor
        self.device = device
        self.input_size, grid = check_sam_geometry(model.config, processor)
        # The mask decoder upscales the embedding grid 4x.
        self.low_res = 4 * grid

    @torch.inference_mode()
    def embed(self, rgb: np.ndarray) -> Embedded:
        """Preprocess ``rgb`` ``(H, W, 3)`` uint8 and compute its image embedding."""
        h, w = rgb.shape[:2]
        inputs = self.processor(images=[Image.fromarray(rgb)], return_tensors="pt")
        rh, rw = (int(v) for v in inputs["reshaped_input_sizes"][0])
        pixel_values = inputs["pixel_values"].to(self.device)
        embeddings = self.model.get_image_embeddings(pixel_values)
        ratio = self.low_res / pixel_values.shape[-1]
        return Embedded(
            embeddings=embeddings,
            scale_x=rw / w,
            scale_y=rh / h,
            valid_h=max(1, min(self.low_res, math.ceil(rh * ratio))),
            valid_w=max(1, min(self.low_res, math.ceil(rw * ratio))),
        )

    @torch.inference_mode()
    def predict_points(
        self, embedded: Embedded, points: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask logits ``(P, K, valid_h, valid_w)`` and predicted IoU ``(P, K)`` (float32,
        CPU) for ``points`` ``(P, 2)`` ``(x, y)`` in picture pixels, one prompt each."""
        scaled = points.float().clone()
        scaled[:, 0] *= embedded.scale_x
        scaled[:, 1] *= embedded.scale_y
        input_points = scaled[None, :, None, :].to(self.device)
        input_labels = torch.ones(1, len(points), 1, dtype=torch.long, device=self.device)
        out = self.model(
            image_embeddings=embedded.embeddings,
            input_points=input_points,
            input_labels=input_labels,
            multimask_output=True,
        )
        logits = out.pred_masks[0, :, :, : embedded.valid_h, : embedded.valid_w]
        return logits.float().cpu(), out.iou_scores[0].float().cpu()

    def decode_training(
        self,
        embeddings: torch.Tensor,
        points: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training-time decoding with gradients: ``embeddings`` ``(B, C, h, w)`` and
        ``points`` ``(B, P, 2)`` in model-input pixels -> logits ``(B, P, K, L, L)``,
        IoU ``(B, P, K)``."""
        labels = torch.ones(points.shape[0], points.shape[1], 1, dtype=torch.long)
        out = self.model(
            image_embeddings=embeddings,
            input_points=points[:, :, None, :],
            input_labels=labels,
            multimask_output=True,
        )
        return out.pred_masks, out.iou_scores

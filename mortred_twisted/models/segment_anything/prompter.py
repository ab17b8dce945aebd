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


@dataclass(frozen=True)
class Embedded:
    """One picture's image embedding and the geometry that maps prompts onto it."""

    embeddings: Any  # the image embedding, on the model's device
    scale_x: float  # picture px -> model input px
    scale_y: float
    valid_h: int  # rows / columns of the low-res masks that cover the picture
    valid_w: int


class SamPrompter:
    """A ``SamModel`` and its processor, shared read-only by the workers of a process."""

    def __init__(self, model: torch.nn.Module, processor: Any, device: torch.device) -> None:
        self.model = model
        self.processor = processor
        self.device = device
        self.input_size = int(model.config.prompt_encoder_config.image_size)
        patch = int(model.config.prompt_encoder_config.patch_size)
        # The mask decoder upscales the embedding grid 4x.
        self.low_res = 4 * (self.input_size // patch)

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

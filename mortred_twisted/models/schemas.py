"""JSON schemas of each model family's output ``data`` (pure; for the OpenAPI document).

A model class points its ``output_schema`` at one of these; the model server embeds
it in ``/openapi.json`` as ``components.schemas.ModelOutput``, the ``data`` of the
sync answer and of ``/jobs/{id}/result``. The prose versions, with examples, are in
docs/models/*.md.
"""

from __future__ import annotations

from typing import Any

_PNG = {"type": "string", "format": "byte", "description": "base64 PNG"}


def _one_or_many(item: dict[str, Any]) -> dict[str, Any]:
    """Perception models answer one object per image; several images → {"results": [...]}."""
    return {
        "oneOf": [
            item,
            {
                "type": "object",
                "required": ["results"],
                "properties": {"results": {"type": "array", "items": item}},
            },
        ]
    }


DIFFUSION_OUTPUT: dict[str, Any] = {
    "type": "object",
    "required": ["images", "width", "height", "steps", "seed", "sampler"],
    "properties": {
        "images": {"type": "array", "items": _PNG},
        "width": {"type": "integer"},
        "height": {"type": "integer"},
        "channels": {"type": "integer", "description": "1 (grayscale PNG) or 3 (RGB)"},
        "steps": {"type": "integer"},
        "seed": {"type": "integer"},
        "scheduler": {"type": "string", "description": "the sampler (params.scheduler)"},
        "sampler": {"type": "string", "description": "same as scheduler (previous name)"},
        "eta": {"type": "number", "description": "scheduler ddim only"},
        "class_ids": {"type": "array", "items": {"type": "integer"}},
        "guidance_scale": {"type": "number"},
        "predicted_x0": {
            "type": "array",
            "description": "only when asked: snapshots of the predicted clean image",
            "items": {
                "type": "object",
                "properties": {
                    "step": {"type": "integer"},
                    "timestep": {"type": "integer"},
                    "images": {"type": "array", "items": _PNG},
                },
            },
        },
    },
}

CLASSIFICATION_OUTPUT: dict[str, Any] = _one_or_many(
    {
        "type": "object",
        "required": ["class_id", "category", "scores"],
        "properties": {
            "class_id": {"type": "integer"},
            "category": {"type": "string"},
            "scores": {"type": "array", "items": {"type": "number"}},
            "top_k": {"type": "array", "items": {"type": "object"}},
        },
    }
)

DETECTION_OUTPUT: dict[str, Any] = _one_or_many(
    {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["class_id", "score", "category", "bbox"],
            "properties": {
                "class_id": {"type": "integer"},
                "score": {"type": "number"},
                "category": {"type": "string"},
                "bbox": {
                    "type": "array",
                    "items": {"type": "number"},
                    "minItems": 4,
                    "maxItems": 4,
                    "description": "[x1, y1, x2, y2] in input pixels",
                },
            },
        },
    }
)

SAM_AMG_OUTPUT: dict[str, Any] = _one_or_many(
    {
        "type": "object",
        "required": ["masks", "width", "height"],
        "properties": {
            "width": {"type": "integer"},
            "height": {"type": "integer"},
            "overlay": _PNG,
            "masks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "segmentation": {
                            "description": "COCO uncompressed RLE (column-major) or base64 PNG",
                        },
                        "area": {"type": "integer"},
                        "bbox": {
                            "type": "array",
                            "items": {"type": "number"},
                            "description": "[x, y, w, h]",
                        },
                        "predicted_iou": {"type": "number"},
                        "stability_score": {"type": "number"},
                        "point_coords": {"type": "array"},
                        "crop_box": {
                            "type": "array",
                            "items": {"type": "number"},
                            "description": "[x, y, w, h] of the crop the mask came from "
                            "(the whole picture without crop layers)",
                        },
                    },
                },
            },
        },
    }
)

FAKE_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": {"type": "string", "enum": ["fake"]},
        "req_id": {"type": "string"},
        "images": {"type": "integer"},
        "digest": {"type": "string", "description": "sha256 over the images' sha256s"},
        "params": {"type": "object"},
        "steps": {"type": "integer"},
    },
}

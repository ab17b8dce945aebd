"""CLS_COND_DDIM: a class-conditional pipeline (UNet2DModel with class embeddings or a
DiT), DDIM with classifier-free guidance by default.

Declared with the SDK: :class:`ClsCondDdimModel` is the catalog id's
:class:`~mortred_twisted.models.diffusion.service.DiffusionModel` (the seed's
``"mortred-v1"`` contract) with two more params, ``class_id`` (bounded by the
pipeline's classes) and ``guidance_scale``. See
:mod:`~mortred_twisted.models.diffusion.factory` (what CLS_COND_DDIM requires of its
pipeline), :mod:`~mortred_twisted.models.diffusion.options` (model options) and
docs/models/diffusion.md (request params, figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model
from mortred_twisted.models.diffusion import inputs
from mortred_twisted.models.diffusion.service import DiffusionModel
from mortred_twisted.sdk import Context


class ClsCondDdimModel(DiffusionModel):
    """CLS_COND_DDIM: a class-conditional pipeline, DDIM with classifier-free guidance."""

    family = "CLS_COND_DDIM"

    def predict(  # two more inputs than the base class, both optional
        self,
        ctx: Context,
        scheduler: str = inputs.scheduler("ddim"),
        sample_steps: int = inputs.sample_steps(1000, inputs.MAX_STEPS_OPTION),
        eta: float = inputs.eta(0.0),
        seed: int = inputs.SEED,
        num_images: int = inputs.num_images(inputs.MAX_IMAGES_OPTION),
        predicted_x0: bool = inputs.PREDICTED_X0,
        class_id: int = inputs.class_id(None),
        guidance_scale: float = inputs.guidance_scale(2.0),
    ) -> dict[str, Any]:
        """Sample ``num_images`` images of ``class_id`` (absent: each image's class is
        drawn from the seed), guided by ``guidance_scale``."""
        params = {
            "scheduler": scheduler, "sample_steps": sample_steps, "eta": eta, "seed": seed,
            "num_images": num_images, "predicted_x0": predicted_x0, "class_id": class_id,
            "guidance_scale": guidance_scale,
        }  # fmt: skip
        return self.sample(ctx, params)


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One CLS_COND_DDIM instance set up and served through the SDK (loader thread);
    raises ``ModelLoadError``."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(ClsCondDdimModel, options, root)

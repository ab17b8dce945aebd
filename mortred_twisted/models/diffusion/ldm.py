"""LDM: latent diffusion (denoiser + VQModel/AutoencoderKL), DDIM by default.

Declared with the SDK: :class:`LdmModel` is the catalog id's
:class:`~mortred_twisted.models.diffusion.service.DiffusionModel` (the seed's
``"mortred-v1"`` contract). See :mod:`~mortred_twisted.models.diffusion.factory`
(what LDM requires of its pipeline), :mod:`~mortred_twisted.models.diffusion.options`
(model options) and docs/models/diffusion.md (request params, figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model
from mortred_twisted.models.diffusion.service import DiffusionModel


class LdmModel(DiffusionModel):
    """LDM: latent diffusion (an autoencoder and its denoiser), DDIM by default."""

    family = "LDM"


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One LDM instance set up and served through the SDK (loader thread); raises
    ``ModelLoadError``."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(LdmModel, options, root)

"""DDPM: the unconditional digit pipeline, ancestral DDPM sampling by default (1000 steps).

Declared with the SDK: :class:`DdpmModel` is the catalog id's
:class:`~mortred_twisted.models.diffusion.service.DiffusionModel` (the seed's
``"mortred-v1"`` contract). See :mod:`~mortred_twisted.models.diffusion.factory`
(what DDPM requires of its pipeline), :mod:`~mortred_twisted.models.diffusion.options`
(model options) and docs/models/diffusion.md (request params, figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model
from mortred_twisted.models.diffusion.service import DiffusionModel


class DdpmModel(DiffusionModel):
    """DDPM: the unconditional digit pipeline, DDPM by default."""

    family = "DDPM"


def create(options: Mapping[str, Any], root: Path) -> Model:
    """One DDPM instance set up and served through the SDK (loader thread); raises
    ``ModelLoadError``."""
    from mortred_twisted.sdk.loading import build_sdk_model

    return build_sdk_model(DdpmModel, options, root)

"""LDM: latent diffusion (denoiser + VQModel/AutoencoderKL), DDIM by default.

One family over diffusers pipelines: see :mod:`~mortred_twisted.models.diffusion.factory`
(what LDM requires of its pipeline), :mod:`~mortred_twisted.models.diffusion.options`
(model options) and docs/models/diffusion.md (request params, figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.models.base import Model
from mortred_twisted.models.diffusion.factory import create_family


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one LDM instance (loader thread); raises ``ModelLoadError``."""
    return create_family("LDM", options, root)

"""CLS_COND_DDIM: a class-conditional pipeline (UNet2DModel with class embeddings or a
DiT), DDIM with classifier-free guidance by default.

One family over diffusers pipelines: see :mod:`~mortred_twisted.models.diffusion.factory`
(what CLS_COND_DDIM requires of its pipeline), :mod:`~mortred_twisted.models.diffusion.options`
(model options) and docs/models/diffusion.md (request params, figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.models.base import Model
from mortred_twisted.models.diffusion.factory import create_family


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one CLS_COND_DDIM instance (loader thread); raises ``ModelLoadError``."""
    return create_family("CLS_COND_DDIM", options, root)

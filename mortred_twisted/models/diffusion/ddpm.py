"""DDPM: the unconditional digit pipeline, ancestral DDPM sampling by default (1000 steps).

One family over diffusers pipelines: see :mod:`~mortred_twisted.models.diffusion.factory`
(what DDPM requires of its pipeline), :mod:`~mortred_twisted.models.diffusion.options`
(model options) and docs/models/diffusion.md (request params, figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.models.base import Model
from mortred_twisted.models.diffusion.factory import create_family


def create(options: Mapping[str, Any], root: Path) -> Model:
    """Build one DDPM instance (loader thread); raises ``ModelLoadError``."""
    return create_family("DDPM", options, root)

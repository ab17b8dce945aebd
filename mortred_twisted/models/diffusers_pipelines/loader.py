"""``create(options, root)`` of ``type = "diffusers"`` (loader thread).

Reads the directory's ``model_index.json`` (:func:`.components.inspect_directory`:
a missing part or an unknown pipeline class fails here, naming it), picks the kind
of the task asked (``task``, or the pipeline class's own), and builds it with the
SDK (:func:`~mortred_twisted.sdk.loading.build_sdk_model`: one instance, its
``setup`` loads the shared pipeline); the SDK adapter hands its step batch and its
configuration-dependent checks to the server (``sdk/step_batching.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model


def create(options: Mapping[str, Any], root: Path) -> Model:
    from mortred_twisted.models.diffusers_pipelines.components import inspect_directory
    from mortred_twisted.models.diffusers_pipelines.kinds import KINDS
    from mortred_twisted.models.diffusers_pipelines.options import read_options
    from mortred_twisted.sdk.loading import build_sdk_model

    opts = read_options(options, root)
    directory = inspect_directory(opts.path)
    kind = KINDS[directory.task(opts.task)]
    return build_sdk_model(kind, options, root)

"""``contract = "mortred-v1"``: a transformers task served with the seed's wire contract.

A ``type = "transformers"`` model answers by default with its task's SDK contract
(``contract = "sdk"``: inputs declared by the task model's ``predict`` signature,
one ``image`` per request, the outputs of :mod:`.classification`, :mod:`.detection`,
:mod:`.mask_generation`). ``contract = "mortred-v1"`` serves the same directory with
the contract the shipped catalog entries have always had, *byte for byte*: the seed
envelope (``images`` required: 422 ``images: required (an array of base64-encoded
images)``), several images per request answered as ``{"results": [...]}`` (one
object for one image), the legacy ``params`` with their names, defaults, bounds and
422 messages, the legacy ``data`` shapes, the input limits and the dynamic batching
of the built-in families.

That contract is an *adapter over the task model* (:mod:`mortred_twisted.models.
mortred_v1`): :data:`V1_FAMILIES` maps each task that has a seed contract to its
adapter, a :class:`~mortred_twisted.sdk.ServedModel` declared with ``contract =
"mortred-v1"`` that sets the task model up inside itself (the task's loading,
preprocessing and forward pass are the only implementation) and maps the envelope's
images, the legacy params and the legacy ``data`` onto it. The legacy type names
(``IMAGE_CLASSIFICATION``/``MOBILENETV2``, ``OBJECT_DETECTION``, ``SAM_AMG``) are
aliases of these configurations (:data:`~mortred_twisted.model_api.builtins.
MODEL_ALIASES`) and name the same adapters; they are built through the SDK
(:func:`~mortred_twisted.sdk.loading.build_sdk_model`). The adapter adds the
shipped entries' load-time check: the directory's ``manifest.json`` (sha256 of each
file) is required; the family's options are accepted (``model_score_threshold``,
``model_nms_threshold``, ``model_keep_top_k`` for detection; the AMG keys for mask
generation). A task without a seed contract (zero-shot classification, semantic
segmentation, depth) is a :class:`~mortred_twisted.model_api.base.ModelLoadError`
naming the tasks that have one, as is an unknown contract.

Loader thread only (the adapters load weights).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import Model, ModelLoadError

#: The option that selects the contract, and its values.
CONTRACT_OPTION = "contract"
SDK_CONTRACT = "sdk"
MORTRED_V1 = "mortred-v1"
CONTRACTS = (SDK_CONTRACT, MORTRED_V1)

#: Task -> ``module:Class`` of its ``mortred-v1`` adapter (the aliases name the same
#: classes: tests/models/test_aliases.py).
V1_FAMILIES: Mapping[str, str] = {
    "image-classification": (
        "mortred_twisted.models.mortred_v1.classification:ImageClassificationModel"
    ),
    "object-detection": "mortred_twisted.models.mortred_v1.detection:ObjectDetectionModel",
    "mask-generation": "mortred_twisted.models.mortred_v1.mask_generation:SamAmgModel",
}


def contract_of(options: Mapping[str, Any]) -> str:
    """The contract ``options`` select (``"sdk"`` when absent); ModelLoadError for
    any other value."""
    contract = options.get(CONTRACT_OPTION, SDK_CONTRACT)
    if contract not in CONTRACTS:
        raise ModelLoadError(
            f"unknown contract {contract!r}; known: {', '.join(repr(c) for c in CONTRACTS)}"
        )
    return str(contract)


def serves_sdk_contract(options: Mapping[str, Any]) -> bool:
    """Whether a built-in SDK type's ``options`` keep the SDK contract (and so take
    ``multipart/form-data`` submits); False for ``mortred-v1``, whose port takes the
    JSON envelope only and answers other bodies 415 ``content type must be
    application/json``, as the built-in families do. Reactor thread; cheap."""
    return options.get(CONTRACT_OPTION, SDK_CONTRACT) != MORTRED_V1


def create_v1(task: str, options: Mapping[str, Any], root: Path) -> Model:
    """The ``task`` model of ``options``' directory with the ``mortred-v1`` contract.

    ``options`` are the server file's ``[model]`` options without ``type``,
    ``contract`` and ``task`` (and without the input limits, which the registry
    sets on the returned model). The model is the family's
    :class:`~mortred_twisted.sdk.adapter.SdkModel` (its ``.instance`` the family's
    instance). Raises ModelLoadError for a task without a seed contract; the family's
    own load errors propagate unchanged.
    """
    target = V1_FAMILIES.get(task)
    if target is None:
        raise ModelLoadError(
            f"contract {MORTRED_V1!r} is defined for the tasks "
            f"{', '.join(sorted(V1_FAMILIES))}, not {task!r} (use contract = "
            f"{SDK_CONTRACT!r})"
        )
    from mortred_twisted.sdk.loading import build_sdk_model

    module, _, attr = target.partition(":")
    family = getattr(importlib.import_module(module), attr)
    return build_sdk_model(family, dict(options), root)

"""The built-in model types and where their families live (pure data).

Entries are ``module:attr`` strings, imported only when a server builds that type
(``models/registry.create_model``): listing them never imports torch. The attribute
is a :class:`~mortred_twisted.sdk.ServedModel` class (a family declared with the
SDK) or, for the loader types that pick a declaration from a directory
(``transformers``, ``diffusers``), a factory ``create(options, root) -> Model``.
``setup.py`` reads this table (without importing the package) to register each name
as an entry point of this distribution.
"""

from __future__ import annotations

from collections.abc import Mapping

MODEL_FACTORIES: Mapping[str, str] = {
    "fake": "mortred_twisted.models.fake:FakeModel",
    "DDPM": "mortred_twisted.models.diffusion.ddpm:DdpmModel",
    "DDIM": "mortred_twisted.models.diffusion.ddim:DdimModel",
    "CLS_COND_DDIM": "mortred_twisted.models.diffusion.cls_cond_ddim:ClsCondDdimModel",
    "LDM": "mortred_twisted.models.diffusion.ldm:LdmModel",
    # MOBILENETV2 is the catalog id of the shipped digit classifier; it stays accepted
    # as a type and builds the same transformers image classifier.
    "MOBILENETV2": ("mortred_twisted.models.mortred_v1.classification:ImageClassificationModel"),
    "IMAGE_CLASSIFICATION": (
        "mortred_twisted.models.mortred_v1.classification:ImageClassificationModel"
    ),
    "OBJECT_DETECTION": "mortred_twisted.models.mortred_v1.detection:ObjectDetectionModel",
    "YOLOV8": "mortred_twisted.models.yolov8.family:YoloV8Model",
    "SAM_AMG": "mortred_twisted.models.mortred_v1.mask_generation:SamAmgModel",
    "transformers": "mortred_twisted.models.transformers_tasks.loader:create",
    "diffusers": "mortred_twisted.models.diffusers_pipelines.loader:create",
}

_V1 = {"type": "transformers", "contract": "mortred-v1"}

#: The legacy type names of the perception entries and the configuration each one
#: stands for: ``type = "MOBILENETV2"`` builds what ``type = "transformers"``, ``task
#: = "image-classification"``, ``contract = "mortred-v1"`` builds (the same
#: ``mortred_v1`` adapter over the same task model; a test builds both). The names
#: stay accepted so that existing server files still load; such an entry may not set
#: ``task`` or ``contract`` itself (a load error says what to write instead).
#: docs/configuration.md prints this table. (DDPM, DDIM, CLS_COND_DDIM and LDM are
#: not aliases yet: their sampler is not the ``diffusers`` type's.)
MODEL_ALIASES: Mapping[str, Mapping[str, str]] = {
    "MOBILENETV2": {**_V1, "task": "image-classification"},
    "IMAGE_CLASSIFICATION": {**_V1, "task": "image-classification"},
    "OBJECT_DETECTION": {**_V1, "task": "object-detection"},
    "SAM_AMG": {**_V1, "task": "mask-generation"},
}

#: Built-in types whose models are SDK models (named inputs, multipart forms).
SDK_TYPES: frozenset[str] = frozenset({"transformers", "diffusers"})

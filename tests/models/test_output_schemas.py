"""Every catalog model's real answer matches the schema its ``/openapi.json`` publishes.

Each model type of ``conf/server`` is built from its shipped config and weights (CPU),
runs on a small demo picture through the production encoding path (run on the
worker, JSON-encode there, splice into the success envelope), and the envelope is
checked against the 200 schemas of the sync route and of ``/jobs/{id}/result`` in
the document :func:`build_openapi` makes for that model. Parameters are the model's
own declared defaults (filled in by its ``validate``), except the few that only cost
time: the fewest sampling steps, no fake delay; optional outputs are switched on
(two images, ``predicted_x0``) so their part of the schema is exercised too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from mortred_twisted.config.catalog import CatalogEntry, discover
from mortred_twisted.config.server import ServerConfig, load_server_config
from mortred_twisted.http.envelope import render_success
from mortred_twisted.http.openapi import build_openapi
from mortred_twisted.model_api.base import InferenceRequest, Model, RunContext
from mortred_twisted.models.registry import MODEL_FACTORIES, SDK_TYPES, create_model
from mortred_twisted.models.schemas import CLASSIFICATION_OUTPUT, DETECTION_OUTPUT
from mortred_twisted.runtime.execution import (
    EncodedResult,
    run_and_encode,
    run_batch_and_encode,
)
from tests.support.json_schema import errors

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demo_data" / "perception"

# One intra-op thread: the inputs are tiny and the machine is shared.
torch.set_num_threads(1)

#: Integer params that set how many denoising/progress steps a run takes.
STEP_PARAMS = frozenset({"timesteps", "sample_steps", "num_inference_steps", "steps"})
#: Params that only cost time (the fake's delay, SAM's prompt grid), turned down.
TIME_ONLY: Mapping[str, Any] = {"delay_ms": 0, "points_per_side": 8}
#: Params that switch optional parts of the output on.
OPTIONAL_OUTPUTS: Mapping[str, Any] = {
    "num_images": 2,
    "predicted_x0": True,
    "return_overlay": True,
    "top_k": 3,
}


def _catalog() -> dict[str, CatalogEntry]:
    """The first catalog entry of each built-in model type (an SDK model named by its
    file or module, ``path.py:Class``, such as conf/server/examples/, is checked by
    tests/examples and the conformance check; so are the built-in SDK types,
    ``SDK_TYPES``: their inputs are declared, not ``params_schema``)."""
    entries, problems = discover(ROOT / "conf" / "server", ROOT)
    assert not problems, problems
    by_type: dict[str, CatalogEntry] = {}
    for entry in entries:
        family = _v1_family(entry)
        if family is not None:  # transformers + contract = "mortred-v1": a family's contract
            by_type.setdefault(family, entry)
        elif ":" not in entry.model_type and entry.model_type not in SDK_TYPES:
            by_type.setdefault(entry.model_type, entry)
    return by_type


def _v1_family(entry: CatalogEntry) -> str | None:
    """The built-in type whose contract a ``type = "transformers"`` entry with
    ``contract = "mortred-v1"`` serves (the registry's type naming that family's
    factory), else None."""
    if entry.model_type != "transformers":
        return None
    from mortred_twisted.models.transformers_tasks.contract import MORTRED_V1, V1_FAMILIES

    config = load_server_config(entry.config_path, env={})
    options = config.model_options
    if options.get("contract") != MORTRED_V1:
        return None
    target = V1_FAMILIES[options["task"]]
    return next(t for t, f in MODEL_FACTORIES.items() if f == target)


CATALOG = _catalog()


def _picture(entry: CatalogEntry) -> bytes:
    name = "digit_3.png" if entry.category == "classification" else "scene_1.png"
    return (DEMO / name).read_bytes()


def quick_params(model: Model) -> dict[str, Any]:
    """Overrides of the model's declared params that only make the run short, or turn
    optional outputs on; everything else stays at the model's own default."""
    params: dict[str, Any] = {}
    for spec in model.params_schema:
        if spec.kind is int and spec.name in STEP_PARAMS:
            value: Any = max(int(spec.minimum or 1), 2)
        elif spec.name in TIME_ONLY or spec.name in OPTIONAL_OUTPUTS:
            value = {**TIME_ONLY, **OPTIONAL_OUTPUTS}[spec.name]
        else:
            continue
        if spec.maximum is not None and not isinstance(value, bool):
            value = min(value, type(value)(spec.maximum))
        params[spec.name] = value
    return params


def answer_schemas(config: ServerConfig, model: Model) -> tuple[dict[str, Any], list[Any]]:
    """The model's OpenAPI document and the 200 schemas that carry its output."""
    doc = build_openapi(config, model.params_schema, model.output_schema)
    sync = doc["paths"][config.server_uri]["post"]["responses"]["200"]
    result = doc["paths"]["/jobs/{job_id}/result"]["get"]["responses"]["200"]
    return doc, [r["content"]["application/json"]["schema"] for r in (sync, result)]


def envelope(req_id: str, encoded: EncodedResult | BaseException) -> Any:
    """The success answer the server would send for one encoded result."""
    assert isinstance(encoded, EncodedResult), f"the run failed: {encoded!r}"
    return json.loads(render_success(req_id, encoded.data_json))


@pytest.fixture(scope="module", params=sorted(CATALOG))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[ServerConfig, Model, bytes]]:
    """One model type built from its shipped server config and weights."""
    entry = CATALOG[request.param]
    config = load_server_config(entry.config_path, env={})
    model = create_model(config.model_type, config.model_options, ROOT)
    yield config, model, _picture(entry)
    model.close()


def test_catalog_covers_every_model_type() -> None:
    """Every registered model family has a shipped config, so each is checked below
    (a type that names the same factory as a shipped one, such as IMAGE_CLASSIFICATION
    beside MOBILENETV2, is covered by it)."""
    assert set(CATALOG) <= set(MODEL_FACTORIES)
    families = {target for t, target in MODEL_FACTORIES.items() if t not in SDK_TYPES}
    assert {MODEL_FACTORIES[t] for t in CATALOG} == families


def test_real_output_matches_the_published_schema(
    served: tuple[ServerConfig, Model, bytes],
) -> None:
    """A real answer (one picture, two pictures, and a batch) is valid against the
    200 schemas of the sync route and of /jobs/{id}/result."""
    config, model, picture = served
    assert model.output_schema is not None, f"{config.model_type} publishes no output schema"
    doc, schemas = answer_schemas(config, model)
    params = quick_params(model)
    one = model.validate(InferenceRequest("one", (picture,), params))
    two = model.validate(InferenceRequest("two", (picture, picture), params))
    answers = {
        "one picture": envelope("one", run_and_encode(model, one, RunContext())),
        "two pictures": envelope("two", run_and_encode(model, two, RunContext())),
    }
    batch = run_batch_and_encode(model, [one, two], [RunContext(), RunContext()])
    answers.update({f"batch item {i}": envelope("b", r) for i, r in enumerate(batch)})
    for what, answer in answers.items():
        assert answer["data"], f"{config.model_type} ({what}) answered empty data: {answer}"
        for schema in schemas:
            problems = errors(answer, schema, doc)
            assert not problems, f"{config.model_type} ({what}): {problems[:5]}"


@pytest.mark.parametrize(
    ("schema", "data"),
    [
        (CLASSIFICATION_OUTPUT, {"category": "3", "scores": [0.9]}),
        (CLASSIFICATION_OUTPUT, {"class_id": "3", "category": "3", "scores": [0.9]}),
        (DETECTION_OUTPUT, [{"class_id": 0, "score": 0.9, "category": "c", "bbox": [1, 2, 3]}]),
        (DETECTION_OUTPUT, {"results": [[{"class_id": 0, "score": True}]]}),
    ],
)
def test_the_check_rejects_outputs_that_break_the_schema(
    schema: Mapping[str, Any], data: Any
) -> None:
    """The validator has teeth: a missing field, a wrong type or a short bbox fails."""
    assert errors(data, schema)

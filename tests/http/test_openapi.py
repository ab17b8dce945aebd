"""The OpenAPI document matches the routes the Klein app really serves."""

from __future__ import annotations

import re

from tests.http.test_model_server_app import call, make_app


def klein_to_openapi(path: str) -> str:
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", path)


def test_openapi_paths_and_methods_match_the_routes() -> None:
    """Every registered route and method is documented, and nothing else is."""
    app, _clock, _threads, stub = make_app()
    code, _h, doc = call(stub, "GET", "/openapi.json")
    assert code == 200 and doc["openapi"].startswith("3.")
    documented = {(path, method.upper()) for path, item in doc["paths"].items() for method in item}
    served = {
        (klein_to_openapi(path), method)
        for path, methods in app.routes.items()
        for method in methods
    }
    assert documented == served


def test_openapi_documents_the_model_params() -> None:
    """The request schema lists the model's params with their bounds."""
    _app, _clock, _threads, stub = make_app()
    _code, _h, doc = call(stub, "GET", "/openapi.json")
    params = doc["components"]["schemas"]["Request"]["properties"]["params"]
    assert params["additionalProperties"] is False
    assert params["properties"]["delay_ms"] == {
        "type": "integer",
        "minimum": 0,
        "maximum": 600000,
        "description": "run time",
    }


def test_openapi_documents_the_model_output() -> None:
    """The result schema embeds the model's output schema as ModelOutput."""
    _app, _clock, _threads, stub = make_app()
    _code, _h, doc = call(stub, "GET", "/openapi.json")
    output = doc["components"]["schemas"]["ModelOutput"]
    assert output["properties"]["digest"]["type"] == "string"
    ok = doc["paths"]["/infer"]["post"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"]["allOf"][1]["properties"]["data"] == {
        "$ref": "#/components/schemas/ModelOutput"
    }


def test_every_model_family_declares_its_output_schema() -> None:
    """Each served family documents its data (imports torch: model modules)."""
    from mortred_twisted.models.diffusion.service import DiffusionModel
    from mortred_twisted.models.mortred_v1.classification import (
        ImageClassificationModel as MobileNetV2Model,
    )
    from mortred_twisted.models.mortred_v1.mask_generation import SamAmgModel
    from mortred_twisted.models.yolov8.family import YoloV8Model

    for cls in (MobileNetV2Model, YoloV8Model, DiffusionModel, SamAmgModel):
        assert cls.output_schema is not None, cls.__name__

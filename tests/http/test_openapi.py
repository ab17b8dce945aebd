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

"""A model's OpenAPI document through the gateway (``GET /v1/models/{id}/openapi.json``):
the model server's real document, its paths made the gateway's, the gateway's auth."""

from __future__ import annotations

import json

import pytest

from mortred_twisted.gateway.apikeys import ApiKey, hash_key
from mortred_twisted.gateway.openapi import NotADocument, public_openapi, public_path
from mortred_twisted.gateway.routing import check_method, match, resolve
from tests.http.test_model_server_app import call, make_app

from .test_gateway_app import AUTH, Harness

SERVER_URI = "/mortred/fake/infer"  # the harness's ASYNC entry's


def model_document() -> dict:
    """What a real model server (the fake model, async on) answers at /openapi.json."""
    _app, _clock, _threads, stub = make_app(server_uri=SERVER_URI, auth_token="internal")
    code, _h, doc = call(stub, "GET", "/openapi.json")
    assert code == 200
    return doc


def _fill(template: str) -> str:
    filled = template.replace("{job_id}", "job_known").replace("{name}", "out.png")
    filled = filled.replace("{model}", "ASYNC")  # the OIP door: one model per base URL
    for name, value in (("{prediction_id}", "job_known"), ("{owner}", "mortred"),
                        ("{model_name}", "ASYNC"), ("{version}", "ASYNC")):  # fmt: skip
        filled = filled.replace(name, value)  # the Replicate door
    return filled


def test_the_gateway_serves_the_document_with_the_paths_a_client_calls_there() -> None:
    """Every documented path and method is a gateway route that reaches the model's
    route of the same operation; the model port's own paths are gone."""
    original = model_document()
    h = Harness()
    h.model.openapi = json.dumps(original).encode()
    r, body = h.call("GET", "/v1/models/ASYNC/openapi.json", headers=AUTH)
    assert r.code == 200, body
    seen = h.model.seen[-1]
    assert seen.path == "/openapi.json" and seen.headers["authorization"] == "Bearer internal"
    doc = json.loads(body)
    assert doc["info"]["title"] == "mortred gateway: ASYNC"
    assert doc["components"]["schemas"]["Request"] == original["components"]["schemas"]["Request"]
    reached = set()
    for path, item in doc["paths"].items():
        assert path.startswith("/v1/models/ASYNC/"), path
        for method in item:
            m = match(_fill(path), h.app.catalog)
            assert m is not None, path
            route = resolve(check_method(m, method.upper()), h.app.catalog)
            reached.add((route.upstream_path, method))
    model_port_only = {"/healthz", "/ready", "/metrics"}
    expected = {
        (_fill(path), method)
        for path, item in original["paths"].items()
        if path not in model_port_only
        for method in item
    }
    assert reached == expected
    assert {"/v1/models/ASYNC/infer", "/v1/models/ASYNC/jobs/{job_id}/files/{name}"} <= set(
        doc["paths"]
    )


def test_every_operation_asks_for_the_gateways_credentials() -> None:
    """The model port's bearer is its internal token: at the gateway, each operation
    names the gateway's bearer and its 401 (a gateway error, not the model's envelope)."""
    h = Harness()
    h.model.openapi = json.dumps(model_document()).encode()
    _r, body = h.call("GET", "/v1/models/ASYNC/openapi.json", headers=AUTH)
    doc = json.loads(body)
    for item in doc["paths"].values():
        for op in item.values():
            assert op["security"] == [{"bearer": []}]
            unauthorized = op["responses"]["401"]["content"]["application/json"]["schema"]
            assert unauthorized == {"$ref": "#/components/schemas/GatewayError"}
            assert "429" in op["responses"]
    assert doc["components"]["schemas"]["GatewayError"]["required"] == ["error"]


def test_the_gateways_auth_and_routing_apply() -> None:
    """No token is 401 (the model is never asked), a key past its rate limit 429,
    another method 405 + Allow, an unknown model 404."""
    h = Harness(keys=[ApiKey("ci", hash_key("key1"), rate_limit_qps=1)])
    r, _ = h.call("GET", "/v1/models/ASYNC/openapi.json")
    assert r.code == 401 and r.headers.getRawHeaders("www-authenticate")
    r, _ = h.call("POST", "/v1/models/ASYNC/openapi.json", headers=AUTH, data=b"{}")
    assert r.code == 405 and r.headers.getRawHeaders("allow") == ["GET"]
    r, _ = h.call("GET", "/v1/models/NOPE/openapi.json", headers=AUTH)
    assert r.code == 404
    r, _ = h.call("GET", "/v1/models/ASYNC/openapi.json/x", headers=AUTH)
    assert r.code == 404
    assert h.model.seen == []
    key = {"Authorization": "Bearer key1"}
    assert h.call("GET", "/v1/models/ASYNC/openapi.json", headers=key)[0].code == 200
    r, _ = h.call("GET", "/v1/models/ASYNC/openapi.json", headers=key)
    assert r.code == 429 and len(h.model.seen) == 1


@pytest.mark.parametrize(
    "body", [b"not json", b"[1, 2]", b'{"paths": []}', b"\xff\xfe", b'{"openapi": "3.0.3"}']
)
def test_a_model_answer_that_is_no_document_is_502(body: bytes) -> None:
    """What the model answers 200 but is not an OpenAPI document never reaches a
    client as if it were (its paths would be the model port's)."""
    h = Harness()
    h.model.openapi = body
    r, answer = h.call("GET", "/v1/models/ASYNC/openapi.json", headers=AUTH)
    assert r.code == 502 and "openapi.json" in json.loads(answer)["error"]


def test_an_open_gateway_asks_for_no_credentials() -> None:
    doc = json.loads(public_openapi(json.dumps(model_document()).encode(), "M", SERVER_URI, False))
    for item in doc["paths"].values():
        for op in item.values():
            assert "security" not in op and "401" not in op["responses"]


def test_odd_model_ids_and_paths() -> None:
    """The id is quoted into each path (one segment, as the gateway matches it); paths
    the gateway does not route, and items that are not objects, are dropped."""
    assert (
        public_path("/jobs/{job_id}", "a/b c?", "/infer") == "/v1/models/a%2Fb%20c%3F/jobs/{job_id}"
    )
    assert public_path("/infer", "M", "/infer") == "/v1/models/M/infer"
    assert public_path("/admin", "M", "/infer") is None
    assert public_path("/jobsx", "M", "/infer") is None
    body = json.dumps(
        {
            "paths": {"/jobs": "nope", "/admin": {"get": {}}, "/queue": {"get": {"responses": {}}}},
            "servers": [{"url": "http://127.0.0.1:18100"}],
        }
    ).encode()
    doc = json.loads(public_openapi(body, "M", "/infer", True))
    assert list(doc["paths"]) == ["/v1/models/M/queue"] and "servers" not in doc
    with pytest.raises(NotADocument):
        public_openapi(b'{"paths": {"/jobs": 1}', "M", "/infer", True)

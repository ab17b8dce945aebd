"""The OpenAPI document of an SDK model describes its declared inputs."""

from __future__ import annotations

from mortred_twisted.config.server import ServerConfig
from mortred_twisted.http.openapi import build_openapi
from mortred_twisted.sdk import Image, Input, ServedModel
from mortred_twisted.sdk.declaration import declare


class Sharpen(ServedModel):
    """Sharpens a picture."""

    def predict(self, image: Image, amount: float = Input(1.0, ge=0.0, le=4.0)) -> Image:
        raise NotImplementedError


def test_params_multipart_and_result_files_come_from_the_declaration() -> None:
    """Required inputs, bounds, a form body and the ResultFile schema are documented."""
    decl = declare(Sharpen)
    config = ServerConfig(id="SHARPEN", async_enabled=True)
    doc = build_openapi(config, (), decl.output.json_schema(), decl)
    schemas = doc["components"]["schemas"]
    params = schemas["Request"]["properties"]["params"]
    assert params["required"] == ["image"]
    assert params["properties"]["amount"]["maximum"] == 4.0
    assert "minItems" not in schemas["Request"]["properties"]["images"]
    assert schemas["FormRequest"]["properties"]["image"] == {"type": "string", "format": "binary"}
    assert schemas["ModelOutput"] == {"$ref": "#/components/schemas/ResultFile"}
    assert "sha256" in schemas["ResultFile"]["properties"]
    submit = doc["paths"]["/jobs"]["post"]["requestBody"]["content"]
    assert set(submit) == {"application/json", "multipart/form-data"}
    assert doc["info"]["description"].startswith("Sharpens a picture.")
    assert doc["info"]["x-mortred-model"]["name"] == "Sharpen"

"""Pipelines shaped like public checkpoints load and serve through a real model server.

Each pipeline has the component classes and config keys of a public checkpoint
(google/ddpm-cifar10-32, google/ddpm-celebahq-256, CompVis/ldm-celebahq-256,
facebook/DiT-XL-2-256) with random weights at reduced sizes; it is saved with
diffusers, given a manifest, and served by ``twistd mortred-model`` from a server
TOML that only names the catalog id and the directory, as a user would do.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.models.diffusion import builders
from tests.support.servers import model_server

IMG = base64.b64encode(b"ignored by generative models").decode()

SERVER_TOML = """
[server]
id = "{model_id}"
category = "diffusion"
host = "127.0.0.1"
port = 18199
server_uri = "/mortred/diffusion/test"
worker_nums = 1
torch_threads = 1
async_enabled = true
async_timeout = 600000
async_max_queue = 8

[model]
type = "{model_id}"
pretrained = "{pretrained}"
device = "cpu"
sample_steps = 3
"""

# (builder, catalog id, image size, PNG mode, extra params)
CHECKPOINTS: dict[str, tuple[Callable[[Path], Path], str, int, dict[str, Any]]] = {
    "ddpm-cifar10": (builders.public_ddpm_cifar10, "DDPM", 32, {}),
    "ddpm-celebahq": (builders.public_ddpm_celebahq, "DDIM", 64, {"scheduler": "unipc"}),
    "ldm-vq": (builders.public_ldm_vq, "LDM", 32, {"scheduler": "dpmsolver++"}),
    "dit": (builders.public_dit, "CLS_COND_DDIM", 16, {"class_id": 207, "guidance_scale": 4.0}),
}


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_public_layout_serves_rgb_images(name: str, tmp_path: Path) -> None:
    """A job on the served checkpoint returns RGB PNGs of the pipeline's size."""
    build, model_id, size, extra = CHECKPOINTS[name]
    pretrained = build(tmp_path / name)
    config = tmp_path / "server.toml"
    config.write_text(SERVER_TOML.format(model_id=model_id, pretrained=pretrained))
    with model_server(config, wait_ready=False) as server:
        # Importing diffusers takes seconds, and much longer on a loaded machine.
        assert "NOT READY" not in server.wait_ready(timeout=600), "".join(server.log[-20:])
        body = {
            "images": [IMG],
            "req_id": name,
            "params": {"seed": 5, "num_images": 2, **extra},
        }
        status, doc = server.json("POST", "/jobs", body)
        assert status == 202, (doc, "".join(server.log[-20:]))
        job = doc["job_id"]
        status, waited = server.json("GET", f"/jobs/{job}/wait?timeout=60000")
        assert status == 200 and waited["state"] == "done", waited
        status, result = server.json("GET", f"/jobs/{job}/result")
    assert status == 200 and result["code"] == 0, result
    data = result["data"]
    assert (data["width"], data["height"], data["channels"], data["steps"]) == (size, size, 3, 3)
    assert len(data["images"]) == 2
    for b64 in data["images"]:
        with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
            assert (img.format, img.mode, img.size) == ("PNG", "RGB", (size, size))
    if model_id == "CLS_COND_DDIM":
        assert data["class_ids"] == [207, 207]

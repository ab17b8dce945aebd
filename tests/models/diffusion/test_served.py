"""A DDPM job served end to end by a real model server (twistd subprocess)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.support.servers import model_server

CONF = "conf/server/diffusion/ddpm.toml"
IMG = base64.b64encode(b"ignored by generative models").decode()


@pytest.fixture(scope="module")
def server():
    with model_server(CONF, wait_ready=False) as srv:
        # Importing diffusers takes seconds, and much longer on a loaded machine.
        assert "NOT READY" not in srv.wait_ready(timeout=600), "".join(srv.log[-20:])
        yield srv


def test_ddpm_job_returns_decodable_pngs(server) -> None:
    """POST /jobs with a short schedule ends done, and /result holds 16x16 PNGs."""
    body = {
        "images": [IMG],
        "req_id": "ddpm-e2e",
        "params": {"sample_steps": 5, "seed": 3, "num_images": 2},
    }
    status, doc = server.json("POST", "/jobs", body)
    assert status == 202, doc
    job = doc["job_id"]
    status, waited = server.json("GET", f"/jobs/{job}/wait?timeout=60000")
    assert status == 200 and waited["state"] == "done", waited
    status, result = server.json("GET", f"/jobs/{job}/result")
    assert status == 200 and result["code"] == 0, result
    data = result["data"]
    assert (data["steps"], data["seed"], data["scheduler"]) == (5, 3, "ddpm")
    assert len(data["images"]) == 2
    for b64 in data["images"]:
        with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
            assert img.format == "PNG" and img.size == (16, 16)


def test_same_seed_same_images_over_http(server) -> None:
    """The sync path with the same seed returns the same bytes, also under the old param name."""
    # "timesteps" is the previous name of sample_steps; it still works.
    body = {"images": [IMG], "req_id": "d", "params": {"timesteps": 3, "seed": 9}}
    first = server.json("POST", "/mortred/diffusion/ddpm", body)
    second = server.json("POST", "/mortred/diffusion/ddpm", body)
    assert first[0] == second[0] == 200
    assert first[1]["data"]["images"] == second[1]["data"]["images"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"sample_steps": 100000}, "params.sample_steps"),
        ({"steps": 3}, "params.steps"),
        ({"scheduler": "dpmsolver++", "eta": 0.5}, "params.eta"),
    ],
)
def test_bad_params_are_422_before_admission(server, params, field) -> None:
    """Out-of-range or unknown params are refused with 422 naming the field."""
    status, doc = server.json("POST", "/jobs", {"images": [IMG], "req_id": "x", "params": params})
    assert status == 422 and field in doc["error"] and "job_id" not in doc, doc


@pytest.mark.slow
def test_default_schedule_job_is_admitted_long_before_it_finishes(server) -> None:
    """At the default 1000 steps the 202 comes back while the job is still pending/running."""
    body = {"images": [IMG], "req_id": "ddpm-long", "params": {"seed": 1}}
    status, doc = server.json("POST", "/jobs", body)
    assert status == 202, doc
    job = doc["job_id"]
    status, poll = server.json("GET", f"/jobs/{job}")
    assert status == 200 and poll["state"] in ("pending", "running"), poll
    status, early = server.json("GET", f"/jobs/{job}/result")
    assert status == 409, early
    status, waited = server.json("GET", f"/jobs/{job}/wait?timeout=120000", timeout=180)
    assert status == 200 and waited["state"] == "done", waited
    status, result = server.json("GET", f"/jobs/{job}/result")
    assert status == 200 and result["data"]["steps"] == 1000

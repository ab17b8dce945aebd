"""``type = "transformers"`` in a real ``twistd mortred-model`` process on a socket:
a server file naming a directory serves a segmentation job with its result file."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.models.transformers_tasks.conftest import png
from tests.support.servers import model_server

pytestmark = pytest.mark.slow


def test_a_server_file_serves_a_segmenter_job(layout, tmp_path: Path) -> None:
    """A server file with ``type = "transformers"`` and a SegFormer directory (task
    read from config.json) answers a job whose label map is a result file of the
    picture's size, and a 422 for an unknown input."""
    conf = tmp_path / "segformer.toml"
    conf.write_text(
        '[server]\nid = "SEGFORMER"\ncategory = "segmentation"\nserver_uri = "/seg"\n'
        "async_enabled = true\n"
        f'[model]\ntype = "transformers"\npretrained = "{layout("image-segmentation")}"\n'
    )
    picture = base64.b64encode(png(70, 40)).decode()
    with model_server(conf) as srv:
        status, doc = srv.json("POST", "/jobs", {"params": {"image": picture}})
        assert status == 202, doc
        job = doc["job_id"]
        status, doc = srv.json("GET", f"/jobs/{job}/wait?timeout=60000", timeout=70)
        assert status == 200 and doc["state"] == "done", doc
        status, doc = srv.json("GET", f"/jobs/{job}/result")
        assert status == 200, doc
        label_map = doc["data"]["label_map"]
        if "url" in label_map:
            status, _headers, raw = srv.request("GET", label_map["url"])
            assert status == 200
        else:
            raw = base64.b64decode(label_map["base64"])
        assert np.asarray(Image.open(io.BytesIO(raw))).shape == (40, 70)
        status, doc = srv.json("POST", "/jobs", {"params": {"image": picture, "colour": 1}})
        assert status == 422, doc

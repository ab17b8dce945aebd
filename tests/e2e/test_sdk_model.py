"""A user's model, declared with the SDK and named by file path, served end to end."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image as PILImage

from tests.support.servers import RunningServer, model_server

HERE = Path(__file__).parent / "sdk_models"


def png() -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (12, 12), (200, 40, 40)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with model_server(HERE / "sharpen.toml") as running:
        yield running


def submit(server: RunningServer, params: dict) -> dict:
    status, doc = server.json("POST", "/jobs", {"params": params})
    assert status == 202, doc
    return doc


def test_a_job_runs_with_inputs_by_name_and_reports_progress(server: RunningServer) -> None:
    """202 at admission, the run's progress, and a PNG result."""
    doc = submit(server, {"image": base64.b64encode(png()).decode(), "steps": 4})
    status, done = server.json("GET", f"/jobs/{doc['job_id']}/wait?timeout=20000")
    assert status == 200 and done["state"] == "done"
    assert done["progress"] == {"step": 4, "total": 4}
    status, result = server.json("GET", f"/jobs/{doc['job_id']}/result")
    data = result["data"]
    assert data["content_type"] == "image/png" and data["size"] > 0


def test_every_bad_input_is_a_422_before_admission(server: RunningServer) -> None:
    """Bounds, unknown inputs and a missing image are refused; nothing is admitted."""
    b64 = base64.b64encode(png()).decode()
    for params, field in [
        ({"image": b64, "amount": 9}, "params.amount"),
        ({"image": b64, "stpes": 2}, "params.stpes"),
        ({}, "params.image"),
    ]:
        status, doc = server.json("POST", "/jobs", {"params": params})
        assert status == 422 and field in json.dumps(doc), doc


def test_a_multipart_submit_carries_the_picture_as_bytes(server: RunningServer) -> None:
    """One part per file input, fields parsed by their declared type."""
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="steps"\r\n\r\n2\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="p.png"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + png()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    status, _, raw = server.request(
        "POST", "/infer", body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )  # fmt: skip
    doc = json.loads(raw)
    assert status == 200 and doc["data"]["content_type"] == "image/png", doc


def test_cancel_stops_a_running_job_between_its_steps(server: RunningServer) -> None:
    """DELETE while it runs: the job ends cancelled long before its 1000 passes."""
    doc = submit(server, {"image": base64.b64encode(png()).decode(), "steps": 1000})
    job = doc["job_id"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _, snap = server.json("GET", f"/jobs/{job}")
        if snap["state"] == "running" and snap.get("progress"):
            break
        time.sleep(0.02)
    status, _ = server.json("DELETE", f"/jobs/{job}")
    assert status in (200, 202)
    _, ended = server.json("GET", f"/jobs/{job}/wait?timeout=20000")
    assert ended["state"] == "cancelled"
    assert ended["progress"]["step"] < 1000


def test_the_openapi_document_describes_the_declared_inputs(server: RunningServer) -> None:
    """/openapi.json carries the declaration: bounds, required inputs, the form body."""
    _, doc = server.json("GET", "/openapi.json")
    params = doc["components"]["schemas"]["Request"]["properties"]["params"]
    assert params["required"] == ["image"] and params["properties"]["amount"]["maximum"] == 4.0


def test_a_setup_failure_leaves_the_server_not_ready_and_says_why() -> None:
    """/ready is 503 with the reason, /healthz names it, the log has the traceback."""
    with model_server(HERE / "broken.toml") as broken:
        status, ready = broken.json("GET", "/ready")
        assert status == 503 and "setup() failed: FileNotFoundError" in ready["error"]
        status, health = broken.json("GET", "/healthz")
        assert status == 200 and health["model"] == "failed"
        assert "none.safetensors" in health["error"]
        log = "".join(broken.log)
        assert "Traceback" in log and "raise FileNotFoundError" in log


def test_a_streaming_model_sends_previews_and_outputs_on_the_event_stream() -> None:
    """Each yield is an output event, each ctx.emit a preview; the result lists them."""
    import http.client

    with model_server(HERE / "frames.toml") as frames:
        status, doc = frames.json("POST", "/jobs", {"params": {"n": 3}})
        assert status == 202
        conn = http.client.HTTPConnection("127.0.0.1", frames.port, timeout=30)
        conn.request("GET", f"/jobs/{doc['job_id']}/events", headers={"Host": "localhost"})
        stream = conn.getresponse().read().decode()
        conn.close()
        names = [
            line[len("event: ") :] for line in stream.splitlines() if line.startswith("event: ")
        ]
        assert names.count("preview") == 3 and names.count("output") == 3, names
        assert names[-1] == "done"
        assert names.index("preview") < names.index("output")
        _, result = frames.json("GET", f"/jobs/{doc['job_id']}/result")
        assert [item["name"] for item in result["data"]] == [
            "output-0.png", "output-1.png", "output-2.png",
        ]  # fmt: skip


def test_files_a_running_job_has_written_are_served_while_it_runs() -> None:
    """An output event's file can be fetched before the job ends; the rest is 409."""
    import http.client

    with model_server(HERE / "frames.toml") as frames:
        status, doc = frames.json("POST", "/jobs", {"params": {"n": 40}})
        assert status == 202
        job = doc["job_id"]
        conn = http.client.HTTPConnection("127.0.0.1", frames.port, timeout=30)
        conn.request("GET", f"/jobs/{job}/events", headers={"Host": "localhost"})
        stream = conn.getresponse()
        url = None
        while url is None:
            line = stream.fp.readline().decode()
            assert line, "the stream ended before an output event"
            if line.startswith("data: ") and '"url"' in line:
                url = json.loads(line[len("data: ") :])["url"]
        status, _, body = frames.request("GET", url)
        assert status == 200 and body.startswith(b"\x89PNG")
        _, snap = frames.json("GET", f"/jobs/{job}")
        assert snap["state"] == "running"
        status, _, _ = frames.request("GET", f"/jobs/{job}/files/output-39.png")
        assert status == 409
        conn.close()
        frames.json("DELETE", f"/jobs/{job}")

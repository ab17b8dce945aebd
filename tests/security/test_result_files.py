"""Attacks on result files (issue 26 item 3), as a client would make them on real
sockets: path traversal in ``{name}`` (raw ``..``, percent-encoded, NUL, the sidecar
names) against the model port and the gateway, another API key's files, and ranges
that overflow."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control.plane import ControlPlane
from tests.control.test_result_files import JOBS, SDK_MODELS, finished_job, gw, start_plane
from tests.security.wire import exchange
from tests.support.servers import RunningServer, model_server

pytestmark = pytest.mark.slow

#: names that try to leave the job's directory, or reach what is not a result file
HOSTILE = [
    "../../../../etc/passwd",
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "..",
    "%2e%2e",
    ".notes-0.txt.meta",
    "notes-0.txt%00.png",
    "notes-0.txt%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "%5c..%5c..%5cetc%5cpasswd",
]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from start_plane(tmp_path_factory.mktemp("files-security"))


@pytest.fixture(scope="module")
def port_server() -> Iterator[RunningServer]:
    with model_server(SDK_MODELS / "files.toml") as server:
        yield server


def raw_get(port: int, path: str, headers: str = "") -> tuple[int, bytes]:
    """One GET with the path sent exactly as given (no client normalisation)."""
    request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n"
    answers, _closed = exchange(port, request.encode("latin-1"))
    assert answers, f"no answer to {path!r}"
    return answers[0].status, answers[0].body


def test_traversal_in_the_name_never_leaves_the_job_on_the_model_port(
    port_server: RunningServer,
) -> None:
    """Every hostile name is a 404 (or 400 for a path that is not UTF-8) and no
    answer carries a byte of /etc/passwd or a sidecar."""
    status, doc = port_server.json("POST", "/jobs", {"params": {"n": 1}})
    job = doc["job_id"]
    port_server.json("GET", f"/jobs/{job}/wait?timeout=20000")
    for name in HOSTILE:
        status, body = raw_get(port_server.port, f"/jobs/{job}/files/{name}")
        assert status in (400, 404), (name, status, body)
        assert b"root:" not in body and b"sha256" not in body, name
    # the real file is still served, so the 404s above were not an outage
    assert raw_get(port_server.port, f"/jobs/{job}/files/notes-0.txt")[0] == 200


def test_traversal_in_the_name_through_the_gateway(plane: ControlPlane) -> None:
    """The gateway answers hostile names 404 itself (never forwarded)."""
    job, _data = finished_job(plane, "alice", {"n": 1})
    auth = "Authorization: Bearer alice-key\r\n"
    for name in HOSTILE:
        status, body = raw_get(plane.gw_port, f"{JOBS}/{job}/files/{name}", auth)
        assert status in (400, 404), (name, status, body)
        assert b"root:" not in body, name


def test_another_callers_files_are_404_like_unknown_ones(plane: ControlPlane) -> None:
    """bob asking for alice's file gets exactly the 404 of a job that does not
    exist: the job id cannot be probed."""
    job, data = finished_job(plane, "alice", {"n": 1})
    url = data["notes"][0]["url"]
    code, _h, body = gw(plane, "bob", "GET", url)
    unknown = url.replace(job, "job_" + "0" * 24)
    code2, _h2, body2 = gw(plane, "bob", "GET", unknown)
    assert code == code2 == 404
    assert json.loads(body)["code"] == json.loads(body2)["code"]
    assert gw(plane, "bob", "GET", url, headers={"Range": "bytes=0-0"})[0] == 404
    assert gw(plane, "alice", "GET", url)[0] == 200


def test_ranges_that_overflow(plane: ControlPlane) -> None:
    """Huge and malformed ranges: a start past the end is a 416 naming the size, an
    end past it is cut, digits beyond 64 bits and garbage give the whole file; never
    a 500, never more bytes than the file."""
    _job, data = finished_job(plane, "alice", {"n": 1, "size": 100})
    url = data["notes"][0]["url"]
    whole = (b"note 0 " * 100)[:100]
    cases = {
        "bytes=0-99999999999999999999999999999": (200, whole),
        "bytes=99999999999999999999999999999-": (200, whole),
        "bytes=9223372036854775807-": (416, None),  # 19 digits: read, past the end
        "bytes=100-100": (416, None),
        "bytes=-99999999999999999": (206, whole),
        "bytes=--1": (200, whole),
        "bytes=5-2": (200, whole),
        "bytes=0-0,0-0,0-0,0-0": (200, whole),
        "bytes=1-" + "1" * 5000: (200, whole),
    }
    for value, (status, expected) in cases.items():
        code, headers, body = gw(plane, "alice", "GET", url, headers={"Range": value})
        assert code == status, (value, code, body)
        if expected is not None:
            assert body == expected, value
            assert hashlib.sha256(body).digest() != b"" and len(body) <= 100
        else:
            assert headers["content-range"] == "bytes */100", value


def test_files_need_credentials(plane: ControlPlane) -> None:
    """Without an API key the gateway refuses before looking the file up."""
    job, data = finished_job(plane, "alice", {"n": 1})
    code, _h, _b, _ = plane.gw("GET", data["notes"][0]["url"], token=None)
    assert code == 401
    assert Path(data["notes"][0]["url"]).name == "notes-0.txt"
    assert job in data["notes"][0]["url"]

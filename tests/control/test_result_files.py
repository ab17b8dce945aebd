"""Result files end to end (issue 26 item 3): an SDK model returning an ``Image`` and
a list of ``File``s, served by a real model-server process under the supervisor,
through the gateway (``/v1/models/<id>/jobs/<job>/files/<name>``, URLs rewritten in
the result, ranges, ETag, another API key's files as 404) and the supervisor's job
relay (``/api/v1/jobs/<id>/<job>/files/<name>``)."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mortred_twisted.gateway.apikeys import hash_key
from tests.support.servers import model_server

from .plane import API_TOKEN, ControlPlane, control_plane

pytestmark = pytest.mark.slow

MODEL = "SDK_FILES"
JOBS = f"/v1/models/{MODEL}/jobs"
SERVER_TOML = f"""
[server]
id = "{MODEL}"
category = "sdk"
host = "127.0.0.1"
port = 18998
server_uri = "/sdk/files/infer"
worker_nums = 1
async_enabled = true
async_job_ttl = 60000

[model]
type = "tests.e2e.sdk_models.files_model:Pack"
"""
KEYS = ("alice", "bob")
SDK_MODELS = Path(__file__).resolve().parents[1] / "e2e" / "sdk_models"


def start_plane(tmp: Path) -> Iterator[ControlPlane]:
    """A supervisor running the gateway and the files model (keys alice, bob)."""
    catalog = tmp / "catalog"
    catalog.mkdir()
    (catalog / "files.toml").write_text(SERVER_TOML)
    (tmp / "api_keys.toml").write_text(
        "".join(
            f'[[keys]]\nname = "{k}"\nsha256 = "{hash_key(k + "-key")}"\nscope = "inference"\n'
            for k in KEYS
        )
    )
    with control_plane(tmp, [MODEL], catalog_dir=catalog) as cp:
        cp.wait_ready(["gateway", MODEL])
        yield cp


@pytest.fixture(scope="module")
def files_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from start_plane(tmp_path_factory.mktemp("files"))


def gw(plane: ControlPlane, who: str, method: str, path: str, **kw: Any) -> tuple[int, Any, bytes]:
    code, headers, body, _ = plane.gw(method, path, token=f"{who}-key", **kw)
    return code, headers, body


def finished_job(plane: ControlPlane, who: str, params: dict[str, Any]) -> tuple[str, Any]:
    """Submit through the gateway, wait, read the result: (job id, data)."""
    code, _h, body = gw(plane, who, "POST", JOBS, body={"params": params})
    assert code == 202, body
    job = json.loads(body)["job_id"]
    code, _h, body = gw(plane, who, "GET", f"{JOBS}/{job}/wait?timeout=30000")
    assert code == 200 and json.loads(body)["state"] == "done", body
    code, _h, body = gw(plane, who, "GET", f"{JOBS}/{job}/result")
    assert code == 200, body
    return job, json.loads(body)["data"]


def test_files_through_the_gateway(files_plane: ControlPlane) -> None:
    """The result's URLs are the gateway's; each file comes back whole with its type,
    length and ETag; a range is a 206; If-None-Match a 304; bob gets 404s."""
    job, data = finished_job(files_plane, "alice", {"n": 3, "size": 1000})
    urls = [data["picture"]["url"]] + [n["url"] for n in data["notes"]]
    assert urls == [
        f"{JOBS}/{job}/files/picture.png",
        *(f"{JOBS}/{job}/files/notes-{i}.txt" for i in range(3)),
    ]
    for described in [data["picture"], *data["notes"]]:
        code, headers, body = gw(files_plane, "alice", "GET", described["url"])
        assert code == 200, body
        assert hashlib.sha256(body).hexdigest() == described["sha256"]
        assert headers["content-type"] == described["content_type"]
        assert headers["content-length"] == str(described["size"])
        assert headers["etag"] == f'"{described["sha256"]}"'
        assert gw(files_plane, "bob", "GET", described["url"])[0] == 404
    note = data["notes"][2]
    code, headers, body = gw(files_plane, "alice", "GET", note["url"],
                             headers={"Range": "bytes=10-19"})  # fmt: skip
    assert code == 206 and headers["content-range"] == "bytes 10-19/1000"
    assert body == (b"note 2 " * 1000)[10:20]
    code, _h, body = gw(files_plane, "alice", "GET", note["url"],
                        headers={"If-None-Match": f'"{note["sha256"]}"'})  # fmt: skip
    assert (code, body) == (304, b"")
    assert gw(files_plane, "alice", "GET", f"{JOBS}/{job}/files/missing.txt")[0] == 404


def test_a_large_file_comes_back_whole(files_plane: ControlPlane) -> None:
    """A 6 MB file: the whole body, its Content-Length and sha256."""
    _job, data = finished_job(files_plane, "alice", {"n": 1, "size": 6_000_000})
    note = data["notes"][0]
    code, headers, body = gw(files_plane, "alice", "GET", note["url"])
    assert code == 200 and len(body) == 6_000_000
    assert headers["content-length"] == "6000000"
    assert hashlib.sha256(body).hexdigest() == note["sha256"]


def test_files_straight_from_a_model_server_process() -> None:
    """A model server process on its own (the model named by file path, memory store)
    serves its jobs' files: the URL in the result, the bytes, a traversal as 404."""
    with model_server(SDK_MODELS / "files.toml") as server:
        status, doc = server.json("POST", "/jobs", {"params": {"n": 2, "size": 5}})
        assert status == 202, doc
        job = doc["job_id"]
        status, done = server.json("GET", f"/jobs/{job}/wait?timeout=20000")
        assert done["state"] == "done", done
        _, result = server.json("GET", f"/jobs/{job}/result")
        url = result["data"]["notes"][1]["url"]
        assert url == f"/jobs/{job}/files/notes-1.txt"
        code, headers, body = server.request("GET", url)
        assert (code, body) == (200, b"note ")
        assert headers["etag"] == f'"{hashlib.sha256(b"note ").hexdigest()}"'
        assert server.request("GET", f"/jobs/{job}/files/..%2F..%2Fetc%2Fpasswd")[0] == 404


def test_files_through_the_supervisors_relay(files_plane: ControlPlane) -> None:
    """The supervisor's job relay rewrites the result's URLs under /api/v1/jobs and
    serves the files (the operator's view: every job)."""
    job, data = finished_job(files_plane, "alice", {"n": 1, "size": 20})
    code, _h, body, _ = files_plane.api("GET", f"/api/v1/jobs/{MODEL}/{job}/result",
                                        token=API_TOKEN)  # fmt: skip
    assert code == 200, body
    url = json.loads(body)["data"]["notes"][0]["url"]
    assert url == f"/api/v1/jobs/{MODEL}/{job}/files/notes-0.txt"
    code, headers, body, _ = files_plane.api("GET", url, token=API_TOKEN,
                                             headers={"Range": "bytes=-4"})  # fmt: skip
    assert code == 206 and body == (b"note 0 " * 20)[16:20]
    assert headers["etag"] == f'"{data["notes"][0]["sha256"]}"'
    # a file is never a page of the UI's origin: the model's sandbox replaces the
    # UI's policy (issue 37.4); a 304 has no Content-Length (RFC 9110 8.6)
    assert headers["content-security-policy"] == "sandbox"
    assert headers["x-content-type-options"] == "nosniff"
    etag = {"If-None-Match": headers["etag"]}
    code, headers, body, _ = files_plane.api("GET", url, token=API_TOKEN, headers=etag)
    assert (code, body) == (304, b"") and "content-length" not in headers
    code, headers, body = gw(files_plane, "alice", "GET", url.replace(
        f"/api/v1/jobs/{MODEL}/", f"{JOBS}/"), headers=etag)  # fmt: skip
    assert (code, body) == (304, b"") and "content-length" not in headers
    assert headers["content-security-policy"] == "sandbox"


def test_mortredctl_writes_a_jobs_files(files_plane: ControlPlane, tmp_path: Path) -> None:
    """``mortredctl jobs result <job URL> -o DIR`` prints the envelope and writes each
    result file under its name, through the gateway with the caller's key."""
    import io

    from mortred_twisted.cli.mortredctl import main

    job, data = finished_job(files_plane, "alice", {"n": 2, "size": 7})
    out = io.StringIO()
    gateway = f"http://127.0.0.1:{files_plane.gw_port}"
    code = main(["--gateway", gateway, "--gateway-token", "alice-key", "jobs", "result",
                 f"{JOBS}/{job}", "-o", str(tmp_path / "out")], out=out)  # fmt: skip
    assert code == 0
    assert json.loads(out.getvalue())["data"]["count"] == 2
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["notes-0.txt", "notes-1.txt", "picture.png"]
    assert (tmp_path / "out" / "notes-1.txt").read_bytes() == b"note 1 "
    assert data["notes"][1]["size"] == 7


def test_the_models_openapi_document_through_the_gateway(files_plane: ControlPlane) -> None:
    """GET /v1/models/<id>/openapi.json (issue 36.4: a 404 before): the model process's
    document with the gateway's paths and bearer; a submit to the documented path is
    admitted; without a key it is a 401."""
    code, headers, body = gw(files_plane, "alice", "GET", f"/v1/models/{MODEL}/openapi.json")
    assert code == 200 and headers["content-type"].startswith("application/json"), body
    doc = json.loads(body)
    assert set(doc["paths"]) >= {f"/v1/models/{MODEL}/infer", JOBS, f"{JOBS}/{{job_id}}/result"}
    assert all(p.startswith(f"/v1/models/{MODEL}/") for p in doc["paths"])
    assert doc["paths"][JOBS]["post"]["security"] == [{"bearer": []}]
    assert doc["info"]["x-mortred-model"]["inputs"], "the declaration rides along"
    code, _h, body = gw(files_plane, "alice", "POST", JOBS, body={"params": {"n": 1, "size": 1}})
    assert code == 202, body
    code, _h, _b, _t = files_plane.gw("GET", f"/v1/models/{MODEL}/openapi.json", token="")
    assert code == 401


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _slow_get(port: int, path: str, token: str, extra: str = "") -> tuple[socket.socket, bytes]:
    """A client with a 4 KiB receive buffer: sends the GET, reads its head and stops
    reading; (socket, the body bytes that came with the head)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(60)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
              f"{extra}\r\n".encode())  # fmt: skip
    data = b""
    while b"\r\n\r\n" not in data:
        more = s.recv(4096)
        assert more, data
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    return s, head + b"\r\n\r\n" + rest


def _finish(s: socket.socket, got: bytes) -> tuple[bytes, bytes]:
    """Read the rest of the answer whose head (and first bytes) are ``got``."""
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))  # fmt: skip
    parts = [body]
    have = len(body)
    while have < length:
        more = s.recv(1 << 20)
        assert more, (have, length)
        parts.append(more)
        have += len(more)
    s.close()
    return head, b"".join(parts)


def test_slow_readers_of_a_large_file_hold_no_copy_of_it(files_plane: ControlPlane) -> None:
    """Issue 37.1: ten clients that do not read an 8 MB file (six through the
    gateway, one of them a range, four through the supervisor's relay) once each got
    its answer's head: the gateway, the supervisor and the model hold a few chunks
    each, not the file (before, the head went out only once the whole body was in
    memory: +48 MB in the gateway, +32 MB in the supervisor); then each reads on and
    gets every byte."""
    size = 8_000_000
    job, data = finished_job(files_plane, "alice", {"n": 1, "size": size})
    note = data["notes"][0]
    relay_url = f"/api/v1/jobs/{MODEL}/{job}/files/notes-0.txt"
    st = files_plane.status()
    pids = {"gateway": st["gateway"]["pid"], "model": st[MODEL]["pid"],
            "supervisor": files_plane.process.pid}  # fmt: skip
    # one whole download each way first: what the first answer allocates is no growth
    assert len(gw(files_plane, "alice", "GET", note["url"])[2]) == size
    assert len(files_plane.api("GET", relay_url, token=API_TOKEN)[2]) == size
    before = {k: _rss_mib(p) for k, p in pids.items()}
    readers = [_slow_get(files_plane.gw_port, note["url"], "alice-key") for _ in range(5)]
    readers.append(_slow_get(files_plane.gw_port, note["url"], "alice-key",
                             "Range: bytes=1000-\r\n"))  # fmt: skip
    readers += [_slow_get(files_plane.api_port, relay_url, API_TOKEN) for _ in range(4)]
    during = {k: _rss_mib(p) for k, p in pids.items()}
    growth = {k: during[k] - before[k] for k in pids}
    assert all(g < 16 for g in growth.values()), growth
    whole = (b"note 0 " * size)[:size]
    for i, (s, got) in enumerate(readers):
        head, body = _finish(s, got)
        if i == 5:
            assert head.startswith(b"HTTP/1.1 206 ") and body == whole[1000:], head
        else:
            assert head.startswith(b"HTTP/1.1 200 ") and body == whole, head
    assert hashlib.sha256(whole).hexdigest() == note["sha256"]


def test_abusive_ranges_through_the_gateway_on_a_multi_chunk_file(
    files_plane: ControlPlane,
) -> None:
    """Ranges on a file of several read chunks, through the gateway's streamed relay:
    one that spans chunks is that slice exactly; malformed, negative, reversed,
    multiple, overflowing or huge ones are the whole file (RFC 9110 14.2: a Range we
    do not read is ignored); a zero suffix or a start past the end is 416 with
    ``bytes */size``. Every answer's body matches its Content-Length."""
    size = 600_000
    _job, data = finished_job(files_plane, "alice", {"n": 1, "size": size})
    url = data["notes"][0]["url"]
    whole = (b"note 0 " * size)[:size]
    cases: dict[str, tuple[int, bytes]] = {
        "bytes=200000-460000": (206, whole[200000:460001]),
        "bytes=-1": (206, whole[-1:]),
        "bytes=599999-": (206, whole[-1:]),
        "bytes=0-" + "9" * 19: (206, whole),
        "bytes=5-2": (200, whole),
        "bytes=--5": (200, whole),
        "bytes=-" + "9" * 30: (200, whole),
        "bytes=" + "9" * 30 + "-": (200, whole),
        "bytes=0-1,5-6": (200, whole),
        "bytes=" + "1-2," * 2000 + "3-4": (200, whole),
        "bytes=a-b": (200, whole),
        "items=0-5": (200, whole),
        "bytes=-0": (416, b""),
        f"bytes={size}-": (416, b""),
    }
    for value, (status, expected) in cases.items():
        code, headers, body = gw(files_plane, "alice", "GET", url, headers={"Range": value})
        assert code == status, (value[:40], code, body[:200])
        if status == 416:
            assert headers["content-range"] == f"bytes */{size}", value[:40]
            continue
        assert body == expected, value[:40]
        assert headers["content-length"] == str(len(expected)), value[:40]

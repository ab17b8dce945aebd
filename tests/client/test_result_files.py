"""The client's result files (issue 26 item 3.4): ``Result.files()`` finds them at any
depth, ``Client.download`` decodes inline ones and fetches stored ones (checked
against their sha256), ``Job.download_files`` writes them into a folder; against a
real model server process serving an SDK model, and on a scripted transport."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from mortred_client import Client, ResultFile
from mortred_client.protocol import Answer
from mortred_client.sync import save_files
from mortred_client.types import Result

from tests.client.test_sync_unit import Scripted
from tests.support.servers import model_server

SDK_MODELS = Path(__file__).resolve().parents[1] / "e2e" / "sdk_models"


def test_a_jobs_files_are_written_into_a_folder(tmp_path: Path) -> None:
    """Submit to a model port, wait, and write the picture and two notes."""
    with model_server(SDK_MODELS / "files.toml") as server:
        # (the client's submit still asks for an image: submitted here by hand)
        _status, doc = server.json("POST", "/jobs", {"params": {"n": 2, "size": 30}})
        client = Client(f"http://127.0.0.1:{server.port}")
        job = client.job(doc["job_id"])
        written = job.download_files(tmp_path / "out", wait=True, timeout=30)
    assert [p.name for p in written] == ["picture.png", "notes-0.txt", "notes-1.txt"]
    assert (tmp_path / "out" / "notes-1.txt").read_bytes() == (b"note 1 " * 30)[:30]
    assert (tmp_path / "out" / "picture.png").read_bytes().startswith(b"\x89PNG")


def described(data: bytes, **kw: object) -> dict[str, object]:
    return {"name": "a.bin", "content_type": "application/octet-stream", "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), **kw}  # fmt: skip


def test_files_are_found_at_any_depth_and_inline_ones_decode() -> None:
    """A dataclass-shaped output with a list: every described file, in order."""
    inline = described(b"xyz", base64=base64.b64encode(b"xyz").decode())
    stored = described(b"abc", url="/jobs/j/files/a.bin")
    result = Result.from_json({"code": 0, "data": {"one": inline, "many": [stored], "n": 1}})
    files = result.files()
    assert [f.url for f in files] == [None, "/jobs/j/files/a.bin"]
    client = Client("http://test", transport=Scripted(Answer(200, {}, b"abc")))
    assert client.download(files[0]) == b"xyz"
    assert client.download(files[1]) == b"abc"


def test_a_download_that_does_not_match_its_sha256_is_refused() -> None:
    """Bytes that differ from the result's sha256 raise ValueError."""
    file = ResultFile(**described(b"abc", url="/jobs/j/files/a.bin"))  # type: ignore[arg-type]
    client = Client("http://test", transport=Scripted(Answer(200, {}, b"abd")))
    with pytest.raises(ValueError, match="sha256"):
        client.download(file)


@pytest.mark.parametrize("name", ["../x", ".hidden", "a/b", "a\\b", ""])
def test_a_name_that_would_leave_the_folder_is_refused(tmp_path: Path, name: str) -> None:
    """A server cannot make the client write outside the folder."""
    file = ResultFile(**{**described(b"x", base64="eA=="), "name": name})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        save_files(Client("http://test"), [file], tmp_path)
    assert list(tmp_path.iterdir()) == []

"""The client's result files (issue 26 item 3.4): ``Result.files()`` finds them at any
depth, ``Client.download`` decodes inline ones and fetches stored ones (checked
against their sha256), ``Job.download_files`` writes them into a folder; against a
real model server process serving an SDK model, and on a scripted transport. A model
declared with the SDK takes its inputs by name in ``params``: both clients submit to
it without images (no ``images`` key), and the Twisted client downloads as the sync one."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from mortred_client import Client, InvalidRequest, ResultFile
from mortred_client.protocol import Answer
from mortred_client.sync import save_files
from mortred_client.twisted import TwistedClient
from mortred_client.types import Result
from twisted.internet import reactor

from tests.client.test_sync_unit import Scripted
from tests.support.servers import RunningServer, model_server

SDK_MODELS = Path(__file__).resolve().parents[1] / "e2e" / "sdk_models"


@pytest.fixture(scope="module")
def files_server() -> Iterator[RunningServer]:
    with model_server(SDK_MODELS / "files.toml") as server:
        yield server


def test_a_jobs_files_are_written_into_a_folder(
    files_server: RunningServer, tmp_path: Path
) -> None:
    """Submit without images (inputs by name), wait, and write the picture and two notes."""
    client = Client(files_server.base_url)
    job = client.submit(params={"n": 2, "size": 30})
    written = job.download_files(tmp_path / "out", wait=True, timeout=30)
    assert [p.name for p in written] == ["picture.png", "notes-0.txt", "notes-1.txt"]
    assert (tmp_path / "out" / "notes-1.txt").read_bytes() == (b"note 1 " * 30)[:30]
    assert (tmp_path / "out" / "picture.png").read_bytes().startswith(b"\x89PNG")


def test_run_takes_no_images_or_an_empty_list(files_server: RunningServer) -> None:
    """run() with images=None and with [] both reach the model with its params."""
    client = Client(files_server.base_url)
    for images in (None, []):
        result = client.run(images, {"n": 1, "size": 5}, timeout=30)
        assert result.code == 0 and result.data["count"] == 1
        assert [f.name for f in result.files()] == ["picture.png", "notes-0.txt"]
    with pytest.raises(InvalidRequest, match=r"params\.n"):
        client.submit(params={"n": 99})  # the server still checks the inputs


def test_no_images_sends_no_images_key() -> None:
    """The submit body has no images key when there is none (not an empty list)."""
    transport = Scripted(Answer(202, {}, json.dumps({"job_id": "j", "state": "pending"}).encode()))
    Client("http://test", transport=transport).submit(params={"n": 1})
    (call,) = transport.calls
    assert json.loads(call.body or b"") == {"params": {"n": 1}}


def test_images_still_fill_an_sdk_models_image_input() -> None:
    """The seed's envelope keeps working: run([png]) sharpens the picture given."""
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    PILImage.new("RGB", (8, 8), (10, 200, 30)).save(buffer, format="PNG")
    with model_server(SDK_MODELS / "sharpen.toml") as server:
        client = Client(server.base_url)
        result = client.run([buffer.getvalue()], {"steps": 1}, timeout=30)
        (picture,) = result.files()
        data = client.download(picture)
    assert PILImage.open(io.BytesIO(data)).size == (8, 8)


@pytest_twisted.ensureDeferred
async def test_the_twisted_client_submits_without_images_and_downloads(
    files_server: RunningServer, tmp_path: Path
) -> None:
    """TwistedClient.submit(params=...) and TwistedJob.download_files write the same
    files as the sync client; TwistedClient.download checks each one's sha256."""
    client = TwistedClient(files_server.base_url, reactor=reactor)
    job = await client.submit(params={"n": 2, "size": 12})
    written = await job.download_files(tmp_path / "tx", wait=True, timeout=30)
    assert [p.name for p in written] == ["picture.png", "notes-0.txt", "notes-1.txt"]
    assert (tmp_path / "tx" / "notes-0.txt").read_bytes() == (b"note 0 " * 12)[:12]
    result = await client.run(None, {"n": 1, "size": 3})
    note = result.files()[1]
    assert await client.download(note) == b"not"
    forged = ResultFile(**{**described(b"xyz"), "url": note.url})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sha256"):
        await client.download(forged)


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

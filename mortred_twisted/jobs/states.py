"""The async-job state machine, as data (pure).

::

    PENDING ──transition_running──► RUNNING ──finish──► DONE
       │                               ├──fail────► FAILED
       ├──────── fail / timeout ───────┼──timeout─► TIMEOUT
       └──────── cancel ───────────────┴──cancel──► CANCELLED

Only ``PENDING`` may enter ``RUNNING``; any non-terminal state may terminate;
terminal states absorb (every further transition is refused).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class JobState(enum.Enum):
    """The six job states; ``value`` is the wire spelling."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.DONE, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED}
)

#: state -> the states it may move to.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType(
    {
        JobState.PENDING: frozenset(
            {JobState.RUNNING, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED}
        ),
        JobState.RUNNING: frozenset(
            {JobState.DONE, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED}
        ),
        JobState.DONE: frozenset(),
        JobState.FAILED: frozenset(),
        JobState.TIMEOUT: frozenset(),
        JobState.CANCELLED: frozenset(),
    }
)


def can_transition(current: JobState, target: JobState) -> bool:
    """Whether the state machine allows ``current -> target``."""
    return target in TRANSITIONS[current]


class CancelOutcome(enum.Enum):
    """What a cancel request did (the wire contract maps each to a status code)."""

    #: a pending job ended ``cancelled`` at once (200)
    CANCELLED = "cancelled"
    #: a running job was asked to stop; it ends when its run notices (202)
    REQUESTED = "requested"
    #: the job had already ended (409)
    FINISHED = "finished"
    #: no such job (404)
    UNKNOWN = "unknown"

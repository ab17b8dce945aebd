"""The async-job state machine, as data (pure).

::

    PENDING ──transition_running──► RUNNING ──finish──► DONE
       │                               ├──fail────► FAILED
       └──────── fail / timeout ───────┴──timeout─► TIMEOUT

Only ``PENDING`` may enter ``RUNNING``; any non-terminal state may terminate;
terminal states absorb (every further transition is refused).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class JobState(enum.Enum):
    """The five job states; ``value`` is the wire spelling."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES: frozenset[JobState] = frozenset({JobState.DONE, JobState.FAILED, JobState.TIMEOUT})

#: state -> the states it may move to.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType(
    {
        JobState.PENDING: frozenset({JobState.RUNNING, JobState.FAILED, JobState.TIMEOUT}),
        JobState.RUNNING: frozenset({JobState.DONE, JobState.FAILED, JobState.TIMEOUT}),
        JobState.DONE: frozenset(),
        JobState.FAILED: frozenset(),
        JobState.TIMEOUT: frozenset(),
    }
)


def can_transition(current: JobState, target: JobState) -> bool:
    """Whether the state machine allows ``current -> target``."""
    return target in TRANSITIONS[current]

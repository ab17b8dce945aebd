"""``Context``: what a running ``predict`` may tell the server, and ask of it.

Thread contract: a Context is made by the server for one run and used from the
worker thread that runs ``predict``; :meth:`Context.cancel` (the server's side) may
be called from any thread. ``progress`` and ``emit`` are forwarded to the server's
run context (the job's status, its event stream, its webhooks); ``log`` goes to the
server's log with the request id.

Events a run emits are ``(name, value)`` pairs: ``name`` is a short word
(``preview``, ``output``, …: letters, digits, ``_`` and ``-``, at most 32),
``value`` a JSON value or an :class:`~mortred_twisted.sdk.media.Image`/``File`` (sent
as a result file's description, see ``sdk/outputs.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mortred_twisted.model_api.base import RunContext

EVENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
#: Event names the server itself sends on a job's stream.
RESERVED_EVENTS = frozenset({"status", "progress", "end", "error"})


class Context:
    """See the module docstring."""

    __slots__ = ("_emit", "_log", "_run", "request_id")

    def __init__(
        self,
        run: RunContext | None = None,
        *,
        request_id: str = "",
        emit: Callable[[str, Any], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if run is None:
            from mortred_twisted.model_api.base import RunContext

            run = RunContext()
        self._run = run
        self._emit = emit
        self._log = log
        self.request_id = request_id

    def progress(self, step: int, total: int) -> None:
        """Report that ``step`` of ``total`` steps are done (0 <= step <= total)."""
        if isinstance(step, bool) or isinstance(total, bool):
            raise TypeError("progress takes integers")
        step, total = int(step), int(total)
        if total < 0 or step < 0 or step > total:
            raise ValueError(f"progress({step}, {total}): need 0 <= step <= total")
        self._run.progress(step, total)

    def check_cancelled(self) -> None:
        """Raise :class:`~mortred_twisted.model_api.base.RunCancelled` once the job was
        cancelled (or its client left); call it between steps."""
        self._run.check_cancelled()

    @property
    def cancelled(self) -> bool:
        return self._run.cancelled

    def cancel(self) -> None:
        """The server's side: ask the run to stop at its next check."""
        self._run.cancel()

    def emit(self, name: str, value: Any) -> None:
        """Send an event (a preview, a partial output) on the job's event stream."""
        if not isinstance(name, str) or not EVENT_NAME.fullmatch(name):
            raise ValueError(f"event name {name!r}: letters, digits, _ and - (at most 32)")
        if name in RESERVED_EVENTS:
            raise ValueError(f"event name {name!r} is the server's own")
        if self._emit is not None:
            self._emit(name, value)

    def log(self, message: str) -> None:
        """A line in the server's log, tagged with the request id."""
        if self._log is not None:
            self._log(str(message))

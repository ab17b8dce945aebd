"""Per-child logs: a ring buffer of lines for the API, and rotated files (reactor thread).

Every line a child writes (stdout and stderr) gets a sequence number, its *offset*,
counting from 0 for the life of the supervisor (restarts continue the count, so a
client following a log never sees a number twice). The ring keeps the last
``capacity`` lines; older ones remain in ``<log_dir>/<id>.log`` and its rotations
(``.1``, ``.2``, … up to ``log_keep``), written by Twisted's ``LogFile``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

from twisted.python.logfile import LogFile

MAX_LINE = 16 * 1024  # a longer "line" is split, so one runaway write cannot pin memory


@dataclass(frozen=True)
class LogPage:
    """``lines[i]`` has offset ``offset + i``; ``next_offset`` is where to continue."""

    offset: int
    lines: list[str]
    next_offset: int
    first_available: int

    def to_json(self) -> dict[str, object]:
        return {
            "offset": self.offset,
            "next_offset": self.next_offset,
            "first_available": self.first_available,
            "lines": self.lines,
        }


class LogBuffer:
    """Ring buffer of decoded lines with stable offsets, optionally teed to a file."""

    def __init__(
        self,
        capacity: int = 5000,
        file_path: Path | None = None,
        rotate_bytes: int = 10 * 1024 * 1024,
        keep: int = 3,
    ) -> None:
        self._lines: deque[str] = deque(maxlen=capacity)
        self._next = 0  # offset of the next complete line
        self._partial = b""
        self._file: LogFile | None = None
        self._file_path = file_path
        self._rotate_bytes = rotate_bytes
        self._keep = keep

    def _open(self) -> LogFile | None:
        """The log file, created on the first line (never-started children leave none)."""
        if self._file is None and self._file_path is not None:
            self._file_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = LogFile(
                self._file_path.name,
                str(self._file_path.parent),
                rotateLength=self._rotate_bytes,
                maxRotatedFiles=self._keep or None,
            )
        return self._file

    @property
    def first_available(self) -> int:
        return self._next - len(self._lines)

    @property
    def end(self) -> int:
        """Offset the next line will get."""
        return self._next

    def append(self, data: bytes) -> None:
        """Add raw child output; incomplete trailing text waits for its newline."""
        log_file = self._open()
        if log_file is not None:
            log_file.write(data.decode("utf-8", "replace"))
            log_file.flush()
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        while len(self._partial) > MAX_LINE:
            complete.append(self._partial[:MAX_LINE])
            self._partial = self._partial[MAX_LINE:]
        for raw in complete:
            self._lines.append(raw.rstrip(b"\r").decode("utf-8", "replace"))
            self._next += 1

    def note(self, text: str) -> None:
        """A supervisor line (start, exit, restart) in the child's log."""
        self.flush_partial()
        self.append(f"[supervisor] {text}\n".encode())

    def flush_partial(self) -> None:
        """Commit an unterminated last line (on exit)."""
        if self._partial:
            self.append(b"\n")

    def read(self, offset: int | None = None, limit: int = 200) -> LogPage:
        """Lines from ``offset`` (clamped to what the ring still has); ``None`` or a
        negative offset means the last ``limit`` lines."""
        limit = max(0, limit)
        first = self.first_available
        if offset is None or offset < 0:
            offset = max(first, self._next - limit)
        offset = min(max(offset, first), self._next)
        start = offset - first
        lines = [self._lines[i] for i in range(start, min(start + limit, len(self._lines)))]
        return LogPage(offset, lines, offset + len(lines), first)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._file_path = None

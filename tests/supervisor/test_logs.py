"""Per-child log ring buffer: stable offsets, partial lines, eviction, rotated files."""

from __future__ import annotations

from pathlib import Path

from mortred_twisted.supervisor.logs import LogBuffer


def test_lines_get_stable_offsets_across_partial_writes() -> None:
    """A line split over two writes is one line; offsets count from 0."""
    buf = LogBuffer()
    buf.append(b"one\ntw")
    buf.append(b"o\nthree\n")
    page = buf.read(0, 10)
    assert page.lines == ["one", "two", "three"] and page.next_offset == 3


def test_follow_from_next_offset() -> None:
    """Reading from next_offset returns only new lines (log --follow)."""
    buf = LogBuffer()
    buf.append(b"a\nb\n")
    page = buf.read(0, 10)
    buf.append(b"c\n")
    assert buf.read(page.next_offset, 10).lines == ["c"]
    assert buf.read(buf.end, 10).lines == []


def test_ring_evicts_oldest_and_clamps_offset() -> None:
    """With capacity 3, offset 0 is clamped to the oldest kept line."""
    buf = LogBuffer(capacity=3)
    buf.append(b"1\n2\n3\n4\n5\n")
    page = buf.read(0, 10)
    assert page.offset == 2 and page.lines == ["3", "4", "5"] and page.first_available == 2


def test_default_is_tail() -> None:
    """No offset means the last `limit` lines."""
    buf = LogBuffer()
    buf.append(b"".join(b"%d\n" % i for i in range(10)))
    assert buf.read(None, 2).lines == ["8", "9"]


def test_file_rotation(tmp_path: Path) -> None:
    """Output is teed to <id>.log and rotated by size, keeping `keep` old files."""
    buf = LogBuffer(file_path=tmp_path / "X.log", rotate_bytes=100, keep=2)
    for _ in range(10):
        buf.append(b"x" * 60 + b"\n")
    buf.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "X.log" in names and "X.log.1" in names and "X.log.3" not in names

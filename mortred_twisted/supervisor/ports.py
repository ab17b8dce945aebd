"""Who holds a TCP port: a bind test, and the listening socket's owner (Linux ``/proc``).

Used by the supervisor before it spawns a child on a port and at start (leftovers
of an earlier run). Blocking but cheap (a bind, a few small ``/proc`` reads); called
from the reactor thread only at a start.

* :func:`port_free` tries to bind ``host:port`` the way the child will
  (``SO_REUSEADDR``, as Twisted does), and closes at once.
* :func:`listeners` finds the processes owning a listening socket on ``port``:
  ``/proc/net/tcp`` and ``tcp6`` give the socket's inode, the ``/proc/<pid>/fd``
  links name it. Only processes this user may inspect are seen (another user's are
  not: the answer is then empty and the port is "held by a process not visible").

The parsing (:func:`listening_inodes`) is pure and tested on text.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: ``st`` of a listening socket in ``/proc/net/tcp``.
_LISTEN = "0A"


@dataclass(frozen=True)
class Holder:
    """A process that owns a listening socket: its pid and command line."""

    pid: int
    argv: tuple[str, ...]

    def describe(self) -> str:
        command = " ".join(self.argv) if self.argv else "?"
        if len(command) > 300:
            command = command[:297] + "..."
        return f"pid {self.pid}: {command}"


def port_free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound now (a zero port always can); an address
    that cannot be bound for another reason than "in use" counts as free (the child
    will report it)."""
    if not port:
        return True
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)  # a socket bound but not listening does not conflict on Linux
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


def listening_inodes(table: str, port: int) -> set[int]:
    """Inodes of the sockets listening on ``port`` in one ``/proc/net/tcp*`` text."""
    found: set[int] = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3], fields[9]
        _, _, hex_port = local.rpartition(":")
        try:
            if state == _LISTEN and int(hex_port, 16) == port and int(inode):
                found.add(int(inode))
        except ValueError:
            continue
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def _argv(pid: int, proc: Path) -> tuple[str, ...]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)


def _pids(proc: Path) -> Iterable[int]:
    try:
        names = os.listdir(proc)
    except OSError:
        return ()
    return (int(n) for n in names if n.isdigit())


def listeners(port: int, proc: Path = Path("/proc")) -> list[Holder]:
    """The processes (visible to this user) that own a socket listening on ``port``."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        inodes |= listening_inodes(_read(proc / "net" / table), port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    holders: list[Holder] = []
    for pid in _pids(proc):
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target in wanted:
                holders.append(Holder(pid, _argv(pid, proc)))
                break
    return holders


def describe_holders(holders: list[Holder]) -> str:
    """``"pid N: command"`` of each holder, or what to say when none is visible."""
    if not holders:
        return "a process not visible to this user"
    return "; ".join(h.describe() for h in holders)

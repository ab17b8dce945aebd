"""Secrets from files: ``<NAME>_FILE`` for every secret environment variable.

Docker and Kubernetes hand secrets to a container as files (``/run/secrets/<name>``,
a mounted Secret volume). For each variable of :data:`SECRET_VARIABLES`,
``<NAME>_FILE=/path`` means "``<NAME>`` is the content of that file": the
entry points (the three twistd plugins) resolve them once at start, before anything
reads the environment, so every reader of ``<NAME>`` (the control plane's tokens,
a model's ``MORTRED_AUTH_TOKEN``, ``MORTRED_REDIS_URL`` with its password, the S3
credentials) sees the value and none needs to know about files.

Rules (each broken one is a :class:`~mortred_twisted.config.errors.ConfigErrors`
problem; all are reported together and the process does not start):

* ``<NAME>`` and ``<NAME>_FILE`` both set (non-empty): refused, never guessed;
* an empty variable counts as not set (as an empty token already does);
* the file must be a regular file (a symlink to one is fine: Kubernetes mounts
  Secrets that way) that this process can read, of at most :data:`MAX_SECRET_BYTES`
  bytes (a FIFO or ``/dev/zero`` would block or never end), UTF-8, one line;
  line endings at its end are dropped (``echo token > file`` writes one), and what
  remains must not be empty (an empty token would mean "no token": fail closed).

After resolution ``<NAME>_FILE`` is removed from the environment, so child processes
(which the supervisor gives exactly the tokens meant for them) never see both.

Pure but for reading the named files; no reactor, no logging. The value is never
part of a problem's text (only the variable and the path are).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, MutableMapping

from mortred_twisted.config.errors import ConfigErrors

#: Variables that may come from a file as ``<NAME>_FILE`` (the code reads them
#: from the environment: tap/supervisor.py, tap/gateway.py, config/server.py's
#: ``MORTRED_<KEY>`` overrides, config/s3.py).
SECRET_VARIABLES: tuple[str, ...] = (
    "MORTRED_API_TOKEN",
    "MORTRED_GATEWAY_AUTH_TOKEN",
    "MORTRED_INTERNAL_TOKEN",
    "MORTRED_METRICS_TOKEN",
    "MORTRED_AUTH_TOKEN",
    "MORTRED_WEBHOOK_SECRET",
    "MORTRED_REDIS_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)
SUFFIX = "_FILE"
#: larger secret files are refused (a token is tens of bytes)
MAX_SECRET_BYTES = 64 * 1024
SOURCE = "environment (*_FILE secrets)"


class SecretFileError(Exception):
    """Why one secret file cannot be used (its text names no secret value)."""


def read_secret_file(path: str, limit: int = MAX_SECRET_BYTES) -> str:
    """The secret in ``path``: one UTF-8 line, trailing line endings dropped.

    Raises :class:`SecretFileError`. Opens without blocking and checks, on the open
    descriptor, that it is a regular file before reading (at most ``limit`` + 1 bytes).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise SecretFileError("no such file") from None
    except PermissionError:
        raise SecretFileError("permission denied (not readable by this user)") from None
    except OSError as exc:
        raise SecretFileError(exc.strerror or type(exc).__name__) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SecretFileError("not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:  # EISDIR and the like, on read
        raise SecretFileError(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    if size > limit:
        raise SecretFileError(f"larger than {limit} bytes")
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError("not UTF-8 text") from None
    text = text.rstrip("\r\n")
    if not text:
        raise SecretFileError("empty")
    if "\n" in text or "\r" in text:
        raise SecretFileError("more than one line")
    if "\0" in text:
        raise SecretFileError("holds a NUL byte")
    return text


def resolve_secret_files(
    env: Mapping[str, str],
    *,
    read: Callable[[str], str] = read_secret_file,
    names: tuple[str, ...] = SECRET_VARIABLES,
) -> dict[str, str]:
    """A copy of ``env`` with every ``<NAME>_FILE`` replaced by ``<NAME>``.

    Raises :class:`ConfigErrors` listing every problem (see the module). Variables
    outside ``names`` are copied unchanged, ``_FILE`` or not.
    """
    result = dict(env)
    problems: list[str] = []
    for name in names:
        file_var = name + SUFFIX
        path = result.pop(file_var, "")
        if not path:
            continue
        if result.get(name):
            problems.append(
                f"{name} and {file_var} are both set: set one of them (the value or the "
                "file that holds it)"
            )
            continue
        try:
            result[name] = read(path)
        except SecretFileError as exc:
            problems.append(f"{file_var}={path}: {exc}")
    if problems:
        raise ConfigErrors(SOURCE, problems)
    return result


def apply_secret_files(environ: MutableMapping[str, str]) -> None:
    """Resolve ``environ`` in place (``os.environ`` at an entry point): all or nothing;
    raises :class:`ConfigErrors` and leaves ``environ`` unchanged on any problem."""
    resolved = resolve_secret_files(environ)
    for key in [k for k in environ if k not in resolved]:
        del environ[key]
    for key, value in resolved.items():
        if environ.get(key) != value:
            environ[key] = value

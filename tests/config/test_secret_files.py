"""``<NAME>_FILE`` secrets (config/secret_files.py): values from files, and every way a
file or a pair of variables can be wrong."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from mortred_twisted.config.errors import ConfigErrors
from mortred_twisted.config.secret_files import (
    MAX_SECRET_BYTES,
    SECRET_VARIABLES,
    SecretFileError,
    apply_secret_files,
    read_secret_file,
    resolve_secret_files,
)
from mortred_twisted.config.server import SERVER_KEYS

SECRET = "s3cret-token-value"


def _file(tmp_path: Path, content: bytes, name: str = "token") -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


def _problems(env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        resolve_secret_files(env)
    return info.value.problems


def test_value_from_file_line_ending_dropped_and_file_variable_removed(tmp_path: Path) -> None:
    env = {
        "MORTRED_GATEWAY_AUTH_TOKEN_FILE": _file(tmp_path, f"{SECRET}\n".encode(), "gw"),
        "MORTRED_API_TOKEN_FILE": _file(tmp_path, f"{SECRET}-api\r\n".encode(), "api"),
        "PATH": "/usr/bin",
    }
    resolved = resolve_secret_files(env)
    assert resolved == {
        "MORTRED_GATEWAY_AUTH_TOKEN": SECRET,
        "MORTRED_API_TOKEN": f"{SECRET}-api",
        "PATH": "/usr/bin",
    }
    assert "MORTRED_GATEWAY_AUTH_TOKEN_FILE" in env  # the input is not modified


def test_every_secret_variable_may_come_from_a_file(tmp_path: Path) -> None:
    path = _file(tmp_path, SECRET.encode())
    resolved = resolve_secret_files({f"{name}_FILE": path for name in SECRET_VARIABLES})
    assert resolved == dict.fromkeys(SECRET_VARIABLES, SECRET)


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    # Kubernetes mounts a Secret's keys as symlinks (..data/<key>)
    target = _file(tmp_path, SECRET.encode(), "real")
    (tmp_path / "link").symlink_to(target)
    assert read_secret_file(str(tmp_path / "link")) == SECRET


def test_both_set_is_refused_and_the_value_is_never_in_the_message(tmp_path: Path) -> None:
    env = {
        "MORTRED_INTERNAL_TOKEN": "inline-" + SECRET,
        "MORTRED_INTERNAL_TOKEN_FILE": _file(tmp_path, SECRET.encode()),
    }
    problems = _problems(env)
    assert len(problems) == 1
    assert "MORTRED_INTERNAL_TOKEN and MORTRED_INTERNAL_TOKEN_FILE are both set" in problems[0]
    assert SECRET not in problems[0]


def test_empty_variables_count_as_not_set(tmp_path: Path) -> None:
    path = _file(tmp_path, SECRET.encode())
    # an empty value beside a file: the file wins (compose's ${VAR:-} gives "")
    assert resolve_secret_files({"MORTRED_AUTH_TOKEN": "", "MORTRED_AUTH_TOKEN_FILE": path}) == {
        "MORTRED_AUTH_TOKEN": SECRET
    }
    # an empty _FILE: nothing to read, and it is dropped; the value stays
    assert resolve_secret_files({"MORTRED_AUTH_TOKEN": SECRET, "MORTRED_AUTH_TOKEN_FILE": ""}) == {
        "MORTRED_AUTH_TOKEN": SECRET
    }


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty"),
        (b"\n", "empty"),
        (b"\r\n\r\n", "empty"),
        (b"one\ntwo\n", "more than one line"),
        (b"one\rtwo", "more than one line"),
        (b"tok\x00en", "holds a NUL byte"),
        (b"\xff\xfe token", "not UTF-8 text"),
        (b"x" * (MAX_SECRET_BYTES + 1), f"larger than {MAX_SECRET_BYTES} bytes"),
    ],
)
def test_bad_contents_are_refused(tmp_path: Path, content: bytes, reason: str) -> None:
    path = _file(tmp_path, content)
    assert _problems({"MORTRED_METRICS_TOKEN_FILE": path}) == [
        f"MORTRED_METRICS_TOKEN_FILE={path}: {reason}"
    ]


def test_the_largest_allowed_file_is_read(tmp_path: Path) -> None:
    path = _file(tmp_path, b"y" * (MAX_SECRET_BYTES - 1) + b"\n")
    assert read_secret_file(path) == "y" * (MAX_SECRET_BYTES - 1)


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "absent")
    assert _problems({"MORTRED_API_TOKEN_FILE": path}) == [
        f"MORTRED_API_TOKEN_FILE={path}: no such file"
    ]


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_not_a_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    if kind == "directory":
        path = str(tmp_path)
    elif kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)  # no writer: a blocking open would never return
    else:
        path = "/dev/zero"  # a read would never end
    outcome: list[object] = []
    reader = threading.Thread(target=lambda: outcome.append(_try_read(path)), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert not reader.is_alive(), f"reading {path} blocked"
    assert outcome == ["not a regular file"]


def _try_read(path: str) -> str:
    try:
        return read_secret_file(path)
    except SecretFileError as exc:
        return str(exc)


def test_unreadable_file_is_refused(tmp_path: Path) -> None:
    # a folder anyone may enter (pytest's tmp folders are private to their owner), a
    # readable file beside the unreadable one: only the file's mode makes the difference
    folder = Path(tempfile.mkdtemp(prefix="mortred-secret-test-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        readable, closed = folder / "readable", folder / "closed"
        readable.write_text(SECRET)
        readable.chmod(0o644)
        closed.write_text(SECRET)
        closed.chmod(0o000)
        code = (
            "from mortred_twisted.config.secret_files import read_secret_file, SecretFileError\n"
            f"for path in ({str(readable)!r}, {str(closed)!r}):\n"
            "    try:\n"
            "        print(read_secret_file(path))\n"
            "    except SecretFileError as exc:\n"
            "        print(exc)\n"
        )
        # root reads any file: as root, check as an unprivileged user (nobody), with an
        # interpreter that user may run (the venv's may live under /root)
        user: dict[str, int] = {}
        python = sys.executable
        if os.geteuid() == 0:
            user = {"user": 65534, "group": 65534}
            python = "/usr/bin/python3"
            if not os.access(python, os.X_OK):
                pytest.skip("running as root without /usr/bin/python3 to drop privileges with")
        pythonpath = str(Path(__file__).resolve().parents[2])
        done = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": pythonpath},
            cwd="/",
            **user,  # type: ignore[arg-type]
        )
        assert done.stdout.splitlines() == [
            SECRET,
            "permission denied (not readable by this user)",
        ], done.stderr
    finally:
        shutil.rmtree(folder)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    env = {
        "MORTRED_API_TOKEN_FILE": str(tmp_path / "absent"),
        "MORTRED_GATEWAY_AUTH_TOKEN": "x",
        "MORTRED_GATEWAY_AUTH_TOKEN_FILE": _file(tmp_path, b"y"),
        "AWS_SECRET_ACCESS_KEY_FILE": _file(tmp_path, b"", "empty"),
    }
    problems = _problems(env)
    assert len(problems) == 3
    assert [p.split("=")[0].split(" ")[0] for p in problems] == [
        "MORTRED_API_TOKEN_FILE",
        "MORTRED_GATEWAY_AUTH_TOKEN",
        "AWS_SECRET_ACCESS_KEY_FILE",
    ]


def test_other_file_variables_are_left_alone(tmp_path: Path) -> None:
    # MORTRED_REDIS_CA_FILE is a server key (a path), not a secret file
    env = {"MORTRED_REDIS_CA_FILE": "/etc/ca.pem", "SOME_TOKEN_FILE": "/nowhere"}
    assert resolve_secret_files(env) == env


def test_no_secret_file_variable_is_a_server_key() -> None:
    # MORTRED_<KEY> sets any [server] key: a <NAME>_FILE must never be one of them
    server_env = {f"MORTRED_{key.upper()}" for key in SERVER_KEYS}
    clashes = {f"{name}_FILE" for name in SECRET_VARIABLES} & server_env
    assert not clashes


def test_apply_is_all_or_nothing(tmp_path: Path) -> None:
    good = _file(tmp_path, SECRET.encode())
    environ = {
        "MORTRED_API_TOKEN_FILE": good,
        "MORTRED_AUTH_TOKEN_FILE": str(tmp_path / "absent"),
    }
    before = dict(environ)
    with pytest.raises(ConfigErrors):
        apply_secret_files(environ)
    assert environ == before
    del environ["MORTRED_AUTH_TOKEN_FILE"]
    apply_secret_files(environ)
    assert environ == {"MORTRED_API_TOKEN": SECRET}


def test_entry_points_resolve_files_before_reading_the_environment(tmp_path: Path) -> None:
    """The model-server plugin reads its token from MORTRED_AUTH_TOKEN_FILE, and a bad
    file stops it with the problem on stderr (exit 2), in a process of its own."""
    server = tmp_path / "server.toml"
    server.write_text(
        '[server]\nid = "T"\nhost = "127.0.0.1"\nport = 18999\nserver_uri = "/t"\n'
        '[model]\ntype = "fake"\n'
    )
    code = (
        "import os\n"
        "from mortred_twisted.tap import model_server\n"
        "o = model_server.Options(); o.parseOptions(['--config', os.environ['CFG']])\n"
        "svc = model_server.makeService(o)\n"
        "cfgs = [s.runtime.config for s in svc if hasattr(s, 'runtime')]\n"
        "print(cfgs[0].auth_token, 'MORTRED_AUTH_TOKEN_FILE' in os.environ)\n"
    )
    pythonpath = str(Path(__file__).resolve().parents[2])
    base = {**os.environ, "PYTHONPATH": pythonpath, "CFG": str(server)}
    base.pop("MORTRED_AUTH_TOKEN", None)
    token = _file(tmp_path, f"{SECRET}\n".encode())
    ok = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "MORTRED_AUTH_TOKEN_FILE": token},
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == [SECRET, "False"]
    bad = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "MORTRED_AUTH_TOKEN_FILE": str(tmp_path / "absent")},
    )
    assert bad.returncode == 2
    assert f"MORTRED_AUTH_TOKEN_FILE={tmp_path / 'absent'}: no such file" in bad.stderr

"""Memory of result-file downloads: RSS of the model port and the gateway while slow
clients download a large result file, and after they leave (issue 37 item 1).

    .venv/bin/python bench/file_memory.py [--mb 100] [--readers 16] [--root DIR]

Starts a model server (an SDK model, :mod:`big_result_model`, whose job writes one
file of ``--mb`` MiB to the memory store's result folder) and a gateway in front of
it, each a ``twistd -n`` process of the checkout at ``--root`` (default: this one;
give a ``git worktree`` of another commit to compare, e.g. ``/tmp/base``). Then:

1. one download through the gateway, read whole (warm-up), then the baseline RSS
   (``VmRSS`` of ``/proc/<pid>/status``) of both processes;
2. ``--readers`` clients, each with a 4 KiB receive buffer, ask the gateway for the
   file, read 1 MiB and stop reading; the RSS is taken once neither process grew for
   a second (at most ``--settle`` s);
3. they close; RSS again once it stopped shrinking;
4. the same with the clients on the model port directly (``--rounds`` times both);
5. throughput of one whole download, direct and through the gateway, against
   ``cat`` of a file of the same size (page cache warm) to ``/dev/null``.

Prints a Markdown table (MiB). Nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKEN = "bench-gateway-token"
INTERNAL = "bench-internal-token"
MODEL = "BIG"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def process(root: Path, args: list[str], env: dict[str, str], marker: str) -> Iterator[int]:
    """``twistd -n <args>`` of the checkout at ``root``; its pid once ``marker`` shows."""
    plugins = Path(tempfile.mkdtemp(prefix="bench-plugins-")) / "twisted" / "plugins"
    plugins.mkdir(parents=True)
    (plugins / "mortred_plugins.py").write_bytes(
        (root / "twisted_plugins" / "mortred_plugins.py").read_bytes()
    )
    child_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MORTRED_")},
        "PYTHONPATH": os.pathsep.join([str(root), str(HERE), str(plugins.parents[1])]),
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    cmd = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
           "-n", "--pidfile=", "--logfile=-", *args]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=str(root), env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                seen.set()
        seen.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not seen.wait(120) or proc.poll() is not None:
            raise RuntimeError("did not start:\n" + "".join(lines[-30:]))
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def request(port: int, method: str, path: str, token: str, body: bytes = b"") -> tuple[int, bytes]:
    """One blocking request (Connection: close); (status, body)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
        s.sendall(head.encode() + body)
        data = b"".join(iter(lambda: s.recv(1 << 20), b""))
    head_end = data.index(b"\r\n\r\n")
    return int(data.split(b" ", 2)[1]), data[head_end + 4 :]


def download(port: int, path: str, token: str) -> tuple[int, float]:
    """Read a whole answer (Connection: close); (body bytes, seconds)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                  f"Authorization: Bearer {token}\r\n\r\n".encode())  # fmt: skip
        started = time.perf_counter()
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(65536)
        total = len(head) - head.index(b"\r\n\r\n") - 4
        buf = bytearray(1 << 20)
        while n := s.recv_into(buf):
            total += n
        return total, time.perf_counter() - started


def slow_reader(port: int, path: str, token: str, take: int) -> socket.socket:
    """A client with a 4 KiB receive buffer that reads ``take`` bytes and stops."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n"
              f"Authorization: Bearer {token}\r\n\r\n".encode())  # fmt: skip
    got = 0
    while got < take:
        chunk = s.recv(min(65536, take - got))
        if not chunk:
            break
        got += len(chunk)
    assert got == take, got
    return s


def settled(pids: list[int], limit_s: float) -> list[float]:
    """RSS of ``pids`` once none changed by more than 1 MiB for a second."""
    last = [rss_mib(p) for p in pids]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = [rss_mib(p) for p in pids]
        if all(abs(a - b) < 1.0 for a, b in zip(now, last, strict=True)):
            return now
        last = now
    return last


def server_toml(port: int) -> str:
    return f"""[server]
id = "{MODEL}"
category = "sdk"
host = "127.0.0.1"
port = {port}
server_uri = "/big/infer"
worker_nums = 1
async_enabled = true
async_job_ttl = 3600000
peer_resp_timeout = 600

[model]
type = "big_result_model:Big"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--root", type=Path, default=HERE.parent)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="run both scenarios this many times (a leak grows, a "
                        "reused allocation does not)")  # fmt: skip
    args = parser.parse_args()
    root = args.root.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="bench-files-"))
    catalog = tmp / "conf" / "server"
    catalog.mkdir(parents=True)
    model_port, gw_port = free_port(), free_port()
    (catalog / "big.toml").write_text(server_toml(model_port))
    (tmp / "conf" / "mortred.toml").write_text(
        f'[supervisor]\ncatalog_dir = "{catalog}"\n'
        f'[gateway]\nport = {gw_port}\napi_keys = "{tmp / "none.toml"}"\n'
    )
    model_env = {"MORTRED_AUTH_TOKEN": INTERNAL, "MORTRED_LISTEN_HOST": "127.0.0.1",
                 "MORTRED_LISTEN_PORT": str(model_port)}  # fmt: skip
    gw_env = {"MORTRED_GATEWAY_AUTH_TOKEN": TOKEN, "MORTRED_INTERNAL_TOKEN": INTERNAL}
    model_args = ["mortred-model", "--config", str(catalog / "big.toml")]
    gw_args = ["mortred-gateway", "--config", str(tmp / "conf" / "mortred.toml")]
    with (
        process(root, model_args, model_env, "listening on") as model_pid,
        process(root, gw_args, gw_env, "HTTPServerFactory starting on") as gw_pid,
    ):
        for _ in range(600):
            if request(model_port, "GET", "/ready", INTERNAL)[0] == 200:
                break
            time.sleep(0.2)
        jobs = f"/v1/models/{MODEL}/jobs"
        code, body = request(
            gw_port, "POST", jobs, TOKEN, json.dumps({"params": {"mb": args.mb}}).encode()
        )
        assert code == 202, body
        job = json.loads(body)["job_id"]
        code, body = request(gw_port, "GET", f"{jobs}/{job}/wait?timeout=120000", TOKEN)
        assert code == 200 and json.loads(body)["state"] == "done", body
        code, body = request(gw_port, "GET", f"{jobs}/{job}/result", TOKEN)
        url = json.loads(body)["data"]["blob"]["url"]
        name = url.rsplit("/", 1)[1]
        via_gw = f"{jobs}/{job}/files/{name}"
        direct = f"/jobs/{job}/files/{name}"
        size, _ = download(gw_port, via_gw, TOKEN)
        assert size == args.mb << 20, size
        rows = []
        pids = [model_pid, gw_pid]
        scenarios = (
            ("through the gateway", gw_port, via_gw, TOKEN),
            ("on the model port", model_port, direct, INTERNAL),
        )
        for label, port, path, token in scenarios * args.rounds:
            base = settled(pids, args.settle)
            readers = [slow_reader(port, path, token, 1 << 20) for _ in range(args.readers)]
            during = settled(pids, args.settle)
            for s in readers:
                s.close()
            after = settled(pids, args.settle)
            rows.append((label, base, during, after))
        cat_file = tmp / "same-size"
        with open(cat_file, "wb") as f:
            f.write(os.urandom(args.mb << 20))
        subprocess.run(["cat", str(cat_file)], stdout=subprocess.DEVNULL, check=True)
        started = time.perf_counter()
        subprocess.run(["cat", str(cat_file)], stdout=subprocess.DEVNULL, check=True)
        cat_s = time.perf_counter() - started
        got, direct_s = download(model_port, direct, INTERNAL)
        assert got == args.mb << 20, got
        got, gw_s = download(gw_port, via_gw, TOKEN)
        assert got == args.mb << 20, got
    mib = args.mb
    print(f"root {root}: {args.readers} readers (4 KiB receive buffer, 1 MiB read, then "
          f"paused) of a {mib} MiB result file")  # fmt: skip
    print("| clients | model RSS before | during (growth) | after they left |"
          " gateway RSS before | during (growth) | after they left |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label, base, during, after in rows:
        cells = []
        for i in range(2):
            cells += [f"{base[i]:.0f}", f"{during[i]:.0f} (+{during[i] - base[i]:.0f})",
                      f"{after[i]:.0f} (+{after[i] - base[i]:.0f})"]  # fmt: skip
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"one download: model port {mib / direct_s:.0f} MiB/s, gateway {mib / gw_s:.0f} "
          f"MiB/s, cat {mib / cat_s:.0f} MiB/s")  # fmt: skip


if __name__ == "__main__":
    main()

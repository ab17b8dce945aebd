"""``mortredctl``: the operator's command line for a mortred control plane.

Talks HTTP to the supervisor (``--addr``/``MORTREDCTL_ADDR``, default
``http://127.0.0.1:8787``, token ``--token``/``MORTREDCTL_TOKEN``); inference and job
commands go through the supervisor's try-it proxy, or through the gateway when
``--gateway``/``MORTREDCTL_GATEWAY`` is set (token ``--gateway-token``/
``MORTREDCTL_GATEWAY_TOKEN``). A job URL may be absolute, a gateway path
(``/v1/models/…``) or a supervisor path (``/api/v1/jobs/…``).

Exit codes: 0 ok; 1 the request failed (connection error or HTTP status >= 400,
or a job that ended ``failed``/``timeout``); 2 usage error.

Plain stdlib on purpose: a CLI has no use for a reactor.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, TextIO
from urllib.parse import urlencode

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TERMINAL = ("done", "failed", "timeout", "cancelled")


class RequestFailed(Exception):
    """An HTTP error status or a connection failure (exit code 1)."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Client:
    """Blocking JSON over HTTP with a bearer token."""

    def __init__(self, base: str, token: str, timeout: float = 600.0) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.last_headers: Any = None

    def url(self, path: str) -> str:
        return path if "://" in path else self.base + path

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = None,
        extra_headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None
        headers = {"Accept": "application/json", **(extra_headers or {})}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json; charset=utf-8"
        req = urllib.request.Request(self.url(path), data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                self.last_headers = resp.headers
                return resp.status, _decode(resp.read(), resp.headers.get("Content-Type", ""))
        except urllib.error.HTTPError as e:
            doc = _decode(e.read(), e.headers.get("Content-Type", "") if e.headers else "")
            message = doc.get("error") or doc.get("msg") if isinstance(doc, dict) else doc
            raise RequestFailed(f"HTTP {e.code}: {message}", e.code, doc) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RequestFailed(f"cannot reach {self.url(path)}: {reason}") from None

    def events(self, path: str, last_event_id: str | None = None) -> Iterator[SseEvent]:
        """Follow a ``text/event-stream``: yields each event as it arrives."""
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        req = urllib.request.Request(self.url(path), method="GET", headers=headers)
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            doc = _decode(e.read(), e.headers.get("Content-Type", "") if e.headers else "")
            message = doc.get("error") if isinstance(doc, dict) else doc
            raise RequestFailed(f"HTTP {e.code}: {message}", e.code, doc) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RequestFailed(f"cannot reach {self.url(path)}: {reason}") from None
        with resp:
            yield from parse_sse(resp)


class SseEvent(NamedTuple):
    id: str | None
    event: str
    data: str


def parse_sse(lines: Iterable[bytes]) -> Iterator[SseEvent]:
    """The WHATWG event-stream grammar, as far as a CLI needs it (comments skipped)."""
    event_id: str | None = None
    name, data = "message", []
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield SseEvent(event_id, name, "\n".join(data))
            name, data = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
        elif field == "id":
            event_id = value


def _decode(raw: bytes, content_type: str) -> Any:
    if "json" in content_type or raw[:1] in (b"{", b"["):
        try:
            return json.loads(raw)
        except ValueError:
            pass
    return raw.decode("utf-8", "replace")


def _print_json(doc: Any, out: TextIO) -> None:
    out.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


# -- commands -----------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    _, doc = args.sup.request("GET", "/api/v1/status")
    if args.json:
        _print_json(doc, out)
        return EXIT_OK
    rows = [("ID", "KIND", "STATE", "READY", "PID", "RESTARTS", "LAST EXIT / ERROR")]
    # A model with replicas: its row, then one row per replica (``<id>@<n>``).
    flat = [item for g in doc["servers"] for item in (g, *g.get("replicas", ()))]
    for s in flat:
        last = s.get("error") or (s.get("last_exit") or {}).get("text") or ""
        rows.append(
            (
                s["id"], s.get("kind", ""), s["state"], "yes" if s["ready"] else "no",
                str(s.get("pid") or "-"), str(s["restart_count"]), last,
            )
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    return EXIT_OK


def cmd_catalog(args: argparse.Namespace, out: TextIO) -> int:
    _, doc = args.sup.request("GET", "/api/v1/catalog")
    if args.json:
        _print_json(doc, out)
        return EXIT_OK
    for e in doc["servers"]:
        flags = "async" if e["async_enabled"] else "sync"
        state = "" if e.get("enabled", True) else " (disabled)"
        out.write(f"{e['id']:<16} {e['category']:<14} {flags:<5} :{e['port']:<6} "
                  f"{e['server_uri']}{state}\n")  # fmt: skip
    return EXIT_OK


def cmd_action(args: argparse.Namespace, out: TextIO) -> int:
    _, doc = args.sup.request("POST", f"/api/v1/servers/{args.id}/{args.command}")
    out.write(f"{args.id}: {args.command} requested (state: {doc.get('state')})\n")
    if not args.wait or args.command == "stop":
        if args.wait:
            return _wait_state(args, out, lambda s: s["state"] in ("stopped", "failed"))
        return EXIT_OK
    old_pid = doc.get("pid") if args.command == "restart" else None
    return _wait_state(args, out, lambda s: s["ready"] and (old_pid is None or s["pid"] != old_pid))


def _wait_state(args: argparse.Namespace, out: TextIO, ok: Any) -> int:
    deadline = time.monotonic() + args.wait_timeout
    while time.monotonic() < deadline:
        _, s = args.sup.request("GET", f"/api/v1/servers/{args.id}")
        if ok(s):
            out.write(f"{args.id}: {s['state']}{' ready' if s['ready'] else ''}\n")
            return EXIT_OK
        if s["state"] == "failed":
            out.write(f"{args.id}: failed: {s.get('error')}\n")
            return EXIT_FAILED
        time.sleep(0.5)
    out.write(f"{args.id}: still {s['state']} after {args.wait_timeout} s\n")
    return EXIT_FAILED


def cmd_logs(args: argparse.Namespace, out: TextIO) -> int:
    offset = args.offset
    while True:
        query = f"limit={args.limit}" + (f"&offset={offset}" if offset is not None else "")
        _, page = args.sup.request("GET", f"/api/v1/servers/{args.id}/logs?{query}")
        for line in page["lines"]:
            out.write(line + "\n")
        out.flush()
        offset = page["next_offset"]
        if not args.follow:
            return EXIT_OK
        if not page["lines"]:
            time.sleep(args.interval)


def _envelope(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.image:
        body["images"] = [base64.b64encode(Path(args.image).read_bytes()).decode()]
    else:
        body["images"] = [base64.b64encode(b"mortredctl").decode()]  # generative models
    if args.params:
        try:
            body["params"] = json.loads(args.params)
        except ValueError as e:
            raise UsageError(f"--params is not JSON: {e}") from None
    if args.req_id:
        body["req_id"] = args.req_id
    return body


def cmd_infer(args: argparse.Namespace, out: TextIO) -> int:
    body = _envelope(args)
    if args.gw is not None:
        _, doc = args.gw.request("POST", f"/v1/models/{args.id}/infer", body)
    else:
        _, doc = args.sup.request("POST", "/api/v1/infer", {"server_id": args.id, **body})
    _print_json(doc, out)
    return EXIT_OK


def cmd_jobs_submit(args: argparse.Namespace, out: TextIO) -> int:
    body = _envelope(args)
    if args.webhook:
        body["webhook"] = args.webhook
    if args.webhook_events:
        body["webhook_events_filter"] = args.webhook_events.split(",")
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    if args.gw is not None:
        _, doc = args.gw.request("POST", f"/v1/models/{args.id}/jobs", body, extra_headers=headers)
    else:
        _, doc = args.sup.request(
            "POST", "/api/v1/infer", {"server_id": args.id, "async": True, **body}
        )
    _print_json(doc, out)
    if args.wait:
        args.job_url = doc["poll_url"]
        if args.gw is not None and _is_gateway_path(args.job_url):
            return cmd_jobs_watch(args, out)
        return cmd_jobs_wait(args, out)
    return EXIT_OK


def _is_gateway_path(url: str) -> bool:
    path = url.split("://", 1)[-1]
    path = path[path.find("/") :] if "://" in url else url
    return path.startswith("/v1/")


def _gateway_job_url(args: argparse.Namespace) -> str:
    """A job URL as given, or ``/v1/models/<id>/jobs/<job>`` from a model id + job id."""
    if args.job.startswith("job_") and args.model:
        return f"/v1/models/{args.model}/jobs/{args.job}"
    return args.job


def cmd_jobs_get(args: argparse.Namespace, out: TextIO) -> int:
    url = _gateway_job_url(args)
    _, doc = _job_client(args, url).request("GET", _job_base(url))
    _print_json(doc, out)
    return EXIT_OK


def cmd_jobs_cancel(args: argparse.Namespace, out: TextIO) -> int:
    url = _gateway_job_url(args)
    code, doc = _job_client(args, url).request("DELETE", _job_base(url))
    if args.json:
        _print_json(doc, out)
    else:
        how = "cancel requested (running)" if code == 202 else doc.get("state", "?")
        out.write(f"{doc.get('job_id', url)}: {how}\n")
    return EXIT_OK


def cmd_jobs_list(args: argparse.Namespace, out: TextIO) -> int:
    if args.gw is None:
        raise UsageError("jobs list needs --gateway (or MORTREDCTL_GATEWAY)")
    query: dict[str, Any] = {"limit": args.limit}
    if args.state:
        query["state"] = args.state
    if args.cursor:
        query["cursor"] = args.cursor
    _, doc = args.gw.request("GET", f"/v1/models/{args.model}/jobs?{urlencode(query)}")
    if args.json:
        _print_json(doc, out)
        return EXIT_OK
    rows = [("JOB", "STATE", "PROGRESS", "ELAPSED MS", "QUEUE")]
    for j in doc["jobs"]:
        p = j.get("progress") or {}
        rows.append((j["job_id"], j["state"], f"{p['step']}/{p['total']}" if p else "",
                     str(j.get("elapsed_ms", "")), str(j.get("queue_position") or "")))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    if doc.get("next_cursor"):
        out.write(f"# more: --cursor {doc['next_cursor']}\n")
    return EXIT_OK


def _bar(progress: dict[str, Any] | None, width: int = 30) -> str:
    if not progress or not progress.get("total"):
        return ""
    done = int(width * progress["step"] / progress["total"])
    return f"[{'#' * done}{'.' * (width - done)}] {progress['step']}/{progress['total']}"


def cmd_jobs_watch(args: argparse.Namespace, out: TextIO) -> int:
    """Follow a job's event stream with a progress bar; the last status goes to stdout."""
    url = getattr(args, "job_url", None) or _gateway_job_url(args)
    client = _job_client(args, url)
    err = sys.stderr
    last: dict[str, Any] | None = None
    for ev in client.events(_job_base(url) + "/events"):
        try:
            doc = json.loads(ev.data)
        except ValueError:
            continue
        last = doc
        if not getattr(args, "quiet", False):
            line = f"{doc.get('job_id', '')}: {doc.get('state', ''):<9} {_bar(doc.get('progress'))}"
            err.write(f"\r{line}   ")
            err.flush()
        if doc.get("state") in TERMINAL:
            break
    if not getattr(args, "quiet", False):
        err.write("\n")
    if last is None:
        raise RequestFailed("the event stream ended before any event")
    _print_json(last, out)
    if last.get("state") not in TERMINAL:
        return EXIT_FAILED
    return EXIT_OK if last["state"] == "done" else EXIT_FAILED


def _job_client(args: argparse.Namespace, url: str) -> Client:
    path = url.split("://", 1)[-1]
    path = path[path.find("/") :] if "://" in url else url
    if path.startswith("/v1/"):
        if args.gw is None:
            raise UsageError("a gateway job URL needs --gateway (or MORTREDCTL_GATEWAY)")
        return args.gw
    return args.sup


def _job_base(url: str) -> str:
    for suffix in ("/wait", "/result"):
        if url.split("?")[0].endswith(suffix):
            return url.split("?")[0][: -len(suffix)]
    return url.split("?")[0]


def cmd_jobs_wait(args: argparse.Namespace, out: TextIO) -> int:
    client = _job_client(args, args.job_url)
    base = _job_base(args.job_url)
    started = time.monotonic()
    deadline = started + args.max_wait if args.max_wait else None
    err = sys.stderr
    while True:
        _, doc = client.request("GET", f"{base}/wait?timeout={args.step_ms}")
        progress = doc.get("progress") or {}
        step = f" step {progress.get('step')}/{progress.get('total')}" if progress else ""
        if not args.quiet:
            err.write(f"\r{doc['job_id']}: {doc['state']:<8} elapsed {doc.get('elapsed_ms', 0)} ms"
                      f"{step}   ")  # fmt: skip
            err.flush()
        if doc["state"] in TERMINAL:
            if not args.quiet:
                err.write("\n")
            _print_json(doc, out)
            return EXIT_OK if doc["state"] == "done" else EXIT_FAILED
        if deadline is not None and time.monotonic() > deadline:
            if not args.quiet:
                err.write("\n")
            _print_json(doc, out)
            return EXIT_FAILED


def cmd_jobs_result(args: argparse.Namespace, out: TextIO) -> int:
    client = _job_client(args, args.job_url)
    _, doc = client.request("GET", _job_base(args.job_url) + "/result")
    _print_json(doc, out)
    return EXIT_OK


def cmd_keys_new(args: argparse.Namespace, out: TextIO) -> int:
    key = "mk_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(key.encode()).hexdigest()
    out.write(f"# give this key to the client (shown once): {key}\n")
    out.write(
        f'[[keys]]\nname = "{args.name}"\nsha256 = "{digest}"\nscope = "{args.scope}"\n'
        f"enabled = true\nrate_limit_qps = {args.qps}\n"
    )
    return EXIT_OK


# -- parsing -------------------------------------------------------------------------------


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = _Parser(prog="mortredctl", description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default=env.get("MORTREDCTL_ADDR", "http://127.0.0.1:8787"),
                   help="supervisor URL (MORTREDCTL_ADDR)")  # fmt: skip
    p.add_argument("--token", default=env.get("MORTREDCTL_TOKEN", env.get("MORTRED_API_TOKEN", "")),
                   help="supervisor token (MORTREDCTL_TOKEN)")  # fmt: skip
    p.add_argument("--gateway", default=env.get("MORTREDCTL_GATEWAY"),
                   help="gateway URL for infer/jobs (MORTREDCTL_GATEWAY)")  # fmt: skip
    p.add_argument("--gateway-token", default=env.get("MORTREDCTL_GATEWAY_TOKEN", ""),
                   help="gateway token (MORTREDCTL_GATEWAY_TOKEN)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="raw JSON output")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("status", help="servers, states, readiness").set_defaults(fn=cmd_status)
    sub.add_parser("catalog", help="catalog entries").set_defaults(fn=cmd_catalog)
    for action in ("start", "stop", "restart"):
        a = sub.add_parser(action, help=f"{action} a server")
        a.add_argument("id")
        a.add_argument("--wait", action="store_true", help="wait until ready (or stopped)")
        a.add_argument("--wait-timeout", type=float, default=600)
        a.set_defaults(fn=cmd_action)
    lg = sub.add_parser("logs", help="a server's log")
    lg.add_argument("id")
    lg.add_argument("--follow", "-f", action="store_true")
    lg.add_argument("--offset", type=int, default=None)
    lg.add_argument("--limit", type=int, default=200)
    lg.add_argument("--interval", type=float, default=0.5)
    lg.set_defaults(fn=cmd_logs)

    def envelope_args(a: argparse.ArgumentParser) -> None:
        a.add_argument("id")
        a.add_argument("--image", help="image file (base64-encoded for you)")
        a.add_argument("--params", help="model params as JSON, e.g. '{\"timesteps\": 10}'")
        a.add_argument("--req-id")

    inf = sub.add_parser("infer", help="blocking inference")
    envelope_args(inf)
    inf.set_defaults(fn=cmd_infer)

    jobs = sub.add_parser("jobs", help="async jobs").add_subparsers(
        dest="jobs_command", required=True, parser_class=_Parser
    )
    js = jobs.add_parser("submit", help="submit a job (202)")
    envelope_args(js)
    js.add_argument("--wait", action="store_true", help="then follow it to the end")
    js.add_argument("--idempotency-key", help="safe retries: the same key replays the job")
    js.add_argument("--webhook", help="URL the server POSTs signed job events to")
    js.add_argument("--webhook-events", help="comma list of start,progress,completed")

    def wait_args(a: argparse.ArgumentParser) -> None:
        a.add_argument("--step-ms", type=int, default=1000, help="long-poll budget per call")
        a.add_argument("--max-wait", type=float, default=0, help="give up after N s (0: never)")
        a.add_argument("--quiet", "-q", action="store_true", help="no progress line")

    wait_args(js)
    js.set_defaults(fn=cmd_jobs_submit)
    jw = jobs.add_parser("wait", help="wait for a job, showing progress")
    jw.add_argument("job_url")
    wait_args(jw)
    jw.set_defaults(fn=cmd_jobs_wait)
    jr = jobs.add_parser("result", help="a done job's envelope")
    jr.add_argument("job_url")
    jr.set_defaults(fn=cmd_jobs_result)

    def job_ref(a: argparse.ArgumentParser) -> None:
        a.add_argument("job", help="a job URL, or a job id with --model")
        a.add_argument("--model", help="model id (with a bare job id; gateway paths)")

    jg = jobs.add_parser("get", help="a job's status")
    job_ref(jg)
    jg.set_defaults(fn=cmd_jobs_get)
    jc = jobs.add_parser("cancel", help="cancel a pending or running job")
    job_ref(jc)
    jc.set_defaults(fn=cmd_jobs_cancel)
    jt = jobs.add_parser("watch", help="follow a job's live events with a progress bar")
    job_ref(jt)
    jt.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    jt.set_defaults(fn=cmd_jobs_watch)
    jl = jobs.add_parser("list", help="your jobs on a model, newest first")
    jl.add_argument("model")
    jl.add_argument("--state", help="comma list, e.g. pending,running")
    jl.add_argument("--limit", type=int, default=50)
    jl.add_argument("--cursor")
    jl.set_defaults(fn=cmd_jobs_list)

    keys = sub.add_parser("keys", help="gateway API keys").add_subparsers(
        dest="keys_command", required=True, parser_class=_Parser
    )
    kn = keys.add_parser("new", help="print a new key and its api_keys.toml entry")
    kn.add_argument("--name", required=True)
    kn.add_argument("--scope", choices=("inference", "all"), default="inference")
    kn.add_argument("--qps", type=float, default=0)
    kn.set_defaults(fn=cmd_keys_new)
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run one command; returns (and, as a console script, exits with) its code."""
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    args.sup = Client(args.addr, args.token)
    args.gw = Client(args.gateway, args.gateway_token) if args.gateway else None
    try:
        code = args.fn(args, out)
    except UsageError as e:
        sys.stderr.write(f"mortredctl: {e}\n")
        code = EXIT_USAGE
    except RequestFailed as e:
        sys.stderr.write(f"mortredctl: {e}\n")
        if e.body is not None and args.json:
            _print_json(e.body, out)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        code = EXIT_FAILED
    if argv is None:
        raise SystemExit(code)
    return code


if __name__ == "__main__":
    main()

"""``mortredctl``: the operator's command line for a mortred control plane.

Talks HTTP to the supervisor (``--addr``/``MORTREDCTL_ADDR``, default
``http://127.0.0.1:8787``, token ``--token``/``MORTREDCTL_TOKEN``); inference and job
commands go through the supervisor's try-it proxy, or through the gateway when
``--gateway``/``MORTREDCTL_GATEWAY`` is set (token ``--gateway-token``/
``MORTREDCTL_GATEWAY_TOKEN``). A job URL may be absolute, a gateway path
(``/v1/models/…``) or a supervisor path (``/api/v1/jobs/…``).

Every request goes through :mod:`mortred_client` (the project's Python client): its
retries (GET and DELETE on connection errors and 429/502/503/504; a gateway submit
with its ``Idempotency-Key``, which it always sends), its event-stream reader (which
resumes a dropped stream with ``Last-Event-ID``) and its error classes.

Exit codes: 0 ok; 1 the request failed (connection error or HTTP status >= 400,
or a job that ended ``failed``/``timeout``/``cancelled``); 2 usage error.

Plain blocking calls on purpose: a CLI has no use for a reactor.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO
from urllib.parse import urlsplit

try:
    from mortred_client import Client, Job, JobStatus, MortredError, RetryPolicy
    from mortred_client.protocol import Call
    from mortred_client.retry import Safety
except ImportError:  # pragma: no cover - an install without the client
    sys.exit("mortredctl needs the Python client: pip install ./client (make install does both)")

from mortred_twisted.cli import model_commands

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: A CLI answers quickly when a server is down: three tries within 10 s.
CLI_RETRY = RetryPolicy(max_attempts=3, deadline=10.0)


class Supervisor:
    """The supervisor's REST API (``/api/v1/…``) on the client's transport."""

    def __init__(self, base: str, token: str) -> None:
        self.client = Client(base, token, front="supervisor", retry=CLI_RETRY, timeout=600.0)

    def request(self, method: str, path: str) -> Any:
        """The JSON answer of one request; :class:`MortredError` on failure."""
        safety = Safety.REPEATABLE if method in ("GET", "DELETE") else Safety.ONCE
        call = Call(method, path, headers=self.client.api.headers(), safety=safety)
        return self.client.call(call).json()


def _print_json(doc: Any, out: TextIO) -> None:
    out.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


# -- commands -----------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    doc = args.sup.request("GET", "/api/v1/status")
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
    for s in doc["servers"]:
        a = s.get("autoscale")
        if a:  # the autoscaler's last decision, and what it saw
            out.write(
                f"autoscale {s['id']}: {a['current']} -> {a['desired']} replicas "
                f"({a['reason']}; min {a['min_replicas']}, max {a['max_replicas']}, "
                f"backlog {a['backlog']}, in flight {a['inflight']}, waiting {a['waiting']}, "
                f"start-up {a['startup_s']} s, last cold start {a['cold_start_s']} s)\n"
            )
    return EXIT_OK


def cmd_catalog(args: argparse.Namespace, out: TextIO) -> int:
    doc = args.sup.request("GET", "/api/v1/catalog")
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
    doc = args.sup.request("POST", f"/api/v1/servers/{args.id}/{args.command}")
    out.write(f"{args.id}: {args.command} requested (state: {doc.get('state')})\n")
    if not args.wait or args.command == "stop":
        if args.wait:
            return _wait_state(
                args, out, lambda s: s["state"] in ("stopped", "failed", "start_failed")
            )
        return EXIT_OK
    old_pid = doc.get("pid") if args.command == "restart" else None
    return _wait_state(args, out, lambda s: s["ready"] and (old_pid is None or s["pid"] != old_pid))


def _wait_state(args: argparse.Namespace, out: TextIO, ok: Any) -> int:
    deadline = time.monotonic() + args.wait_timeout
    while time.monotonic() < deadline:
        s = args.sup.request("GET", f"/api/v1/servers/{args.id}")
        if ok(s):
            out.write(f"{args.id}: {s['state']}{' ready' if s['ready'] else ''}\n")
            return EXIT_OK
        if s["state"] in ("failed", "start_failed"):
            out.write(f"{args.id}: failed: {s.get('error')}\n")
            return EXIT_FAILED
        time.sleep(0.5)
    out.write(f"{args.id}: still {s['state']} after {args.wait_timeout} s\n")
    return EXIT_FAILED


def cmd_logs(args: argparse.Namespace, out: TextIO) -> int:
    offset = args.offset
    while True:
        query = f"limit={args.limit}" + (f"&offset={offset}" if offset is not None else "")
        page = args.sup.request("GET", f"/api/v1/servers/{args.id}/logs?{query}")
        for line in page["lines"]:
            out.write(line + "\n")
        out.flush()
        offset = page["next_offset"]
        if not args.follow:
            return EXIT_OK
        if not page["lines"]:
            time.sleep(args.interval)


def _images_params(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any] | None]:
    """The command line's image (a file, or a placeholder generative models ignore)
    and params."""
    images: list[Any] = [Path(args.image)] if args.image else [b"mortredctl"]
    params = None
    if args.params:
        try:
            params = json.loads(args.params)
        except ValueError as e:
            raise UsageError(f"--params is not JSON: {e}") from None
        if not isinstance(params, dict):
            raise UsageError("--params must be a JSON object")
    return images, params


def _model_client(args: argparse.Namespace, model: str) -> Client:
    """The client of one model: through the gateway when given, else the supervisor."""
    if args.gateway:
        return Client(args.gateway, args.gateway_token, model=model, retry=CLI_RETRY,
                      timeout=600.0)  # fmt: skip
    return Client(args.addr, args.token, model=model, front="supervisor", retry=CLI_RETRY,
                  timeout=600.0)  # fmt: skip


def _job(args: argparse.Namespace, ref: str, model: str | None = None) -> Job:
    """A job from a URL (absolute, gateway ``/v1/…`` or supervisor ``/api/v1/…``) or
    from a bare job id with ``--model``."""
    if ref.startswith("job_") and "/" not in ref:
        if not model:
            raise UsageError("a bare job id needs --model")
        return _model_client(args, model).job(ref)
    parts = urlsplit(ref)
    path = parts.path
    for suffix in ("/wait", "/result", "/events"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    if path.startswith("/v1/"):
        if not args.gateway and not parts.scheme:
            raise UsageError("a gateway job URL needs --gateway (or MORTREDCTL_GATEWAY)")
        base, token, front = args.gateway, args.gateway_token, "gateway"
    else:
        base, token, front = args.addr, args.token, "supervisor"
    if parts.scheme:
        base = f"{parts.scheme}://{parts.netloc}"
    client = Client(base, token, front=front, retry=CLI_RETRY, timeout=600.0)
    return client.job(path)


def cmd_infer(args: argparse.Namespace, out: TextIO) -> int:
    images, params = _images_params(args)
    result = _model_client(args, args.id).infer(images, params, req_id=args.req_id)
    _print_json(result.raw, out)
    return EXIT_OK


def cmd_jobs_submit(args: argparse.Namespace, out: TextIO) -> int:
    if args.inputs:  # inputs by name (a model declared with the SDK)
        job = model_commands.submit_with_inputs(_model_client(args, args.id), args)
    else:
        images, params = _images_params(args)
        job = _model_client(args, args.id).submit(
            images, params, req_id=args.req_id, webhook=args.webhook,
            webhook_events=args.webhook_events.split(",") if args.webhook_events else None,
            idempotency_key=args.idempotency_key,
        )  # fmt: skip
    _print_json(job.last.raw, out)
    if not args.wait:
        return EXIT_OK
    if args.gateway:
        return _watch(job, args, out)
    return _wait(job, args, out)


def cmd_jobs_get(args: argparse.Namespace, out: TextIO) -> int:
    _print_json(_job(args, args.job, args.model).status().raw, out)
    return EXIT_OK


def cmd_jobs_cancel(args: argparse.Namespace, out: TextIO) -> int:
    status = _job(args, args.job, args.model).cancel()
    if args.json:
        _print_json(status.raw, out)
    else:
        running = status.cancel_requested and not status.terminal
        out.write(f"{status.job_id}: {'cancel requested (running)' if running else status.state}\n")
    return EXIT_OK


def cmd_jobs_list(args: argparse.Namespace, out: TextIO) -> int:
    client = _model_client(args, args.model)
    if args.all:
        jobs, cursor = list(client.jobs(args.state, page_size=args.limit)), None
    else:
        page = client.list_jobs(args.state, args.limit, args.cursor)
        jobs, cursor = page.jobs, page.next_cursor
    if args.json:
        _print_json({"jobs": [j.raw for j in jobs], "next_cursor": cursor}, out)
        return EXIT_OK
    rows = [("JOB", "STATE", "PROGRESS", "ELAPSED MS", "QUEUE")]
    for j in jobs:
        p = j.progress
        rows.append((j.job_id, j.state, f"{p.step}/{p.total}" if p else "",
                     str(j.elapsed_ms if j.elapsed_ms is not None else ""),
                     str(j.queue_position or "")))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    if cursor:
        out.write(f"# more: --cursor {cursor}\n")
    return EXIT_OK


def cmd_queue(args: argparse.Namespace, out: TextIO) -> int:
    """A model's queue (``GET /v1/models/<id>/queue``): totals, then one row per
    caller (every caller for an ``all``-scope key, else your own)."""
    doc = _model_client(args, args.model).queue()
    if args.json:
        _print_json(doc, out)
        return EXIT_OK
    out.write(
        f"depth {doc['depth']}/{doc['max_queue']}  pending {doc['pending']}  "
        f"running {doc['running']}  oldest wait {doc['oldest_wait_ms']} ms\n"
    )
    rows = [("CALLER", "PENDING", "RUNNING", "OLDEST WAIT MS", "MAX PENDING")]
    for c in doc["callers"]:
        rows.append((c["caller"] or "(port)", str(c["pending"]), str(c["running"]),
                     str(c["oldest_wait_ms"]), str(c["max_pending"] or "-")))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    return EXIT_OK


def _bar(status: JobStatus, width: int = 30) -> str:
    p = status.progress
    if p is None or not p.total:
        return ""
    done = int(width * p.step / p.total)
    return f"[{'#' * done}{'.' * (width - done)}] {p.step}/{p.total}"


def _exit_for(status: JobStatus) -> int:
    return EXIT_OK if status.state == "done" else EXIT_FAILED


def cmd_jobs_watch(args: argparse.Namespace, out: TextIO) -> int:
    return _watch(_job(args, args.job, args.model), args, out)


def _watch(job: Job, args: argparse.Namespace, out: TextIO) -> int:
    """Follow a job's event stream with a progress bar; the last status goes to stdout."""
    err = sys.stderr
    last: JobStatus | None = None
    for event in job.events():
        last = event.status
        if not args.quiet:
            err.write(f"\r{last.job_id}: {last.state:<9} {_bar(last)}   ")
            err.flush()
    if not args.quiet:
        err.write("\n")
    if last is None:  # events() ends only after a terminal event, or raises
        raise MortredError("the event stream ended before any event")
    _print_json(last.raw, out)
    return _exit_for(last)


def cmd_jobs_wait(args: argparse.Namespace, out: TextIO) -> int:
    return _wait(_job(args, args.job_url), args, out)


def _wait(job: Job, args: argparse.Namespace, out: TextIO) -> int:
    """Long-poll ``--step-ms`` at a time, printing progress, until the job ends or
    ``--max-wait`` seconds pass (then exit 1)."""
    deadline = time.monotonic() + args.max_wait if args.max_wait else None
    err = sys.stderr
    while True:
        status = job.wait(timeout=args.step_ms / 1000.0, poll_ms=args.step_ms)
        if not args.quiet:
            p = status.progress
            step = f" step {p.step}/{p.total}" if p else ""
            err.write(f"\r{status.job_id}: {status.state:<8} elapsed {status.elapsed_ms or 0} ms"
                      f"{step}   ")  # fmt: skip
            err.flush()
        if status.terminal or (deadline is not None and time.monotonic() > deadline):
            if not args.quiet:
                err.write("\n")
            _print_json(status.raw, out)
            return _exit_for(status)


def cmd_jobs_result(args: argparse.Namespace, out: TextIO) -> int:
    job = _job(args, args.job_url)
    result = job.result()
    _print_json(result.raw, out)
    if args.output:  # an SDK job's result files, each under its own name
        from mortred_client.sync import save_files

        for path in save_files(job.client, result.files(), args.output):
            sys.stderr.write(f"wrote {path}\n")
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
    js.add_argument("-i", "--input", dest="inputs", action="append", default=[],
                    metavar="NAME=VALUE", help="an input by name (NAME=@FILE: a file)")  # fmt: skip

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
    jr.add_argument("-o", "--output", metavar="DIR", help="write the result files into DIR")
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
    jl.add_argument("--all", action="store_true", help="every page (--limit jobs per request)")
    jl.set_defaults(fn=cmd_jobs_list)
    qu = sub.add_parser("queue", help="a model's queue: depth, running, oldest wait, callers")
    qu.add_argument("model")
    qu.set_defaults(fn=cmd_queue)
    model_commands.register(sub, _Parser)

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
    args.sup = Supervisor(args.addr, args.token)
    try:
        code = args.fn(args, out)
    except UsageError as e:
        sys.stderr.write(f"mortredctl: {e}\n")
        code = EXIT_USAGE
    except MortredError as e:
        sys.stderr.write(f"mortredctl: {e}\n")
        if e.body is not None and args.json:
            _print_json(e.body, out)
        code = EXIT_FAILED
    except (ValueError, OSError) as e:  # a bad URL, an unreadable --image
        sys.stderr.write(f"mortredctl: {e}\n")
        code = EXIT_USAGE
    except KeyboardInterrupt:
        code = EXIT_FAILED
    if argv is None:
        raise SystemExit(code)
    return code


if __name__ == "__main__":
    main()

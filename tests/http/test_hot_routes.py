"""The hand matcher of the hot routes agrees with the route table (declared once, in
the Klein app): for every rule of the table, on concrete paths, it names the handler
werkzeug would, or leaves the request to werkzeug; never a handler werkzeug would not
pick."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from werkzeug.exceptions import MethodNotAllowed, NotFound

from mortred_twisted.http.hot_routes import HOT_LABELS
from tests.http.test_model_server_app import make_app

JOB = "job_0123456789abcdef01234567"


def concrete(rule: str) -> list[str]:
    """Paths a rule matches: its variables filled in, with and without a final slash."""
    path = rule.replace("<job_id>", JOB)
    return [path, path.rstrip("/") + "/"] if path != "/" else [path]


def werkzeug_endpoint(app, method: str, path: str) -> str | None:
    mapper = app.app.url_map.bind("localhost", path_info=path, default_method=method)
    try:
        endpoint, _args = mapper.match()
    except (NotFound, MethodNotAllowed):
        return None
    return str(endpoint)


@pytest.mark.parametrize("server_uri", ["/infer", "/mortred/diffusion/ddim"])
def test_every_rule_of_the_table_is_matched_alike(server_uri: str) -> None:
    app, *_ = make_app(server_uri=server_uri)
    hot = app.hot_routes()
    handlers = {id(h): label for label, h in app.handlers.items()}
    rules = list(app.app.url_map.iter_rules())
    assert {f"mortred_{label}" for label in HOT_LABELS} <= {r.endpoint for r in rules}
    checked = 0
    for rule in rules:
        for method in sorted(rule.methods or ()):
            for path in concrete(rule.rule):
                request = SimpleNamespace(path=path.encode(), method=method.encode())
                matched = hot.match(request)
                expected = werkzeug_endpoint(app, method, path)
                # the head check's shortcut (a known route needs no werkzeug match)
                assert hot.serves(method.encode(), path.encode()) == (matched is not None)
                if matched is not None:
                    label = handlers[id(matched[0])]
                    assert f"mortred_{label}" == expected, (method, path)
                    assert label in HOT_LABELS
                    checked += 1
                elif expected is not None:
                    label = expected.removeprefix("mortred_")
                    assert label not in HOT_LABELS or method == "HEAD", (method, path, label)
    assert checked >= 2 * len(HOT_LABELS)


@pytest.mark.parametrize(
    "path", [f"/jobs/{JOB}/events", f"/jobs/{JOB}/x", "/jobs//wait", f"/jobs/{JOB}/wait/x", "/j"]
)
def test_paths_outside_the_hot_routes_are_left_to_werkzeug(path: str) -> None:
    app, *_ = make_app()
    for method in (b"GET", b"POST", b"DELETE", b"PUT"):
        assert app.hot_routes().match(SimpleNamespace(path=path.encode(), method=method)) is None
        assert not app.checks.known_route(method, path.encode())

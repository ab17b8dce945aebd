"""The gateway's public route table (seed 002 T15) and its 404/405 answers."""

from __future__ import annotations

import pytest

from mortred_twisted.config.catalog import Catalog, CatalogEntry
from mortred_twisted.gateway.routing import (
    RouteError,
    RouteKind,
    check_method,
    list_query,
    match,
    resolve,
)


def entry(id_: str, port: int, uri: str, async_enabled: bool = True) -> CatalogEntry:
    return CatalogEntry(id_, "fake", "127.0.0.1", port, uri, async_enabled, 16, f"{id_}.toml")


CATALOG = Catalog(
    [entry("DDPM", 18110, "/mortred/ddpm/infer"), entry("MOBILENETV2", 18121, "/cls", False)]
)


@pytest.mark.parametrize(
    ("path", "query", "kind", "upstream"),
    [
        ("/v1/models/DDPM/infer", "", RouteKind.INFER, "/mortred/ddpm/infer"),
        ("/v1/models/DDPM/jobs", "", RouteKind.SUBMIT, "/jobs"),
        ("/v1/models/DDPM/jobs/job_1", "", RouteKind.POLL, "/jobs/job_1"),
        (
            "/v1/models/DDPM/jobs/job_1/wait",
            "timeout=200",
            RouteKind.WAIT,
            "/jobs/job_1/wait?timeout=200",
        ),
        ("/v1/models/DDPM/jobs/job_1/result", "", RouteKind.RESULT, "/jobs/job_1/result"),
        ("/mortred/ddpm/infer", "", RouteKind.LEGACY, "/mortred/ddpm/infer"),
    ],
)
def test_t15_table(path: str, query: str, kind: RouteKind, upstream: str) -> None:
    """Each public path maps to the model-process path of the T15 table."""
    m = match(path, CATALOG)
    assert m is not None and m.kind is kind
    route = resolve(m, CATALOG, query)
    assert route.upstream_path == upstream
    assert route.url == "http://127.0.0.1:18110" + upstream


@pytest.mark.parametrize(
    "path",
    [
        "/jobs",
        "/jobs/job_1",
        "/v1/models/",
        "/v1/models/DDPM",
        "/v1/models/DDPM/x",
        "/v1/models/DDPM/jobs/job_1/other",
        "/v1/models/DDPM/jobs//wait",
        "/",
    ],
)
def test_not_routed(path: str) -> None:
    """Bare /jobs and malformed paths are not public routes."""
    assert match(path, CATALOG) is None


def test_unknown_model_is_404() -> None:
    """An id outside the catalog is a 404 naming the id."""
    m = match("/v1/models/NOPE/jobs", CATALOG)
    assert m is not None
    with pytest.raises(RouteError) as e:
        resolve(m, CATALOG)
    assert e.value.status == 404 and "NOPE" in e.value.message


def test_wrong_method_is_405_with_allow() -> None:
    """POST on a job URL (T13) is 405 with Allow: GET, DELETE (poll and cancel)."""
    m = match("/v1/models/DDPM/jobs/job_1", CATALOG)
    assert m is not None
    with pytest.raises(RouteError) as e:
        check_method(m, "POST")
    assert e.value.status == 405 and e.value.headers == {"Allow": "GET, DELETE"}


@pytest.mark.parametrize("job", ["..", "a.b", "%2e%2e", "x%2Fy"])
def test_hostile_job_ids_never_reach_upstream(job: str) -> None:
    """Job ids that could change the upstream path are answered 404 locally."""
    m = match(f"/v1/models/DDPM/jobs/{job}", CATALOG)
    assert m is not None
    with pytest.raises(RouteError) as e:
        resolve(m, CATALOG)
    assert e.value.status == 404 and "job not found" in e.value.message


def test_async_disabled_model_still_forwards_jobs() -> None:
    """The gateway routes /jobs of a sync model; the model's own 404 passes through (T12)."""
    m = match("/v1/models/MOBILENETV2/jobs", CATALOG)
    assert m is not None
    assert resolve(m, CATALOG).url == "http://127.0.0.1:18121/jobs"


@pytest.mark.parametrize(
    ("method", "path", "query", "kind", "upstream"),
    [
        ("DELETE", "/v1/models/DDPM/jobs/job_1", "", RouteKind.CANCEL, "/jobs/job_1"),
        ("GET", "/v1/models/DDPM/jobs", "limit=2", RouteKind.LIST, "/jobs?limit=2"),
        ("GET", "/v1/models/DDPM/jobs/job_1/events", "", RouteKind.EVENTS, "/jobs/job_1/events"),
    ],
)
def test_job_api_routes(method: str, path: str, query: str, kind: RouteKind, upstream: str) -> None:
    """Cancel, listing and events map to the model's DELETE /jobs/{job}, GET /jobs and
    GET /jobs/{job}/events."""
    m = match(path, CATALOG)
    assert m is not None
    route = resolve(check_method(m, method), CATALOG, query)
    assert (route.kind, route.upstream_path) == (kind, upstream)


def test_list_query_keeps_only_its_keys() -> None:
    """The listing forwards state, limit and cursor (first of each), re-encoded."""
    assert list_query("cursor=c%201&x=1&state=a,b&state=c&limit=3&limit=9") == (
        "state=a%2Cb&limit=3&cursor=c+1"
    )
    assert list_query("x=%2F..&&=") == ""


def test_a_result_file_maps_to_the_models_files_route() -> None:
    """GET /v1/models/<id>/jobs/<job>/files/<name> -> GET /jobs/<job>/files/<name>."""
    m = match("/v1/models/DDPM/jobs/job_1/files/output-0.png", CATALOG)
    assert m is not None
    route = resolve(check_method(m, "GET"), CATALOG)
    assert (route.kind, route.upstream_path) == (RouteKind.FILE, "/jobs/job_1/files/output-0.png")


@pytest.mark.parametrize("name", ["..", ".", ".meta", "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "a%00b"])
def test_hostile_file_names_never_reach_upstream(name: str) -> None:
    """File names that could leave the job's directory are answered 404 locally."""
    m = match(f"/v1/models/DDPM/jobs/job_1/files/{name}", CATALOG)
    assert m is not None
    with pytest.raises(RouteError) as e:
        resolve(m, CATALOG)
    assert e.value.status == 404 and "file not found" in e.value.message

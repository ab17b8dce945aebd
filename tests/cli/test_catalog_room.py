"""`mortredctl model new` gives each model an id, a port and a server_uri its catalog
does not use, and a port nothing listens on (issue 36.4: two scaffolds in one catalog
stopped the supervisor with "duplicate port" and "duplicate server_uri")."""

from __future__ import annotations

import io
import socket
import tomllib
from pathlib import Path

import pytest

from mortred_twisted.cli import catalog_room
from mortred_twisted.cli.mortredctl import main
from mortred_twisted.config.catalog import build_catalog
from mortred_twisted.config.control import build_control_config


def ctl(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def server_table(folder: Path) -> dict:
    return tomllib.loads((folder / "server.toml").read_text())["server"]


def catalog_of(folder: Path):
    """The catalog the supervisor would build from every server file under ``folder``."""
    control = build_control_config({"supervisor": {"catalog_dir": str(folder)}}, root=folder)
    return build_catalog(control)


def test_two_scaffolds_in_one_catalog_start_together(tmp_path: Path) -> None:
    """Two (three) models written beside each other: distinct ids, ports and URIs,
    and the supervisor's own catalog check accepts them all."""
    models = tmp_path / "my-models"
    for name in ("sharpen", "blur", "sharpen"):
        folder = models / (name if not (models / name).exists() else f"{name}-again")
        code, text = ctl("model", "new", name, str(folder))
        assert code == 0, text
    tables = [server_table(f) for f in sorted(models.iterdir())]
    assert len({t["port"] for t in tables}) == 3
    assert len({t["server_uri"] for t in tables}) == 3
    assert {t["id"] for t in tables} == {"BLUR", "SHARPEN", "SHARPEN_2"}
    assert {t["server_uri"] for t in tables} == {
        "/mortred/blur/infer", "/mortred/sharpen/infer", "/mortred/sharpen_2/infer",
    }  # fmt: skip
    catalog = catalog_of(models)
    assert sorted(catalog) == ["BLUR", "SHARPEN", "SHARPEN_2"]


def test_a_port_something_listens_on_is_skipped(tmp_path: Path) -> None:
    """The first free port, then with a listener on it: the next one."""
    empty = catalog_room.Taken(frozenset(), frozenset(), frozenset(), "nothing")
    first = catalog_room.pick_port(empty)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", first))
        listener.listen(1)
        assert catalog_room.is_listening(first)
        code, text = ctl("model", "new", "echo", str(tmp_path / "echo"))
        assert code == 0, text
        assert server_table(tmp_path / "echo")["port"] not in (first,)
    assert catalog_room.pick_port(empty, listening=lambda p: p < first + 5) == first + 5


def test_a_control_config_names_the_catalog_with_its_overrides_and_ports(
    tmp_path: Path,
) -> None:
    """--catalog mortred.toml: its catalog_dir (deep), a [servers] port override and
    replica range, and the gateway's own port all take room."""
    servers = tmp_path / "servers" / "deep" / "er"
    servers.mkdir(parents=True)
    first = catalog_room.FIRST_PORT
    (servers / "a.toml").write_text(
        f'[server]\nid = "A"\nport = {first + 50}\nserver_uri = "/mortred/x/infer"\n'
    )
    control = tmp_path / "mortred.toml"
    control.write_text(
        f'[supervisor]\ncatalog_dir = "servers"\napi_port = {first + 3}\n'
        f"[gateway]\nport = {first}\n"
        f"[servers.A]\nport = {first + 1}\nreplicas = 2\n"
    )
    taken = catalog_room.taken_by(control, tmp_path / "elsewhere" / "x")
    assert {first, first + 1, first + 2, first + 3} <= taken.ports
    assert first + 50 not in taken.ports  # overridden
    assert "/mortred/x/infer" in taken.uris and "A" in taken.ids
    code, text = ctl("model", "new", "x", str(tmp_path / "elsewhere" / "x"), "--catalog",
                     str(control))  # fmt: skip
    assert code == 0, text
    table = server_table(tmp_path / "elsewhere" / "x")
    assert table["port"] >= first + 4 and table["server_uri"] == "/mortred/x_2/infer"
    # a folder as the catalog: every *.toml below it
    assert catalog_room.taken_by(tmp_path / "servers", tmp_path / "y").ports == {first + 50}


def test_files_that_are_no_server_files_take_no_room(tmp_path: Path) -> None:
    """Beside the new folder: a pyproject.toml, a file that is not TOML, a server
    table with a port that is no integer; none of them breaks the scaffold."""
    models = tmp_path / "models"
    (models / "pkg").mkdir(parents=True)
    (models / "pkg" / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (models / "broken.toml").write_bytes(b"\xff\xfe[server\n")
    (models / "odd.toml").write_text('[server]\nid = 3\nport = "18300"\nserver_uri = 1\n')
    (models / "flag.toml").write_text("[server]\nport = true\n")
    (models / "default.toml").write_text('[server]\nid = "D"\n')  # port 18100, /infer
    taken = catalog_room.taken_by(None, models / "new")
    assert taken.ports == {18100} and taken.uris == {"/infer"} and taken.ids == {"D"}
    assert ctl("model", "new", "new", str(models / "new"))[0] == 0


@pytest.mark.parametrize(
    "catalog", ["missing.toml", "bad.toml", "unknown_key.toml"], ids=lambda c: c
)
def test_a_catalog_that_cannot_be_read_is_a_usage_error(tmp_path: Path, catalog: str) -> None:
    """Exit 2 with the reason; nothing is written."""
    (tmp_path / "bad.toml").write_text("[supervisor\n")
    (tmp_path / "unknown_key.toml").write_text("[supervisor]\ncatalg_dir = 'x'\n")
    code, _ = ctl("model", "new", "m", str(tmp_path / "m"), "--catalog", str(tmp_path / catalog))
    assert code == 2 and not (tmp_path / "m").exists()


def test_names_that_look_like_gateway_routes_stay_under_mortred() -> None:
    """A model named jobs, v1 or api gets a URI the gateway does not serve itself."""
    empty = catalog_room.Taken(frozenset(), frozenset(), frozenset(), "nothing")
    for name in ("jobs", "v1", "api", "healthz", "metrics"):
        assert catalog_room.pick_uri(name, empty) == f"/mortred/{name}/infer"

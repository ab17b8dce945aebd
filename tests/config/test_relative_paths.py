"""One rule for relative paths in config files, true in code and in the docs (issue
36.4): they resolve against the project root, the parent of the nearest ``conf/``
above the file, else the file's own folder; never the working directory. Only a
server file's ``[model] type = "file.py:Class"`` is relative to the server file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mortred_twisted.config.catalog import build_catalog
from mortred_twisted.config.control import load_control_config
from mortred_twisted.config.server import find_root, load_server_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory that is neither the project nor the config's folder."""
    cwd = tmp_path / "started-here"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_a_copied_control_file_resolves_next_to_itself(tmp_path: Path, elsewhere: Path) -> None:
    """The new user's case: conf/mortred.toml copied to another folder, started from a
    third: log_dir and catalog_dir are beside the copy, not in the working directory
    and not under a project root it does not have."""
    copy = tmp_path / "my-models.toml"
    copy.write_text((REPO / "conf" / "mortred.toml").read_text())
    config = load_control_config(copy)
    assert Path(config.root) == tmp_path
    assert config.path(config.supervisor.log_dir) == tmp_path / "logs"
    assert config.path("models") == tmp_path / "models"
    assert not str(config.path("logs")).startswith(str(elsewhere))


def test_a_file_below_conf_resolves_against_the_parent_of_conf(
    tmp_path: Path, elsewhere: Path
) -> None:
    """At any depth below conf/ (the nearest conf/ wins); the working directory
    plays no part."""
    project = tmp_path / "conf" / "inner" / "project"
    deep = project / "conf" / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "mortred.toml").write_text('[supervisor]\nlog_dir = "logs"\n')
    config = load_control_config(deep / "mortred.toml")
    assert config.path(config.supervisor.log_dir) == project / "logs"
    assert find_root(REPO / "conf" / "server" / "fake" / "fake_async.toml") == REPO


def test_server_files_follow_the_same_rule_and_only_the_model_file_differs(
    tmp_path: Path, elsewhere: Path
) -> None:
    """A server file outside conf/: its root is its folder (result_files_dir, model
    options' paths); its ``type = "file.py:Class"`` is relative to the file, which is
    the same folder here; below conf/ the two differ."""
    outside = tmp_path / "my-models" / "m"
    outside.mkdir(parents=True)
    (outside / "m.py").write_text("x = 1\n")
    text = '[server]\nid = "M"\nresult_files_dir = "results"\n[model]\ntype = "m.py:M"\n'
    (outside / "server.toml").write_text(text)
    cfg = load_server_config(outside / "server.toml", env={})
    assert Path(cfg.root) == outside
    assert cfg.model_type == f"{outside / 'm.py'}:M"
    inside = tmp_path / "proj" / "conf" / "server"
    inside.mkdir(parents=True)
    (inside / "m.py").write_text("x = 1\n")
    (inside / "server.toml").write_text(text)
    cfg = load_server_config(inside / "server.toml", env={})
    assert Path(cfg.root) == tmp_path / "proj"
    assert cfg.model_type == f"{inside / 'm.py'}:M"


def test_the_documented_layout_of_your_own_models_builds_its_catalog(
    tmp_path: Path, elsewhere: Path
) -> None:
    """your-own.md "Behind the gateway": a copy of mortred.toml beside ~/my-models with
    catalog_dir = "my-models" finds the scaffolds' server files from any directory."""
    from mortred_twisted.cli.mortredctl import main

    for name in ("sharpen", "blur"):
        assert main(["model", "new", name, str(tmp_path / "my-models" / name)]) == 0
    copy = tmp_path / "my-models.toml"
    text = (REPO / "conf" / "mortred.toml").read_text()
    copy.write_text(text.replace('catalog_dir = "conf/server"', 'catalog_dir = "my-models"'))
    assert 'catalog_dir = "my-models"' in copy.read_text()
    catalog = build_catalog(load_control_config(copy))
    assert sorted(catalog) == ["BLUR", "SHARPEN"]
    assert os.getcwd() == str(elsewhere)


@pytest.mark.parametrize("doc", ["docs/operations.md", "docs/configuration.md"])
def test_the_docs_state_the_rule_the_code_follows(doc: str) -> None:
    """Both pages say it the same way (they said "the parent of conf/" only, which a
    copied file outside conf/ does not have)."""
    text = " ".join((REPO / doc).read_text().split())
    assert (
        "the parent of the nearest `conf/` folder above the file, or the file's own "
        "folder when there is no `conf/` above it; never the working directory" in text
    )
    assert "relative to the server file itself" in text

"""The built-in families are this package's entry points; other packages' names load."""

from __future__ import annotations

import runpy
from pathlib import Path
from unittest import mock

from mortred_twisted.models.registry import MODEL_FACTORIES

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_registers_every_built_in_family_as_an_entry_point() -> None:
    """setup.py's mortred_twisted.models entry points are the registry, name for name."""
    with mock.patch("setuptools.setup") as setup:
        runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    groups = setup.call_args.kwargs["entry_points"]
    registered = dict(line.split("=", 1) for line in groups["mortred_twisted.models"])
    assert registered == dict(MODEL_FACTORIES)


def test_this_packages_own_entry_points_are_not_a_clash() -> None:
    """The built-ins' own entry points are not counted as another package's names."""
    from mortred_twisted.sdk.loading import entry_point_names

    assert not set(entry_point_names()) & set(MODEL_FACTORIES)


def test_a_built_in_name_another_package_registers_is_refused_at_start(monkeypatch) -> None:
    """A server of type DDPM does not start while another package registers DDPM."""
    import pytest

    from mortred_twisted.model_api.base import ModelLoadError
    from mortred_twisted.models.registry import create_model
    from mortred_twisted.sdk import loading

    monkeypatch.setattr(loading, "entry_point_names", lambda: {"fake": "evil.mod:Fake"})
    with pytest.raises(ModelLoadError, match=r"built-in type.*evil\.mod:Fake"):
        create_model("fake", {}, ROOT)

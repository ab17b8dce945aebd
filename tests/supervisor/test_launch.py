"""The launcher runs exactly the twistd plugins the plugin file defines."""

from __future__ import annotations

from pathlib import Path

from twisted.application.service import ServiceMaker

from mortred_twisted.supervisor import launch

ROOT = Path(__file__).resolve().parents[2]


def test_launcher_plugins_are_the_plugin_files() -> None:
    """Children can be launched as every plugin of twisted_plugins/, and only those."""
    plugin_file = ROOT / "twisted_plugins" / "mortred_plugins.py"
    assert plugin_file == launch.SOURCE_PLUGINS
    defined = launch.service_makers(launch.plugin_module(plugin_file))
    assert [(m.tapname, m.module) for m in launch.SERVICE_MAKERS] == [
        (m.tapname, m.module) for m in defined
    ]
    assert {m.tapname for m in defined} == {
        "mortred-model",
        "mortred-gateway",
        "mortred-supervisor",
    }
    assert list(launch.LaunchOptions._getPlugins(None)) == list(launch.SERVICE_MAKERS)


def test_a_plugin_added_to_the_file_is_launchable(tmp_path: Path) -> None:
    """A ServiceMaker added to a plugin file is picked up without touching the launcher."""
    source = tmp_path / "mortred_plugins.py"
    source.write_text(
        (ROOT / "twisted_plugins" / "mortred_plugins.py").read_text()
        + '\nmortredExtra = ServiceMaker("mortred-extra", "x.tap", "An extra.", "mortred-extra")\n'
    )
    makers = launch.service_makers(launch.plugin_module(source))
    assert makers[-1].tapname == "mortred-extra" and len(makers) == 4
    assert all(isinstance(m, ServiceMaker) for m in makers)


def test_without_a_source_tree_the_installed_plugins_are_used(tmp_path: Path) -> None:
    """Outside a checkout (a regular install) the installed twisted.plugins copy is read."""
    module = launch.plugin_module(tmp_path / "absent.py")
    assert module.__name__ == launch.INSTALLED_PLUGINS
    assert {m.tapname for m in launch.service_makers(module)} >= {"mortred-model"}

"""Verified weight loading: wrong or missing files are clear load errors, never random
weights; every shipped perception config parses and names existing files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from mortred_twisted.config.server import load_server_config
from mortred_twisted.models.base import ModelLoadError
from mortred_twisted.models.classification import mobilenetv2
from mortred_twisted.models.classification.weights import (
    load_verified_checkpoint,
    write_manifest_entry,
)
from tests.models.perception.conftest import ROOT, TINY_ARCHS

TINY_ARCH = TINY_ARCHS["MOBILENETV2"]
SERVER_CONFIGS = {
    "conf/server/classification/mobilenetv2.toml": ("MOBILENETV2", 18121, False),
    "conf/server/object_detection/yolov8.toml": ("YOLOV8", 18122, False),
    "conf/server/segment_anything/sam_amg.toml": ("SAM_AMG", 18120, True),
}


@pytest.fixture()
def tiny_weights(tmp_path: Path) -> Path:
    """A tiny MobileNetV2 checkpoint with its manifest entry in a temp folder."""
    torch.manual_seed(0)
    net = mobilenetv2.build_network(TINY_ARCH)
    path = tmp_path / "tiny.pt"
    torch.save({"arch": TINY_ARCH, "state_dict": net.state_dict()}, path)
    write_manifest_entry(path, {"model_type": "MOBILENETV2", "command": "make tiny"})
    return path


def _options(path: Path) -> dict[str, str]:
    return {
        "model_weights_path": str(path),
        "model_class_names_path": "conf/model/classification/digits_class_names.txt",
    }


def test_verified_weights_load(tiny_weights: Path) -> None:
    """A checkpoint matching its manifest loads and builds a model."""
    mobilenetv2._SHARED.clear()
    model = mobilenetv2.create(_options(tiny_weights), ROOT)
    assert model.input_size == 16 and len(model.class_names) == 10


def test_missing_manifest_is_a_load_error(tiny_weights: Path) -> None:
    """Without a manifest next to the weights, loading fails naming the manifest."""
    (tiny_weights.parent / "manifest.json").unlink()
    with pytest.raises(ModelLoadError, match="manifest not found"):
        load_verified_checkpoint(tiny_weights, "MOBILENETV2")


def test_missing_file_is_a_load_error_with_rebuild_command(tiny_weights: Path) -> None:
    """A listed but missing file fails with the command that rebuilds it."""
    tiny_weights.unlink()
    with pytest.raises(ModelLoadError, match=r"not found.*make tiny"):
        load_verified_checkpoint(tiny_weights, "MOBILENETV2")


def test_tampered_file_is_a_load_error(tiny_weights: Path) -> None:
    """One flipped byte (same size) fails the sha256 check."""
    data = bytearray(tiny_weights.read_bytes())
    data[-10] ^= 0xFF
    tiny_weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="sha256"):
        load_verified_checkpoint(tiny_weights, "MOBILENETV2")


def test_unlisted_file_and_wrong_type_are_load_errors(tiny_weights: Path) -> None:
    """A file absent from the manifest, or trained for another model, is refused."""
    with pytest.raises(ModelLoadError, match="trained for MOBILENETV2"):
        load_verified_checkpoint(tiny_weights, "YOLOV8")
    other = tiny_weights.with_name("other.pt")
    other.write_bytes(tiny_weights.read_bytes())
    with pytest.raises(ModelLoadError, match="not listed"):
        load_verified_checkpoint(other, "MOBILENETV2")


def test_wrong_class_name_count_and_input_size_are_load_errors(
    tiny_weights: Path, tmp_path: Path
) -> None:
    """A class-name file of the wrong length or a mismatched input_size is refused."""
    mobilenetv2._SHARED.clear()
    names = tmp_path / "names.txt"
    names.write_text("a\nb\n")
    opts = {**_options(tiny_weights), "model_class_names_path": str(names)}
    with pytest.raises(ModelLoadError, match="lists 2 names"):
        mobilenetv2.create(opts, ROOT)
    mobilenetv2._SHARED.clear()
    with pytest.raises(ModelLoadError, match="input_size"):
        mobilenetv2.create({**_options(tiny_weights), "input_size": 32}, ROOT)


def test_unavailable_device_is_a_load_error(tiny_weights: Path) -> None:
    """Asking for an unknown device fails at load, not at the first request."""
    with pytest.raises(ModelLoadError, match="device"):
        mobilenetv2.create({**_options(tiny_weights), "device": "tpu"}, ROOT)


@pytest.mark.parametrize("path", sorted(SERVER_CONFIGS))
def test_shipped_server_configs_load(path: str) -> None:
    """Each perception server TOML validates, has its port and async setting, and its
    model files (weights listed in the manifest, class names) exist."""
    config = load_server_config(ROOT / path, root=ROOT, env={})
    model_type, port, is_async = SERVER_CONFIGS[path]
    assert (config.id, config.model_type, config.port) == (model_type, model_type, port)
    assert config.async_enabled is is_async
    if is_async:
        assert (config.async_timeout, config.async_max_queue) == (600000, 8)
        assert (config.async_job_ttl, config.async_max_completed) == (300000, 100)
    weights = ROOT / config.model_options["model_weights_path"]
    manifest = json.loads((weights.parent / "manifest.json").read_text())
    assert weights.name in manifest["files"]
    names = config.model_options.get("model_class_names_path")
    if names:
        assert (ROOT / names).is_file()


def test_model_configs_are_valid_toml() -> None:
    """Every perception model TOML parses."""
    for folder in ("classification", "object_detection", "segment_anything"):
        for path in (ROOT / "conf" / "model" / folder).glob("*.toml"):
            assert tomllib.loads(path.read_text())

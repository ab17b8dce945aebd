"""Verified loading: wrong or missing files are clear load errors, never random weights;
every shipped perception config parses and names a verified checkpoint."""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mortred_twisted.config.server import load_server_config
from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models import pretrained
from mortred_twisted.models.mortred_v1 import classification as image_classification
from mortred_twisted.models.registry import create_model
from mortred_twisted.models.weights import (
    load_verified_checkpoint,
    write_manifest_entry,
)
from mortred_twisted.models.yolov8 import family as yolov8
from tests.models.perception.conftest import ROOT, TINY_ARCHS

SERVER_CONFIGS = {
    "conf/server/classification/mobilenetv2.toml": ("MOBILENETV2", "transformers", 18121, False),
    "conf/server/object_detection/yolov8.toml": ("YOLOV8", "YOLOV8", 18122, False),
    "conf/server/object_detection/rtdetr.toml": ("RTDETR", "transformers", 18123, False),
    "conf/server/segment_anything/sam_amg.toml": ("SAM_AMG", "transformers", 18120, True),
}
#: The built-in family whose contract a ``type = "transformers"`` entry keeps
#: (``contract = "mortred-v1"``), and so the type its weights' manifest names.
V1_TYPES = {
    "image-classification": ("MOBILENETV2", "IMAGE_CLASSIFICATION"),
    "object-detection": ("OBJECT_DETECTION",),
    "mask-generation": ("SAM_AMG",),
}


@pytest.fixture()
def tiny_yolo(tmp_path: Path) -> Path:
    """A tiny YOLOV8 checkpoint with its manifest entry in a temp folder."""
    torch.manual_seed(0)
    arch = TINY_ARCHS["YOLOV8"]
    path = tmp_path / "tiny.pt"
    torch.save({"arch": arch, "state_dict": yolov8.build_network(arch).state_dict()}, path)
    write_manifest_entry(path, {"model_type": "YOLOV8", "command": "make tiny"})
    return path


@pytest.fixture()
def classifier_dir(stand_in: Callable[[str], Path], tmp_path: Path) -> Path:
    """A private copy of the classifier stand-in (tests below alter it)."""
    return Path(shutil.copytree(stand_in("IMAGE_CLASSIFICATION"), tmp_path / "cls"))


def test_yolo_missing_manifest_is_a_load_error(tiny_yolo: Path) -> None:
    """Without a manifest next to the weights, loading fails naming the manifest."""
    (tiny_yolo.parent / "manifest.json").unlink()
    with pytest.raises(ModelLoadError, match="manifest not found"):
        load_verified_checkpoint(tiny_yolo, "YOLOV8")


def test_yolo_tampered_unlisted_and_wrong_type_are_load_errors(tiny_yolo: Path) -> None:
    """A flipped byte fails the sha256; an unlisted file or another model type is refused."""
    with pytest.raises(ModelLoadError, match="trained for YOLOV8"):
        load_verified_checkpoint(tiny_yolo, "SAM_AMG")
    other = tiny_yolo.with_name("other.pt")
    other.write_bytes(tiny_yolo.read_bytes())
    with pytest.raises(ModelLoadError, match="not listed"):
        load_verified_checkpoint(other, "YOLOV8")
    data = bytearray(tiny_yolo.read_bytes())
    data[-10] ^= 0xFF
    tiny_yolo.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="sha256"):
        load_verified_checkpoint(tiny_yolo, "YOLOV8")


def test_verified_directory_loads(classifier_dir: Path) -> None:
    """A transformers directory matching its manifest builds a classifier with its
    id2label as class names."""
    model = create_model("IMAGE_CLASSIFICATION", {"pretrained": str(classifier_dir)}, ROOT)
    assert isinstance(model.instance, image_classification.ImageClassificationModel)
    names = model.instance.class_names
    assert len(names) == 1001 and names[0] == "background"


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "preprocessor_config.json"])
def test_missing_file_is_a_load_error_naming_it(classifier_dir: Path, name: str) -> None:
    """Each file the loader reads must exist; the error names it."""
    (classifier_dir / name).unlink()
    with pytest.raises(ModelLoadError, match=f"{name}: missing file"):
        create_model("IMAGE_CLASSIFICATION", {"pretrained": str(classifier_dir)}, ROOT)


def test_tampered_or_unlisted_file_is_a_load_error(classifier_dir: Path) -> None:
    """One flipped byte of the weights fails the sha256 check, naming the file; a file
    missing from the manifest is refused too."""
    weights = classifier_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"model.safetensors: sha256 mismatch"):
        create_model("IMAGE_CLASSIFICATION", {"pretrained": str(classifier_dir)}, ROOT)
    manifest = json.loads((classifier_dir / "manifest.json").read_text())
    del manifest["files"]["config.json"]
    (classifier_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=r"config.json: not listed"):
        create_model("IMAGE_CLASSIFICATION", {"pretrained": str(classifier_dir)}, ROOT)


def test_missing_manifest_or_directory_is_a_load_error(classifier_dir: Path) -> None:
    """No manifest: the error says how to write one after vetting the files; no
    directory: the error names it."""
    (classifier_dir / "manifest.json").unlink()
    with pytest.raises(ModelLoadError, match=r"models\.pretrained"):
        create_model("IMAGE_CLASSIFICATION", {"pretrained": str(classifier_dir)}, ROOT)
    with pytest.raises(ModelLoadError, match="pretrained directory not found"):
        create_model("IMAGE_CLASSIFICATION", {"pretrained": str(classifier_dir / "x")}, ROOT)


def test_manifest_cli_vets_a_directory(classifier_dir: Path) -> None:
    """The manifest CLI rewrites a directory's manifest (then it loads) and refuses a
    folder that is not a transformers checkpoint."""
    (classifier_dir / "manifest.json").unlink()
    assert pretrained.main([str(classifier_dir)]) == 0
    create_model("IMAGE_CLASSIFICATION", {"pretrained": str(classifier_dir)}, ROOT)
    (classifier_dir / "config.json").unlink()
    assert pretrained.main([str(classifier_dir)]) == 1


def test_wrong_model_type_unknown_option_and_device_are_load_errors(
    classifier_dir: Path,
) -> None:
    """A directory recorded for another model type, a stale option (the old
    model_weights_path) or an unknown device fails at load, not at the first request."""
    opts = {"pretrained": str(classifier_dir)}
    with pytest.raises(ModelLoadError, match="model_weights_path"):
        create_model("MOBILENETV2", {**opts, "model_weights_path": "x.pt"}, ROOT)
    with pytest.raises(ModelLoadError, match="device"):
        create_model("MOBILENETV2", {**opts, "device": "tpu"}, ROOT)
    manifest = json.loads((classifier_dir / "manifest.json").read_text())
    manifest["model_type"] = "SAM_AMG"
    (classifier_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match="trained for SAM_AMG"):
        create_model("IMAGE_CLASSIFICATION", opts, ROOT)


@pytest.mark.parametrize("path", sorted(SERVER_CONFIGS))
def test_shipped_server_configs_load(path: str) -> None:
    """Each perception server TOML validates, has its port and async setting, and names
    a checkpoint listed in a manifest."""
    config = load_server_config(ROOT / path, root=ROOT, env={})
    server_id, model_type, port, is_async = SERVER_CONFIGS[path]
    assert (config.id, config.model_type, config.port) == (server_id, model_type, port)
    assert config.async_enabled is is_async
    if is_async:
        assert (config.async_timeout, config.async_max_queue) == (600000, 8)
        assert (config.async_job_ttl, config.async_max_completed) == (300000, 100)
    options = config.model_options
    types: tuple[str, ...] = (model_type, "IMAGE_CLASSIFICATION")
    if model_type == "transformers":  # the seed's contract of a built-in family, kept
        assert options["contract"] == "mortred-v1"
        types = V1_TYPES[options["task"]]
    if "pretrained" in options:
        manifest = json.loads((ROOT / options["pretrained"] / "manifest.json").read_text())
        assert set(pretrained.NEEDED_FILES) <= set(manifest["files"])
        assert manifest["model_type"] in types
    else:
        weights = ROOT / options["model_weights_path"]
        manifest = json.loads((weights.parent / "manifest.json").read_text())
        assert weights.name in manifest["files"]
        names = options.get("model_class_names_path")
        assert names is None or (ROOT / names).is_file()


def test_model_configs_are_valid_toml() -> None:
    """Every perception model TOML parses."""
    for folder in ("classification", "object_detection", "segment_anything"):
        for path in (ROOT / "conf" / "model" / folder).glob("*.toml"):
            assert tomllib.loads(path.read_text())

"""A directory is served by the kind its model_index.json names; one that does not
match fails loading with a message naming the missing part or the unknown class."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.diffusers_pipelines.components import inspect_directory
from mortred_twisted.models.registry import SDK_TYPES, create_model


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_each_pipeline_class_picks_its_kind(pipelines: dict[str, Path]) -> None:
    """StableDiffusion → text-to-image (also image-to-image, inpainting), the inpaint
    class → inpainting, DiT → class-conditional, DDPM → unconditional."""
    assert inspect_directory(pipelines["sd"]).tasks[0] == "text-to-image"
    assert inspect_directory(pipelines["sd"]).task("inpainting") == "inpainting"
    assert inspect_directory(pipelines["inpaint"]).task("auto") == "inpainting"
    assert inspect_directory(pipelines["dit"]).task("auto") == "class-conditional"
    assert inspect_directory(pipelines["ddpm"]).task("auto") == "unconditional"
    assert "diffusers" in SDK_TYPES


def test_a_missing_folder_is_named(pipelines: dict[str, Path], tmp_path: Path) -> None:
    """A Stable Diffusion directory without vae/ fails loading naming 'vae'."""
    broken = copy(pipelines["sd"], tmp_path / "sd")
    shutil.rmtree(broken / "vae")
    with pytest.raises(ModelLoadError, match=r"missing part 'vae': folder vae/ not found"):
        create_model("diffusers", {"path": str(broken)}, Path("."))


def test_a_part_the_index_does_not_name_is_named(
    pipelines: dict[str, Path], tmp_path: Path
) -> None:
    """An index without a tokenizer entry fails naming 'tokenizer' and the parts needed."""
    broken = copy(pipelines["sd"], tmp_path / "sd")
    index = json.loads((broken / "model_index.json").read_text())
    del index["tokenizer"]
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"missing part 'tokenizer': model_index.json"):
        create_model("diffusers", {"path": str(broken)}, Path("."))


def test_a_folder_without_its_configuration_is_named(
    pipelines: dict[str, Path], tmp_path: Path
) -> None:
    """unet/ without config.json fails naming 'unet'."""
    broken = copy(pipelines["ddpm"], tmp_path / "ddpm")
    (broken / "unet" / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"missing part 'unet': unet/ has no configuration"):
        create_model("diffusers", {"path": str(broken)}, Path("."))


def test_an_unknown_pipeline_class_is_named(pipelines: dict[str, Path], tmp_path: Path) -> None:
    """_class_name KandinskyPipeline fails naming it and the served classes."""
    broken = copy(pipelines["ddpm"], tmp_path / "other")
    index = json.loads((broken / "model_index.json").read_text())
    index["_class_name"] = "KandinskyPipeline"
    (broken / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"unknown pipeline class 'KandinskyPipeline'"):
        create_model("diffusers", {"path": str(broken)}, Path("."))


def test_no_index_and_no_directory(tmp_path: Path) -> None:
    """A folder without model_index.json, and a path that does not exist, are named."""
    with pytest.raises(ModelLoadError, match=r"missing part 'model_index.json'"):
        create_model("diffusers", {"path": str(tmp_path)}, Path("."))
    with pytest.raises(ModelLoadError, match=r"pipeline directory not found"):
        create_model("diffusers", {"path": str(tmp_path / "nope")}, Path("."))


def test_a_task_the_class_does_not_serve(pipelines: dict[str, Path]) -> None:
    """task = "text-to-image" on a DiT directory is refused at load, naming its tasks."""
    with pytest.raises(ModelLoadError, match=r"serves class-conditional"):
        create_model("diffusers", {"path": str(pipelines["dit"]), "task": "text-to-image"},
                     Path("."))  # fmt: skip


def test_bad_options_are_reported_together(pipelines: dict[str, Path]) -> None:
    """A half dtype on the CPU and an unknown key are one load error naming both."""
    options = {"path": str(pipelines["ddpm"]), "device": "cpu", "dtype": "float16", "colour": 1}
    with pytest.raises(ModelLoadError) as caught:
        create_model("diffusers", options, Path("."))
    assert "needs device 'cuda'" in str(caught.value) and "colour: unknown key" in str(caught.value)


def test_a_file_that_differs_from_its_manifest_is_named(
    pipelines: dict[str, Path], tmp_path: Path
) -> None:
    """A directory with a sha256 manifest whose scheduler config changed fails naming it."""
    from mortred_twisted.models.diffusion.manifest import write_manifest

    checked = copy(pipelines["ddpm"], tmp_path / "ddpm")
    write_manifest(checked)
    config = checked / "scheduler" / "scheduler_config.json"
    config.write_text(config.read_text().replace("1000", "999"))
    with pytest.raises(ModelLoadError, match=r"scheduler_config.json"):
        create_model("diffusers", {"path": str(checked)}, Path("."))


def test_sdxl_needs_its_second_text_encoder(pipelines: dict[str, Path], tmp_path: Path) -> None:
    """An SDXL directory without text_encoder_2/ fails naming it."""
    broken = copy(pipelines["sdxl"], tmp_path / "xl")
    shutil.rmtree(broken / "text_encoder_2")
    with pytest.raises(ModelLoadError, match=r"missing part 'text_encoder_2'"):
        create_model("diffusers", {"path": str(broken)}, Path("."))

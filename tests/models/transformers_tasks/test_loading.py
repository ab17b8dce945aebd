"""Loading ``type = "transformers"``: the task from the directory, and a directory
that does not match failing with a message naming the missing part."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.registry import create_model
from mortred_twisted.models.transformers_tasks.loader import TASKS, infer_task
from tests.models.transformers_tasks import layouts
from tests.models.transformers_tasks.conftest import TransformersServer

Layout = Callable[[str], Path]


def copy_of(layout: Layout, task: str, tmp_path: Path) -> Path:
    target = tmp_path / task
    shutil.copytree(layout(task), target)
    return target


@pytest.mark.parametrize("task", sorted(layouts.BUILDERS))
def test_the_task_is_read_from_config_json(layout: Layout, task: str) -> None:
    """Each public layout's config.json names its task (architectures, model_type)."""
    assert infer_task(layouts.config_of(layout(task))) == task


def test_a_config_naming_no_served_task_gives_none() -> None:
    """A text model's config names no vision task."""
    assert infer_task({"architectures": ["BertForMaskedLM"], "model_type": "bert"}) is None


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        ("config.json", "config.json missing"),
        ("model.safetensors", "weights missing"),
        ("preprocessor_config.json", "preprocessor_config.json (the image processor) missing"),
    ],
)
def test_a_missing_part_is_named(layout: Layout, tmp_path: Path, remove: str, named: str) -> None:
    """Without its config, weights or image processor a directory fails loading with
    a message naming the part (task given, so the config is not needed to pick it)."""
    directory = copy_of(layout, "image-classification", tmp_path)
    (directory / remove).unlink()
    with pytest.raises(ModelLoadError, match=named.replace("(", r"\(").replace(")", r"\)")):
        create_model(
            "transformers", {"pretrained": str(directory), "task": "image-classification"}, tmp_path
        )


def test_a_clip_directory_without_its_tokenizer_is_refused(layout: Layout, tmp_path: Path) -> None:
    """The zero-shot task needs the tokenizer: its absence is named."""
    directory = copy_of(layout, "zero-shot-image-classification", tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).unlink()
    with pytest.raises(ModelLoadError, match="the tokenizer missing"):
        create_model("transformers", {"pretrained": str(directory)}, tmp_path)


def test_unknown_task_missing_directory_and_unknown_option(layout: Layout, tmp_path: Path) -> None:
    """An unknown task lists the known ones; a missing directory and an unknown
    option are named."""
    directory = layout("image-classification")
    with pytest.raises(ModelLoadError, match="unknown task 'captioning'; known: depth-estimation"):
        create_model("transformers", {"pretrained": str(directory), "task": "captioning"}, tmp_path)
    with pytest.raises(ModelLoadError, match="pretrained directory not found"):
        create_model("transformers", {"pretrained": str(tmp_path / "nope")}, tmp_path)
    with pytest.raises(ModelLoadError, match=r"unknown model option\(s\) \['colour'\]"):
        create_model("transformers", {"pretrained": str(directory), "colour": "red"}, tmp_path)
    with pytest.raises(ModelLoadError, match="needs pretrained"):
        create_model("transformers", {}, tmp_path)


def test_a_directory_of_another_task_is_refused(layout: Layout, tmp_path: Path) -> None:
    """A detector directory asked to classify fails naming the auto class."""
    with pytest.raises(ModelLoadError, match="cannot load AutoModelForImageClassification"):
        create_model(
            "transformers",
            {"pretrained": str(layout("object-detection")), "task": "image-classification"},
            tmp_path,
        )


def test_a_text_model_directory_names_no_task(tmp_path: Path) -> None:
    """A config.json of a model we do not serve asks for ``task``."""
    (tmp_path / "config.json").write_text('{"architectures": ["BertForMaskedLM"]}')
    with pytest.raises(ModelLoadError, match="names no task served here; set task"):
        create_model("transformers", {"pretrained": str(tmp_path)}, tmp_path)


def test_a_server_over_a_broken_directory_is_not_ready(layout: Layout, tmp_path: Path) -> None:
    """The server over a directory without weights stays not ready and says why."""
    directory = copy_of(layout, "depth-estimation", tmp_path)
    (directory / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="weights missing"):
        TransformersServer(directory)


def test_every_task_has_its_class() -> None:
    """The task table names importable ServedModel classes."""
    from mortred_twisted.models.transformers_tasks.loader import task_class
    from mortred_twisted.sdk import ServedModel

    assert all(issubclass(task_class(task), ServedModel) for task in TASKS)

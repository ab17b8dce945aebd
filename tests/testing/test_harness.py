"""ModelHarness: a served model run in process, recorded as the server would see it."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from mortred_twisted.model_api.base import InvalidRequest, ModelLoadError, RunCancelled
from mortred_twisted.sdk import File, Image
from mortred_twisted.testing import ModelHarness
from mortred_twisted.testing.conformance import tiny_png
from mortred_twisted.testing.harness import inputs_from_pairs
from tests.testing import models

PNG = tiny_png()


def test_a_run_returns_the_output_with_its_file_progress_and_events() -> None:
    """The output describes the result file as the server does; its bytes, every
    progress report and the emitted events are recorded."""
    harness = ModelHarness(models.Inverts, {"scale": 2.0})
    result = harness.run(image=PNG, amount=1.5, steps=3)
    assert result.ok and not result.cancelled
    data = result.files["output.png"]
    assert data[:-1] == PNG[:-1] and data[-1] == 255 - PNG[-1]
    assert result.output == {
        "url": "/jobs/job_harness/files/output.png",
        "name": "output.png",
        "content_type": "image/png",
        "size": len(PNG),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    assert result.progress == [(1, 3), (2, 3), (3, 3)]
    assert result.events == [("preview", {"step": 1, "amount": 3.0})]
    assert isinstance(result.file("output.png"), Image)


@pytest.mark.parametrize(
    "value",
    [
        Image(PNG),
        File(PNG, "image/png"),
        PNG,
        base64.b64encode(PNG).decode(),
        "data:image/png;base64," + base64.b64encode(PNG).decode(),
    ],
    ids=["Image", "File", "bytes", "base64", "data-uri"],
)
def test_an_image_input_takes_every_python_form(value: object) -> None:
    """Image/File objects, bytes, base64 and data: URIs all reach predict as the same
    picture."""
    result = ModelHarness(models.Inverts).run(image=value, steps=1)
    assert result.files["output.png"][:-1] == PNG[:-1]


def test_an_image_input_takes_a_path(tmp_path: Path) -> None:
    """A Path (or a str naming a file) is read."""
    picture = tmp_path / "cat.png"
    picture.write_bytes(PNG)
    harness = ModelHarness(models.Inverts)
    assert harness.run(image=picture, steps=1).files["output.png"][:-1] == PNG[:-1]
    assert harness.run(image=str(picture), steps=1).ok


def test_setup_runs_once_with_the_options_and_never_for_validation() -> None:
    """validate() needs no setup; the first run sets the model up, later runs reuse it."""
    harness = ModelHarness(models.Inverts, {"scale": 3.0})
    harness.validate(image=PNG)
    assert harness.setups == 0
    harness.run(image=PNG, steps=1)
    harness.run(image=PNG, steps=1)
    assert harness.setups == 1 and harness.model.instance.calls == 2
    assert harness.model.instance.options == {"scale": 3.0}


def test_validate_raises_the_servers_422_field_and_message() -> None:
    """A bound, an unknown key and a missing input raise InvalidRequest naming
    params.<input> with the message the server's 422 carries."""
    harness = ModelHarness(models.Inverts)
    with pytest.raises(InvalidRequest) as bound:
        harness.validate(image=PNG, amount=9)
    assert bound.value.field == "params.amount"
    assert bound.value.message == "must be <= 4.0 (got 9.0)"
    with pytest.raises(InvalidRequest) as unknown:
        harness.validate({"image": PNG, "amont": 1})
    assert (
        unknown.value.field == "params.amont" and "did you mean 'amount'" in unknown.value.message
    )
    with pytest.raises(InvalidRequest) as missing:
        harness.validate(amount=1)
    assert (missing.value.field, missing.value.message) == ("params.image", "is required")
    assert harness.validate(image=PNG)["steps"] == 4  # defaults filled in


def test_a_run_with_bad_inputs_raises_before_predict() -> None:
    """run() refuses what the server refuses; the model never ran."""
    harness = ModelHarness(models.Inverts)
    with pytest.raises(InvalidRequest):
        harness.run(image=PNG, steps=0)
    assert harness.setups == 0


def test_cancel_at_a_step_ends_the_run_with_run_cancelled() -> None:
    """cancel_at_step=2: the model stops at its next check; the partial run (progress
    up to the cancel) rides on the exception."""
    harness = ModelHarness(models.Inverts)
    with pytest.raises(RunCancelled) as cancelled:
        harness.run(image=PNG, steps=10, cancel_at_step=2)
    run = cancelled.value.run
    assert run.progress == [(1, 10), (2, 10)] and run.cancelled
    assert not run.returned_after_cancel and run.files == {}


def test_cancel_before_the_start_never_calls_predict() -> None:
    """cancel_at_step=0 is a job cancelled while pending."""
    harness = ModelHarness(models.Inverts)
    result = harness.attempt(image=PNG, cancel_at_step=0)
    assert result.cancelled and result.progress == [] and harness.model.instance.calls == 0


def test_a_model_that_ignores_cancel_still_ends_cancelled_and_says_so() -> None:
    """As on the server, a result that comes after a cancel is discarded."""
    result = ModelHarness(models.IgnoresCancel).attempt(steps=5, cancel_at_step=1)
    assert result.cancelled and result.returned_after_cancel
    assert result.progress_after_cancel == 4 and result.output is None


def test_a_batch_answers_each_item_with_its_own_output_or_error() -> None:
    """predict_batch's per-item exception and a validation error fail only their item."""
    results = ModelHarness(models.Batches).run_batch([{"x": 1}, {"x": 13}, {"x": "no"}, {"x": 4}])
    assert [r.output for r in results] == [2, None, None, 8]
    assert isinstance(results[1].error, ValueError) and str(results[1].error) == "unlucky"
    assert isinstance(results[2].error, InvalidRequest) and results[2].error.field == "params.x"


def test_batch_items_keep_their_own_files() -> None:
    """Each item of a batch has its own result files and job URL."""
    results = ModelHarness(models.Inverts).run_batch([{"image": PNG, "steps": 1}] * 2)
    urls = [r.output["url"] for r in results]
    assert len(set(urls)) == 2 and all(r.files for r in results)


def test_a_streaming_model_records_each_yield_as_an_output_event() -> None:
    """The result is the list of yields; each is an output event after its preview."""
    result = ModelHarness(models.Frames).run(n=2)
    assert [f["name"] for f in result.output] == ["output-0.txt", "output-1.txt"]
    assert result.files == {"output-0.txt": b"frame 0", "output-1.txt": b"frame 1"}
    assert [name for name, _ in result.events] == ["preview", "output", "preview", "output"]
    assert result.events_named("output") == result.output


def test_a_dataclass_output_names_its_files_after_its_fields() -> None:
    """Report.picture is stored as picture.png."""
    result = ModelHarness(models.Structured).run(label="ab", count=2)
    assert result.output["label"] == "abab" and result.output["picture"]["name"] == "picture.png"
    assert result.files["picture.png"].endswith(b"ab")


def test_list_file_inputs_take_a_list_of_python_values() -> None:
    """Each item of a list[File] input may be bytes or a File."""
    assert ModelHarness(models.TakesFiles).run(files=[b"abc", File(b"de")]).output == 5


def test_targets_load_by_module_path_and_by_file(tmp_path: Path) -> None:
    """module:Class and file.py:Class (relative to base) name the same kind of model."""
    assert ModelHarness("tests.testing.models:IgnoresCancel").run(steps=2).output == 2
    (tmp_path / "m.py").write_text(Path(models.__file__).read_text())
    harness = ModelHarness("m.py:IgnoresCancel", base=tmp_path)
    assert harness.run(steps=3).output == 3


def test_a_failing_setup_is_a_load_error_naming_the_model() -> None:
    """setup's exception is a ModelLoadError, as the server's /healthz reason."""
    harness = ModelHarness(models.SetupFails)
    with pytest.raises(
        ModelLoadError, match=r"model SetupFails: setup\(\) failed: FileNotFoundError"
    ):
        harness.run()


def test_command_line_pairs_become_inputs(tmp_path: Path) -> None:
    """name=@file reads bytes (an Image for an image input), str inputs keep text,
    others parse as JSON, and a repeated name makes a list."""
    (tmp_path / "cat.png").write_bytes(PNG)
    decl = ModelHarness(models.Inverts).declaration
    got = inputs_from_pairs(decl, [f"image=@{tmp_path / 'cat.png'}", "amount=2", "steps=3"])
    assert isinstance(got["image"], Image) and got["image"].read() == PNG
    assert got["amount"] == 2 and got["steps"] == 3
    twice = [f"files=@{tmp_path / 'cat.png'}"] * 2
    files = inputs_from_pairs(ModelHarness(models.TakesFiles).declaration, twice)
    assert [type(f) for f in files["files"]] == [File, File]
    assert inputs_from_pairs(ModelHarness(models.Structured).declaration, ["label=12"]) == {
        "label": "12"
    }
    with pytest.raises(ValueError, match="name=value"):
        inputs_from_pairs(decl, ["amount"])


def test_an_image_input_takes_a_pil_picture_and_a_numpy_array() -> None:
    """Both are sent as PNG: the model reads the same pixels back."""
    import numpy as np
    from PIL import Image as PILImage

    pixels = np.zeros((4, 5, 3), dtype=np.uint8)
    pixels[1, 2] = (10, 20, 30)
    harness = ModelHarness(models.Inverts)
    for value in (pixels, PILImage.fromarray(pixels)):
        sent = harness.validate(image=value)["image"]
        assert sent["content_type"] == "image/png"
        assert harness.run(image=value, steps=1).files["output.png"].startswith(b"\x89PNG")

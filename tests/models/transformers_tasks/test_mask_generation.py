"""SAM mask generation (``task = "mask-generation"``) on a directory in sam-vit-base's
layout: 1024 px input, 16 px patches (the geometry of the issue-28 report)."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mortred_twisted.model_api.base import ModelLoadError
from mortred_twisted.models.diffusion.manifest import write_manifest
from mortred_twisted.models.registry import create_model
from mortred_twisted.models.transformers_tasks.sam.masks import rle_to_mask
from tests.models.transformers_tasks import layouts
from tests.models.transformers_tasks.conftest import png

OPEN = {"pred_iou_thresh": 0.0, "stability_score_thresh": 0.0, "stability_score_offset": 0.0}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.slow
def test_sam_vit_base_layout_runs_a_200x150_picture(layout, serve) -> None:
    """A 1024-px / 16-px SAM directory segments a 200×150 picture as a job (the
    report's failing case): masks of the picture's size, progress per batch."""
    srv = serve(layout("mask-generation"), points_per_side=2, **OPEN)
    job = srv.submit(image=b64(png(200, 150))).json()
    status = srv.wait(job["job_id"])
    assert status["state"] == "done", status
    data = srv.result(job["job_id"])["data"]
    assert (data["width"], data["height"]) == (200, 150)
    assert data["masks"], "open filters keep masks"
    for mask in data["masks"]:
        assert rle_to_mask(mask["segmentation"]).shape == (150, 200)
        assert mask["area"] == int(rle_to_mask(mask["segmentation"]).sum())
    assert data["overlay"] is None


@pytest.mark.slow
def test_png_masks_and_overlay_are_result_files(layout, serve) -> None:
    """output_mode binary_mask_png returns each mask as a PNG file; return_overlay a
    colour overlay of the picture's size."""
    srv = serve(layout("mask-generation"), **OPEN)
    data = srv.run(
        image=b64(png(64, 48)),
        points_per_side=1,
        output_mode="binary_mask_png",
        return_overlay=True,
    )["data"]
    files = srv.files_of(data)
    assert data["masks"]
    for mask in data["masks"]:
        picture = np.asarray(Image.open(io.BytesIO(files[mask["segmentation"]["name"]])))
        assert picture.shape == (48, 64) and set(np.unique(picture)) <= {0, 255}
    overlay = Image.open(io.BytesIO(files[data["overlay"]["name"]]))
    assert overlay.size == (64, 48) and overlay.mode == "RGB"


@pytest.mark.slow
def test_a_bad_amg_input_is_a_422(layout, serve) -> None:
    """An AMG input outside its range, or an unknown output mode, is refused."""
    srv = serve(layout("mask-generation"))
    assert srv.submit(image=b64(png()), points_per_side=0).code == 422
    assert srv.submit(image=b64(png()), output_mode="polygons").code == 422


def test_the_reported_directory_is_refused_at_load_naming_the_keys(tmp_path: Path) -> None:
    """sam-vit-base's layout at width 64 with num_pos_feats 128 left in (which SamModel
    itself cannot run: ``tensor a (64) … tensor b (256)``) fails loading, naming the
    keys, as SAM_AMG and as the transformers type, instead of failing its first job."""
    layouts.sam_vit_base_default_pos_feats(tmp_path)
    with pytest.raises(ModelLoadError, match="num_pos_feats = 128 makes 256-channel"):
        create_model("transformers", {"pretrained": str(tmp_path)}, tmp_path)
    write_manifest(tmp_path)
    with pytest.raises(ModelLoadError, match="num_pos_feats = 128 makes 256-channel"):
        create_model("SAM_AMG", {"pretrained": str(tmp_path)}, tmp_path)


@pytest.mark.slow
def test_sam_amg_serves_the_sam_vit_base_layout(layout: Callable[[str], Path], tmp_path) -> None:
    """SAM_AMG itself runs a 1024-px / 16-px directory on a 200×150 picture (its
    geometry follows the checkpoint's config: 256-px low-resolution masks)."""
    import shutil

    from mortred_twisted.model_api.base import InferenceRequest, RunContext

    directory = tmp_path / "sam"
    shutil.copytree(layout("mask-generation"), directory)
    write_manifest(directory)
    model = create_model(
        "SAM_AMG", {"pretrained": str(directory), "points_per_side": 2, **OPEN}, tmp_path
    )
    assert model.instance.generator.prompter.low_res == 256
    request = model.validate(InferenceRequest(req_id="r", images=[png(200, 150)], params={}))
    data = model.run(request, RunContext())
    assert (data["width"], data["height"]) == (200, 150) and data["masks"]


@pytest.mark.slow
def test_a_processor_of_another_size_is_refused(layout, tmp_path: Path) -> None:
    """An image processor padding to another size than the encoder's input is named."""
    import json
    import shutil

    directory = tmp_path / "sam"
    shutil.copytree(layout("mask-generation"), directory)
    path = directory / "preprocessor_config.json"
    doc = json.loads(path.read_text())
    doc["pad_size"] = {"height": 256, "width": 256}
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelLoadError, match=r"pad_size.height = 256 but vision_config.image_size"):
        create_model("transformers", {"pretrained": str(directory)}, tmp_path)


def test_each_kept_mask_is_resized_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator resizes each kept low-resolution mask to full size once (it
    used to build every full-size mask twice)."""
    from mortred_twisted.models.transformers_tasks.sam.amg import AmgConfig, AutomaticMaskGenerator

    model = create_model("SAM_AMG", {}, Path.cwd())
    generator = model.instance.generator
    resized: list[int] = []
    original = AutomaticMaskGenerator._upscale

    def counting(logits, crop_box, config):
        resized.append(len(logits))
        return original(logits, crop_box, config)

    monkeypatch.setattr(AutomaticMaskGenerator, "_upscale", staticmethod(counting))
    rgb = np.asarray(Image.open("demo_data/perception/scene_1.png").convert("RGB"))
    records = generator.generate(rgb, AmgConfig(points_per_side=8, **OPEN))
    assert records
    assert sum(resized) == len(records)


def test_a_cancel_stops_mask_generation_between_batches() -> None:
    """A job cancelled after its first prompt batch stops there (RunCancelled), with
    progress reported per batch until then."""
    from mortred_twisted.model_api.base import InferenceRequest, RunCancelled, RunContext

    model = create_model(
        "transformers", {"pretrained": "weights/perception/sam_amg", **OPEN}, Path.cwd()
    )
    steps: list[tuple[int, int]] = []

    def on_progress(step: int, total: int) -> None:
        steps.append((step, total))
        if step == 1:
            ctx.cancel()

    ctx = RunContext(on_progress)
    raw = InferenceRequest(
        req_id="c",
        images=(),
        params={"image": b64(png(64, 48)), "points_per_side": 8, "points_per_batch": 16},
    )
    with pytest.raises(RunCancelled):
        model.run(model.validate(raw), ctx)
    assert steps == [(0, 4), (1, 4)]

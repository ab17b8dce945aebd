"""Each pipeline kind on its own (no server): its declared inputs, its pictures, its
422s naming the input, progress, previews and cancellation between steps."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image

from mortred_twisted.model_api.base import (
    InferenceRequest,
    InvalidRequest,
    Model,
    RunCancelled,
    RunContext,
)

MakeModel = Callable[..., Model]


def picture(size: tuple[int, int] = (32, 32), colour: tuple[int, int, int] = (200, 30, 30)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def run(model: Model, params: dict[str, Any], ctx: RunContext | None = None) -> tuple[Any, Any]:
    """Validate and run one request; (data, events)."""
    ctx = ctx or RunContext()
    events: list[tuple[str, Any]] = []
    ctx.on_event = lambda name, data: events.append((name, data))
    data = model.run(model.validate(InferenceRequest("r", params=params)), ctx)
    return data, events


def decoded(data: dict[str, Any]) -> list[np.ndarray]:
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(i["base64"])))) for i in data["images"]
    ]


def invalid(model: Model, params: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        model.validate(InferenceRequest("r", params=params))
    return caught.value


def test_text_to_image_declares_its_inputs(make_model: MakeModel) -> None:
    """The declaration lists the prompt inputs; prompt is required."""
    model = make_model("sd")
    names = [d.name for d in model.declaration.inputs]  # type: ignore[attr-defined]
    assert names == ["prompt", "negative_prompt", "guidance_scale", "sample_steps", "scheduler",
                     "seed", "num_images", "width", "height", "preview_every"]  # fmt: skip
    assert invalid(model, {}).field == "params.prompt"


def test_text_to_image_pictures_progress_and_previews(make_model: MakeModel) -> None:
    """Two 32x32 PNGs, progress to the last step, a preview every 2 steps, and the
    same seed gives the same bytes."""
    model = make_model("sd")
    ctx = RunContext()
    params = {"prompt": "a red circle", "sample_steps": 4, "seed": 3, "num_images": 2,
              "preview_every": 2, "scheduler": "ddim"}  # fmt: skip
    data, events = run(model, params, ctx)
    assert (data["seed"], data["steps"], data["scheduler"]) == (3, 4, "ddim")
    assert [p.shape for p in decoded(data)] == [(32, 32, 3)] * 2
    assert ctx.last_progress == (4, 4)
    assert [(name, e["step"], len(e["preview"])) for name, e in events] == [("preview", 2, 2)]
    again, _ = run(model, params)
    assert [i["sha256"] for i in again["images"]] == [i["sha256"] for i in data["images"]]


@pytest.mark.parametrize("scheduler", ["ddpm", "dpmsolver++", "euler-ancestral", "unipc"])
def test_every_shipped_solver_runs(make_model: MakeModel, scheduler: str) -> None:
    """Each solver we ship samples a finite picture on a Stable Diffusion UNet."""
    data, _ = run(make_model("sd"), {"prompt": "blue", "sample_steps": 3, "seed": 1,
                                     "scheduler": scheduler})  # fmt: skip
    assert data["scheduler"] == scheduler and len(decoded(data)) == 1


def test_sizes_the_unet_takes(make_model: MakeModel) -> None:
    """width 40 is a 40x48 picture; 34 (the tiny VAE scales by 4) and sizes over the
    bound are 422s naming the input, as are too many images and an unknown solver."""
    model = make_model("sd", max_width=64, max_height=64)
    data, _ = run(model, {"prompt": "a", "sample_steps": 2, "width": 40, "height": 48})
    assert decoded(data)[0].shape == (48, 40, 3)
    assert invalid(model, {"prompt": "a", "width": 34}).field == "params.width"
    assert "multiple of 4" in invalid(model, {"prompt": "a", "width": 34}).message
    assert invalid(model, {"prompt": "a", "height": 72}).field == "params.height"
    assert invalid(model, {"prompt": "a", "num_images": 5}).field == "params.num_images"
    assert invalid(model, {"prompt": "a", "scheduler": "plms"}).field == "params.scheduler"
    assert invalid(model, {"prompt": "a", "colour": 1}).field == "params.colour"


def test_cancel_between_steps(make_model: MakeModel) -> None:
    """A run cancelled after its second step stops there (progress 2 of 50)."""
    model = make_model("sd")
    ctx = RunContext()
    ctx._on_progress = lambda step, total: ctx.cancel() if step == 2 else None
    with pytest.raises(RunCancelled):
        run(model, {"prompt": "a", "sample_steps": 50}, ctx)
    assert ctx.last_progress == (2, 50)


def test_image_to_image_follows_its_picture(make_model: MakeModel) -> None:
    """strength 0.5 of 4 steps runs 2 steps on a 40x32 picture; a strength that leaves
    no step and a missing picture are 422s naming them."""
    model = make_model("sd", task="image-to-image")
    ctx = RunContext()
    data, events = run(model, {"image": picture((40, 32)), "prompt": "red", "strength": 0.5,
                               "sample_steps": 4, "seed": 2, "preview_every": 1}, ctx)  # fmt: skip
    assert decoded(data)[0].shape == (32, 40, 3)
    assert ctx.last_progress == (2, 2) and [e["step"] for _, e in events] == [1]
    assert invalid(model, {"prompt": "a"}).field == "params.image"
    assert invalid(model, {"image": picture(), "prompt": "a", "strength": 0.1,
                           "sample_steps": 4}).field == "params.strength"  # fmt: skip


def test_inpainting_with_a_mask(make_model: MakeModel) -> None:
    """A 9-channel inpainting checkpoint and a plain SD checkpoint both repaint a
    masked picture; a mask of another size is a 422 naming params.mask."""
    mask = picture((32, 32), (255, 255, 255))
    for name, task in (("inpaint", "auto"), ("sd", "inpainting")):
        model = make_model(name, task=task)
        data, _ = run(model, {"image": picture(), "mask": mask, "prompt": "green",
                              "sample_steps": 2, "seed": 1})  # fmt: skip
        assert decoded(data)[0].shape == (32, 32, 3)
    with pytest.raises(InvalidRequest) as caught:
        run(model, {"image": picture(), "mask": picture((16, 16)), "prompt": "g",
                    "sample_steps": 2})  # fmt: skip
    assert caught.value.field == "params.mask"


def test_class_conditional_dit(make_model: MakeModel) -> None:
    """One picture per class id, guided; an id past the classes is a 422 naming it."""
    model = make_model("dit")
    ctx = RunContext()
    data, _ = run(model, {"class_ids": [0, 2], "sample_steps": 3, "seed": 4,
                          "guidance_scale": 3.0}, ctx)  # fmt: skip
    assert [p.shape for p in decoded(data)] == [(32, 32, 3)] * 2
    assert ctx.last_progress == (3, 3)
    assert invalid(model, {"class_ids": [0, 1000]}).field == "params.class_ids[1]"


def test_unconditional_ddpm(make_model: MakeModel) -> None:
    """num_images 16x16 pictures from noise with the ancestral sampler; previews of x0."""
    model = make_model("ddpm", max_num_images=3)
    data, events = run(model, {"num_images": 3, "sample_steps": 4, "seed": 5,
                               "scheduler": "ddpm", "preview_every": 2})  # fmt: skip
    assert [p.shape for p in decoded(data)] == [(16, 16, 3)] * 3
    assert [e["step"] for _, e in events] == [2]
    assert invalid(model, {"num_images": 4}).field == "params.num_images"


def test_sdxl_text_to_image_and_image_to_image(make_model: MakeModel) -> None:
    """An SDXL directory (two text encoders, text_time conditioning) serves a prompt
    through diffusers' call with our solver, progress and previews (one run at a time),
    and a picture through its image-to-image pipeline."""
    model = make_model("sdxl")
    assert model.run_capacity == 1 and model.step_batch() is None
    ctx = RunContext()
    data, events = run(model, {"prompt": "a red circle", "sample_steps": 3, "seed": 1,
                               "scheduler": "euler", "preview_every": 1}, ctx)  # fmt: skip
    assert decoded(data)[0].shape == (32, 32, 3) and data["scheduler"] == "euler"
    assert ctx.last_progress == (3, 3) and [e["step"] for _, e in events] == [1, 2]
    again, _ = run(model, {"prompt": "a red circle", "sample_steps": 3, "seed": 1,
                           "scheduler": "euler"})  # fmt: skip
    assert again["images"][0]["sha256"] == data["images"][0]["sha256"]
    img2img = make_model("sdxl", task="image-to-image")
    data, _ = run(img2img, {"image": picture((40, 32)), "prompt": "blue", "strength": 0.5,
                            "sample_steps": 4, "seed": 2})  # fmt: skip
    assert decoded(data)[0].shape == (32, 40, 3)

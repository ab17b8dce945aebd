"""The unbatched kinds' runs (worker thread): diffusers' own pipeline calls where
they take a step callback (image-to-image, inpainting, SDXL), our loop over the
components where they do not (DiT, DDPM/DDIM: diffusers' calls there have no
callback, so no progress or cancel per step).

Every run gets a fresh scheduler of the name asked (``schedulers.py``, from the
pipeline's own scheduler config) and one CPU generator seeded with its seed; each
step reports progress, emits a preview when due and checks cancellation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from mortred_twisted.models.diffusers_pipelines import sampling
from mortred_twisted.models.diffusion import schedulers
from mortred_twisted.sdk import Context

if TYPE_CHECKING:
    from mortred_twisted.models.diffusers_pipelines.sampling import TextPlan

#: The kind instance a run belongs to (``kinds.TextToImage``, ``ImageToImage``,
#: ``ClassConditional``, ``Unconditional``): typed loosely so that this module, which
#: ``kinds`` imports, does not import ``kinds`` back.
Kind = Any


def _callback(model: Any, ctx: Context, every: int) -> Any:
    """diffusers' ``callback_on_step_end``: progress, previews, cancellation."""
    previews = sampling.Previews(ctx, every, model.preview_images)

    def on_step_end(pipe: Any, i: int, t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        total = int(getattr(pipe, "_num_timesteps", 0) or i + 1)
        ctx.progress(min(i + 1, total), total)
        previews.after(i + 1, total, None, tensors["latents"])
        ctx.check_cancelled()
        return tensors

    return on_step_end


def _pictures01(images: torch.Tensor) -> Any:
    return sampling.to_pictures(images.float() * 2.0 - 1.0)


def _use_scheduler(pipe: Any, model: Any, name: str) -> None:
    pipe.scheduler = schedulers.make(name, model.scheduler_base)


def text_to_image_xl(model: Kind, ctx: Context, plan: TextPlan) -> sampling.Generated:
    """SDXL through ``StableDiffusionXLPipeline.__call__`` (unbatched)."""
    pipe = model.xl_pipe
    _use_scheduler(pipe, model, plan.scheduler)
    ctx.check_cancelled()
    out = pipe(
        prompt=plan.prompt, negative_prompt=plan.negative_prompt or None,
        guidance_scale=plan.guidance_scale, num_inference_steps=plan.steps,
        num_images_per_prompt=plan.num_images, width=plan.width, height=plan.height,
        generator=sampling.generator(plan.seed), output_type="pt",
        callback_on_step_end=_callback(model, ctx, plan.preview_every),
        callback_on_step_end_tensor_inputs=["latents"],
    )  # fmt: skip
    return sampling.Generated(images=_pictures01(out.images), seed=plan.seed, steps=plan.steps,
                              scheduler=plan.scheduler, width=plan.width,
                              height=plan.height)  # fmt: skip


def conditioned(model: Kind, ctx: Context, kwargs: Mapping[str, Any]) -> sampling.Generated:
    """Image-to-image or inpainting through diffusers' ``AutoPipelineFor…`` call."""
    model.check_inputs(kwargs)
    picture = kwargs["image"].to_pil("RGB")
    multiple = model.vae_scale
    width = kwargs.get("width") or max(multiple, picture.width // multiple * multiple)
    height = kwargs.get("height") or max(multiple, picture.height // multiple * multiple)
    sampling.check_size(width, height, multiple, model.max_width, model.max_height)
    picture = picture.resize((width, height))
    extra: dict[str, Any] = {}
    if "mask" in kwargs:
        mask = kwargs["mask"].to_pil("L")
        if mask.size != kwargs["image"].to_pil().size:
            from mortred_twisted.model_api.base import InvalidRequest

            raise InvalidRequest(
                "params.mask", f"is {mask.size[0]}x{mask.size[1]}; the image is "
                f"{picture.width}x{picture.height} before resizing: give the same size"
            )  # fmt: skip
        extra = {"mask_image": mask.resize((width, height)), "width": width, "height": height}
    steps = kwargs.get("sample_steps") or model.opts.sample_steps
    name = kwargs.get("scheduler") or model.opts.scheduler
    seed = sampling.fresh_seed(kwargs.get("seed"))
    _use_scheduler(model.pipe, model, name)
    ctx.check_cancelled()
    out = model.pipe(
        prompt=kwargs["prompt"], negative_prompt=kwargs.get("negative_prompt") or None,
        image=picture, strength=kwargs["strength"],
        guidance_scale=model.guidance(kwargs.get("guidance_scale")), num_inference_steps=steps,
        num_images_per_prompt=kwargs.get("num_images") or 1,
        generator=sampling.generator(seed), output_type="pt",
        callback_on_step_end=_callback(model, ctx, kwargs.get("preview_every") or 0),
        callback_on_step_end_tensor_inputs=["latents"], **extra,
    )  # fmt: skip
    return sampling.Generated(images=_pictures01(out.images), seed=seed,
                              steps=int(getattr(model.pipe, "_num_timesteps", steps)),
                              scheduler=name, width=width, height=height)  # fmt: skip


def class_conditional(model: Kind, ctx: Context, kwargs: Mapping[str, Any]) -> sampling.Generated:
    """DiT: one picture per class id; guided runs pair each row with the "no label" id."""
    ids = list(kwargs["class_ids"])
    scale = model.guidance(kwargs.get("guidance_scale"))
    steps = kwargs.get("sample_steps") or model.opts.sample_steps
    name = kwargs.get("scheduler") or model.opts.scheduler
    seed = sampling.fresh_seed(kwargs.get("seed"))
    scheduler = model.schedulers.fresh(name, steps)
    gen = sampling.generator(seed)
    net, device, channels = model.shared.transformer, model.device, model.latent_channels
    shape = (len(ids), channels, model.latent_size, model.latent_size)
    y = torch.tensor(ids, device=device)
    guided = scale > 1.0
    if guided:
        y = torch.cat([y, torch.full_like(y, model.num_classes)])

    def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        rows = torch.cat([x, x]) if guided else x
        tt = t.to(device, torch.float32).reshape(1).expand(rows.shape[0])
        out = net(rows.to(model.dtype), timestep=tt, class_labels=y).sample[:, :channels].float()
        if not guided:
            return out
        cond, uncond = out.chunk(2)
        return uncond + scale * (cond - uncond)

    with torch.inference_mode():
        x = sampling.noise(shape, gen, device) * scheduler.init_noise_sigma
        previews = sampling.Previews(ctx, kwargs.get("preview_every") or 0, model.preview_images)
        x = sampling.denoise_loop(ctx, scheduler, x, predict, gen, previews)
    images = model.preview_images(x)
    side = model.latent_size * 2 ** (len(model.shared.vae.config.block_out_channels) - 1)
    return sampling.Generated(images=images, seed=seed, steps=len(scheduler.timesteps),
                              scheduler=name, width=side, height=side)  # fmt: skip


def unconditional(model: Kind, ctx: Context, kwargs: Mapping[str, Any]) -> sampling.Generated:
    """DDPM/DDIM pixel pipelines: ``num_images`` pictures from noise."""
    unet, device = model.shared.unet, model.device
    steps = kwargs.get("sample_steps") or model.opts.sample_steps
    name = kwargs.get("scheduler") or model.opts.scheduler
    seed = sampling.fresh_seed(kwargs.get("seed"))
    scheduler = model.schedulers.fresh(name, steps)
    gen = sampling.generator(seed)
    size = unet.config.sample_size
    side = int(size if isinstance(size, int) else size[0])
    shape = (kwargs.get("num_images") or 1, int(unet.config.in_channels), side, side)

    def predict(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        tt = t.to(device, torch.float32).reshape(1).expand(x.shape[0])
        return unet(x.to(model.dtype), tt).sample.float()

    with torch.inference_mode():
        x = sampling.noise(shape, gen, device) * scheduler.init_noise_sigma
        previews = sampling.Previews(ctx, kwargs.get("preview_every") or 0, model.preview_images)
        x = sampling.denoise_loop(ctx, scheduler, x, predict, gen, previews)
    return sampling.Generated(images=model.preview_images(x), seed=seed,
                              steps=len(scheduler.timesteps), scheduler=name, width=side,
                              height=side)  # fmt: skip

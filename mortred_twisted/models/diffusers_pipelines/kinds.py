"""The served pipeline kinds: one :class:`~mortred_twisted.sdk.ServedModel` each.

Each kind's ``predict`` signature is its declaration (inputs, bounds, defaults; the
OpenAPI document and the UI form are built from it). Inputs left out take the
model's configured defaults (``scheduler``, ``sample_steps``, ``guidance_scale``;
``width``/``height``: the checkpoint's native size, or the input picture's). Checks
that depend on the checkpoint or the config (sizes the UNet takes, ``max_num_images``,
class ids, a strength that leaves no step) are :meth:`check_inputs`: run by the
adapter before admission (a 422 naming ``params.<input>``) and again in ``predict``.

* :class:`TextToImage` — ``StableDiffusionPipeline`` (our loop, step-batched, see
  :mod:`.prompt_batch`) and ``StableDiffusionXLPipeline`` (diffusers' own call);
* :class:`ImageToImage`, :class:`Inpainting` — the same checkpoint through
  ``AutoPipelineForImage2Image``/``AutoPipelineForInpainting.from_pipe`` (diffusers'
  call, with our scheduler, progress, previews and cancel in ``callback_on_step_end``);
* :class:`ClassConditional` — ``DiTPipeline`` (our loop; guidance with the "no
  label" id ``num_embeds_ada_norm``);
* :class:`Unconditional` — ``DDPMPipeline``/``DDIMPipeline`` (our loop, pixel space).

Threads: ``setup`` on the loader thread; ``predict`` and ``step_batch``'s calls on
the worker / batch-loop thread, one at a time per instance; ``check_inputs`` on the
reactor thread (plain arithmetic on the request's params).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mortred_twisted.model_api.base import InvalidRequest
from mortred_twisted.models.diffusers_pipelines.sampling import Generated, TextPlan
from mortred_twisted.models.diffusion.schedulers import NAMES
from mortred_twisted.sdk import Context, Image, Input, ServedModel

MAX_SEED = 2**31 - 1
MAX_PROMPT = 2000

# The inputs kinds share (their declarations are read from each predict signature).
PROMPT = Input(description="what to draw", max_length=MAX_PROMPT)
NEGATIVE = Input("", description="what to steer away from (guided runs)", max_length=MAX_PROMPT)
GUIDANCE = Input(None, ge=0.0, le=30.0, description="classifier-free guidance (>1 guides)")
STEPS = Input(None, ge=1, le=1000, description="denoising steps")
SCHEDULER = Input(None, choices=NAMES, description="the solver")
SEED = Input(None, ge=0, le=MAX_SEED, description="the same seed, the same pictures")
NUM_IMAGES = Input(1, ge=1, le=64, description="pictures per run (≤ max_num_images)")
WIDTH = Input(None, ge=8, le=8192, description="pixels (a multiple the UNet takes)")
HEIGHT = Input(None, ge=8, le=8192, description="pixels (a multiple the UNet takes)")
PREVIEW = Input(0, ge=0, le=1000, description="a preview event every N steps (0: none)")


class _Diffusers(ServedModel):
    """What every kind shares: options, the loaded pipeline, the schedulers."""

    default_guidance = 7.5
    run_capacity = 1

    def setup(self) -> None:
        from mortred_twisted.models.diffusers_pipelines import components
        from mortred_twisted.models.diffusers_pipelines.options import read_options
        from mortred_twisted.models.diffusion.pipeline import resolve_device
        from mortred_twisted.models.diffusion.schedulers import FreshSchedulers

        self.opts = read_options(self.options, self.root)
        self.directory = components.inspect_directory(self.opts.path)
        self.task = self.directory.task(self.opts.task)
        self.device = resolve_device(self.opts.device)
        self.dtype = components.resolve_dtype(self.opts.dtype)
        self.shared = components.load_pipeline(
            self.directory, self.device, self.dtype,
            attention_slicing=self.opts.attention_slicing, vae_tiling=self.opts.vae_tiling,
        )  # fmt: skip
        self.scheduler_base = dict(self.shared.scheduler.config)
        self.schedulers = FreshSchedulers(self.scheduler_base, self.device)
        self.max_batch_images = self.opts.max_batch_images
        self.prepare()

    def prepare(self) -> None:
        """The kind's own part of ``setup``."""

    def check_inputs(self, params: Mapping[str, Any]) -> None:
        """Config-dependent checks (see the module docstring); raises InvalidRequest."""
        n = params.get("num_images")
        if n is not None and n > self.opts.max_num_images:
            raise InvalidRequest(
                "params.num_images", f"must be at most {self.opts.max_num_images} (max_num_images)"
            )

    def guidance(self, value: float | None) -> float:
        if value is not None:
            return float(value)
        configured = self.opts.guidance_scale
        return self.default_guidance if configured is None else configured

    def preview_images(self, latents: Any) -> list[Image]:
        """Latents (or pixels) as pictures (previews and results)."""
        import torch

        from mortred_twisted.models.diffusers_pipelines import sampling

        with torch.inference_mode():
            vae = getattr(self.shared, "vae", None)
            pixels = latents if vae is None else sampling.decode(vae, latents)
        return sampling.to_pictures(pixels)


class _LatentSize:
    """Sizes of a VAE + UNet pipeline (mixed into the kinds that take width/height)."""

    shared: Any
    opts: Any

    def sizes(self) -> None:
        unet = self.shared.unet
        self.vae_scale = 2 ** (len(self.shared.vae.config.block_out_channels) - 1)
        self.latent_channels = int(unet.config.in_channels)
        sample = unet.config.sample_size
        native = int(sample if isinstance(sample, int) else sample[0]) * self.vae_scale
        self.native = native
        self.max_width = self.opts.max_width or 2 * native
        self.max_height = self.opts.max_height or 2 * native

    def check_size(self, params: Mapping[str, Any]) -> None:
        from mortred_twisted.models.diffusers_pipelines.sampling import check_size

        width = params.get("width") or self.native
        height = params.get("height") or self.native
        check_size(width, height, self.vae_scale, self.max_width, self.max_height)


class TextToImage(_LatentSize, _Diffusers):
    """A prompt in, pictures out (Stable Diffusion; SDXL through diffusers' call)."""

    def prepare(self) -> None:
        self.sizes()
        self.xl = self.directory.layout == "sdxl"
        self.run_capacity = 1 if self.xl else self.opts.max_running_jobs
        self._batch: Any = None
        if self.xl:  # this instance's own pipeline object (its scheduler is per run)
            import diffusers

            self.xl_pipe = diffusers.StableDiffusionXLPipeline.from_pipe(self.shared)
            self.xl_pipe.set_progress_bar_config(disable=True)

    def step_batch(self) -> Any:
        """The instance's :class:`~.prompt_batch.PromptBatch` (made on first use)."""
        from mortred_twisted.models.diffusers_pipelines.prompt_batch import PromptBatch

        if self._batch is None:
            self._batch = PromptBatch(self, self.max_batch_images)
        return self._batch

    def check_inputs(self, params: Mapping[str, Any]) -> None:
        super().check_inputs(params)
        self.check_size(params)

    def plan(self, kwargs: Mapping[str, Any]) -> TextPlan:
        from mortred_twisted.models.diffusers_pipelines.sampling import fresh_seed

        self.check_inputs(kwargs)
        return TextPlan(
            prompt=kwargs["prompt"], negative_prompt=kwargs.get("negative_prompt") or "",
            guidance_scale=self.guidance(kwargs.get("guidance_scale")),
            steps=kwargs.get("sample_steps") or self.opts.sample_steps,
            scheduler=kwargs.get("scheduler") or self.opts.scheduler,
            seed=fresh_seed(kwargs.get("seed")), num_images=kwargs.get("num_images") or 1,
            width=kwargs.get("width") or self.native, height=kwargs.get("height") or self.native,
            preview_every=kwargs.get("preview_every") or 0,
        )  # fmt: skip

    def encode_text(self, text: str) -> Any:
        """The text encoder's hidden states of ``text``, ``(1, tokens, width)``."""
        tokenizer, encoder = self.shared.tokenizer, self.shared.text_encoder
        ids = tokenizer(text, padding="max_length", max_length=tokenizer.model_max_length,
                        truncation=True, return_tensors="pt").input_ids  # fmt: skip
        return encoder(ids.to(self.device))[0].to(self.dtype)

    def unet_rows(self, x: Any, t: Any, emb: Any) -> Any:
        """One UNet call over rows ``x`` (per-row timesteps ``t``); float32 out."""
        return self.shared.unet(x.to(self.dtype), t, encoder_hidden_states=emb).sample.float()

    def predict(
        self,
        ctx: Context,
        prompt: str = PROMPT,
        negative_prompt: str = NEGATIVE,
        guidance_scale: float | None = GUIDANCE,
        sample_steps: int | None = STEPS,
        scheduler: str | None = SCHEDULER,
        seed: int | None = SEED,
        num_images: int = NUM_IMAGES,
        width: int | None = WIDTH,
        height: int | None = HEIGHT,
        preview_every: int = PREVIEW,
    ) -> Generated:
        kwargs = dict(prompt=prompt, negative_prompt=negative_prompt,
                      guidance_scale=guidance_scale, sample_steps=sample_steps,
                      scheduler=scheduler, seed=seed, num_images=num_images, width=width,
                      height=height, preview_every=preview_every)  # fmt: skip
        if self.xl:
            from mortred_twisted.models.diffusers_pipelines.pipe_call import text_to_image_xl

            return text_to_image_xl(self, ctx, self.plan(kwargs))
        from mortred_twisted.models.diffusers_pipelines.prompt_batch import run_alone

        return run_alone(self, ctx, kwargs)


class ImageToImage(_LatentSize, _Diffusers):
    """A picture and a prompt in, pictures out (the picture noised by ``strength``)."""

    task_pipeline = "AutoPipelineForImage2Image"
    default_strength = 0.75

    def prepare(self) -> None:
        import diffusers

        self.sizes()
        self.pipe = getattr(diffusers, self.task_pipeline).from_pipe(self.shared)
        self.pipe.set_progress_bar_config(disable=True)

    def check_inputs(self, params: Mapping[str, Any]) -> None:
        super().check_inputs(params)
        if params.get("width") or params.get("height"):
            self.check_size({"width": params.get("width") or self.native,
                             "height": params.get("height") or self.native})  # fmt: skip
        strength = params.get("strength", self.default_strength)
        steps = params.get("sample_steps") or self.opts.sample_steps
        if strength is not None and int(steps * strength) < 1:
            raise InvalidRequest(
                "params.strength", f"{strength} of {steps} steps leaves no step to run"
            )

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture to start from"),
        prompt: str = PROMPT,
        negative_prompt: str = NEGATIVE,
        strength: float = Input(0.75, ge=0.0, le=1.0, description="how much to change"),
        guidance_scale: float | None = GUIDANCE,
        sample_steps: int | None = STEPS,
        scheduler: str | None = SCHEDULER,
        seed: int | None = SEED,
        num_images: int = NUM_IMAGES,
        width: int | None = WIDTH,
        height: int | None = HEIGHT,
        preview_every: int = PREVIEW,
    ) -> Generated:
        from mortred_twisted.models.diffusers_pipelines.pipe_call import conditioned

        return conditioned(self, ctx, locals())


class Inpainting(ImageToImage):
    """A picture, a mask (white: repaint) and a prompt in, pictures out."""

    task_pipeline = "AutoPipelineForInpainting"
    default_strength = 1.0

    def predict(  # type: ignore[override]
        self,
        ctx: Context,
        image: Image = Input(description="the picture to repaint"),
        mask: Image = Input(description="white where to repaint, the picture's size"),
        prompt: str = PROMPT,
        negative_prompt: str = NEGATIVE,
        strength: float = Input(1.0, ge=0.0, le=1.0, description="how much to change"),
        guidance_scale: float | None = GUIDANCE,
        sample_steps: int | None = STEPS,
        scheduler: str | None = SCHEDULER,
        seed: int | None = SEED,
        num_images: int = NUM_IMAGES,
        width: int | None = WIDTH,
        height: int | None = HEIGHT,
        preview_every: int = PREVIEW,
    ) -> Generated:
        from mortred_twisted.models.diffusers_pipelines.pipe_call import conditioned

        return conditioned(self, ctx, locals())


class ClassConditional(_Diffusers):
    """Class ids in, one picture per id out (DiT)."""

    default_guidance = 4.0

    def prepare(self) -> None:
        config = self.shared.transformer.config
        self.num_classes = int(config.num_embeds_ada_norm)
        self.latent_channels = int(config.in_channels)
        self.latent_size = int(config.sample_size)
        self.labels = dict(getattr(self.shared, "labels", None) or {})

    def check_inputs(self, params: Mapping[str, Any]) -> None:
        ids = params.get("class_ids") or ()
        if len(ids) > self.opts.max_num_images:
            raise InvalidRequest(
                "params.class_ids", f"at most {self.opts.max_num_images} ids (max_num_images)"
            )
        for i, class_id in enumerate(ids):
            if not 0 <= class_id < self.num_classes:
                raise InvalidRequest(
                    f"params.class_ids[{i}]", f"must be in [0, {self.num_classes - 1}]"
                )

    def predict(
        self,
        ctx: Context,
        class_ids: list[int] = Input((0,), max_items=64, description="one picture per id"),
        guidance_scale: float | None = GUIDANCE,
        sample_steps: int | None = STEPS,
        scheduler: str | None = SCHEDULER,
        seed: int | None = SEED,
        preview_every: int = PREVIEW,
    ) -> Generated:
        from mortred_twisted.models.diffusers_pipelines.pipe_call import class_conditional

        self.check_inputs({"class_ids": class_ids})
        return class_conditional(self, ctx, locals())


class Unconditional(_Diffusers):
    """Pictures from noise (DDPM/DDIM pixel pipelines)."""

    def predict(
        self,
        ctx: Context,
        num_images: int = NUM_IMAGES,
        sample_steps: int | None = STEPS,
        scheduler: str | None = SCHEDULER,
        seed: int | None = SEED,
        preview_every: int = PREVIEW,
    ) -> Generated:
        from mortred_twisted.models.diffusers_pipelines.pipe_call import unconditional

        self.check_inputs({"num_images": num_images})
        return unconditional(self, ctx, locals())


#: task -> the kind that serves it
KINDS: dict[str, type[_Diffusers]] = {
    "text-to-image": TextToImage,
    "image-to-image": ImageToImage,
    "inpainting": Inpainting,
    "class-conditional": ClassConditional,
    "unconditional": Unconditional,
}

"""Text-to-image runs of one instance advanced together: one UNet call per step.

:class:`PromptBatch` is the model side of step batching for the Stable Diffusion
layout (the server side is ``runtime/step_loop.py``; ``sdk/step_batching.py`` adapts it to
the :class:`~mortred_twisted.model_api.base.StepBatch` contract). Each run keeps what
makes it its own run, exactly as a run alone has it: its scheduler object (any of
the solvers we ship, any step count), its CPU generator (its seed: the initial
noise and every stochastic step), its latents, prompt embeddings and guidance
scale. What runs share is the UNet call: per step the model inputs of every run
(``scheduler.scale_model_input``), one timestep per row and the prompt embeddings
are concatenated and the UNet runs over them in chunks of at most ``max_rows`` rows.
Classifier-free guidance (``guidance_scale > 1``) adds a run's rows twice (with the
negative prompt's embedding, then the prompt's, as diffusers orders them) and
combines its own two halves. The text encoder runs once per distinct text among the
runs in the batch (a cache counted by the runs holding each entry).

Per run and per step: ``scheduler.step``; a check that the latents are finite;
``ctx.progress(step, total)``; a ``preview`` event when due; ``ctx.check_cancelled()``
(also before each step, so a cancelled run never costs another UNet call). A run
whose last step is done is decoded by the VAE alone (its bytes do not depend on
its batch mates' decodes) and leaves with its :class:`~.sampling.Generated`. A
failure of one run's own parts (its scheduler, its decode, its previews) is its own
outcome; a failure of the shared UNet call ends every run held.

A run alone (``predict``) goes through this same code as a batch of one, so images
are byte-identical alone and equal within the kernels' batch-size differences in a
batch (≤ 2/255, tests/models/diffusers_pipelines).

Thread contract: one thread at a time calls :meth:`join`, :meth:`step` and
:meth:`abandon` (the server's batch loop, or the thread of a solo run); contexts may
be cancelled from any thread. The networks are shared and only read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from mortred_twisted.model_api.base import SamplingDiverged
from mortred_twisted.models.diffusers_pipelines import sampling
from mortred_twisted.sdk import Context

if TYPE_CHECKING:
    from mortred_twisted.models.diffusers_pipelines.sampling import TextPlan


class TextModel(Protocol):
    """What a :class:`PromptBatch` needs of the model whose runs it steps
    (:class:`~mortred_twisted.models.diffusers_pipelines.kinds.TextToImage` is one):
    the engine depends on this, not on the kind, so the kind may import the engine."""

    device: Any
    schedulers: Any  # .fresh(name, steps)
    latent_channels: int
    vae_scale: int
    max_batch_images: int

    def plan(self, kwargs: Mapping[str, Any]) -> TextPlan: ...

    def encode_text(self, text: str) -> Any: ...

    def unet_rows(self, x: Any, t: Any, emb: Any) -> Any: ...

    def preview_images(self, latents: Any) -> list[Any]: ...


@dataclass(eq=False)
class _Run:
    ctx: Context
    plan: TextPlan
    scheduler: Any
    x: torch.Tensor
    texts: tuple[str, ...]  # the cache keys it holds: (prompt,) or (negative, prompt)
    step_kwargs: dict[str, Any]
    previews: sampling.Previews
    i: int = 0
    timesteps: torch.Tensor = field(default_factory=lambda: torch.empty(0))

    @property
    def guided(self) -> bool:
        return len(self.texts) == 2

    @property
    def rows(self) -> int:
        return self.x.shape[0] * len(self.texts)


class PromptBatch:
    """The text-to-image runs of one instance (see the module docstring)."""

    def __init__(self, model: TextModel, max_rows: int) -> None:
        self._model = model
        self._max_rows = max(1, max_rows)
        self._runs: dict[int, _Run] = {}
        self._texts: dict[str, tuple[torch.Tensor, int]] = {}  # text -> (embedding, holders)
        #: rows of the latest UNet calls and texts encoded (bounded; tests read them)
        self.forward_rows: list[int] = []
        self.encoded: list[str] = []

    @property
    def active(self) -> int:
        return len(self._runs)

    # -- prompts ----------------------------------------------------------------

    def _hold(self, text: str) -> torch.Tensor:
        entry = self._texts.get(text)
        if entry is None:
            embedding = self._model.encode_text(text)
            self.encoded = [*self.encoded[-63:], text]
        else:
            embedding = entry[0]
        self._texts[text] = (embedding, (entry[1] if entry else 0) + 1)
        return embedding

    def _release(self, run: _Run) -> None:
        self._release_texts(run.texts)

    def _release_texts(self, texts: Sequence[str]) -> None:
        for text in texts:
            embedding, holders = self._texts[text]
            if holders <= 1:
                del self._texts[text]
            else:
                self._texts[text] = (embedding, holders - 1)

    # -- the contract -----------------------------------------------------------

    def join(self, key: int, ctx: Context, kwargs: dict[str, Any]) -> None:
        ctx.check_cancelled()
        model = self._model
        plan = model.plan(kwargs)
        scheduler = model.schedulers.fresh(plan.scheduler, plan.steps)
        gen = sampling.generator(plan.seed)
        shape = (plan.num_images, model.latent_channels,
                 plan.height // model.vae_scale, plan.width // model.vae_scale)  # fmt: skip
        x = sampling.noise(shape, gen, model.device) * scheduler.init_noise_sigma
        texts = (plan.negative_prompt, plan.prompt) if plan.guidance_scale > 1.0 else (plan.prompt,)
        held: list[str] = []
        try:
            with torch.inference_mode():
                for text in texts:
                    self._hold(text)
                    held.append(text)
        except BaseException:
            self._release_texts(held)  # a run that never joined holds nothing
            raise
        run = _Run(ctx=ctx, plan=plan, scheduler=scheduler, x=x, texts=texts,
                   step_kwargs=sampling.step_arguments(scheduler, gen),
                   previews=sampling.Previews(ctx, plan.preview_every, model.preview_images),
                   timesteps=scheduler.timesteps)  # fmt: skip
        self._runs[key] = run

    def abandon(self) -> list[int]:
        keys = list(self._runs)
        for run in self._runs.values():
            self._release(run)
        self._runs.clear()
        return keys

    def _leave(self, key: int) -> _Run:
        run = self._runs.pop(key)
        self._release(run)
        return run

    def step(self) -> list[tuple[int, Any]]:
        """One step of every run; the runs that left with their outcome. Never raises:
        a failure of the shared UNet call is the outcome of every run still held."""
        left: list[tuple[int, Any]] = []
        try:
            with torch.inference_mode():
                self._step(left)
        except Exception as exc:
            done = {key for key, _ in left}
            left += [(key, exc) for key in self.abandon() if key not in done]
        return left

    def _step(self, left: list[tuple[int, Any]]) -> None:
        inputs: dict[int, torch.Tensor] = {}
        for key, run in list(self._runs.items()):
            try:
                run.ctx.check_cancelled()
                inputs[key] = run.scheduler.scale_model_input(run.x, run.timesteps[run.i])
            except Exception as exc:
                self._leave(key)
                left.append((key, exc))
        outputs = self._denoise(inputs)
        for key, out in outputs.items():
            run = self._runs[key]
            try:
                if self._advance(run, out):
                    self._leave(key)
                    left.append((key, self._finish(run)))
            except Exception as exc:
                self._leave(key)
                left.append((key, exc))

    def _denoise(self, inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Every run's guided UNet output, from concatenated calls of ``max_rows``."""
        if not inputs:
            return {}
        model = self._model
        xs, ts, es = [], [], []
        for key, model_input in inputs.items():
            run = self._runs[key]
            n = model_input.shape[0]
            for text in run.texts:
                xs.append(model_input)
                es.append(self._texts[text][0].expand(n, -1, -1))
            t = run.timesteps[run.i].to(model.device, torch.float32)
            ts.append(t.reshape(1).expand(run.rows))
        x, tt, emb = torch.cat(xs), torch.cat(ts), torch.cat(es)
        parts = []
        for a in range(0, x.shape[0], self._max_rows):
            b = a + self._max_rows
            parts.append(model.unet_rows(x[a:b], tt[a:b], emb[a:b]))
            self.forward_rows = [*self.forward_rows[-255:], parts[-1].shape[0]]
        out = torch.cat(parts)
        per_run: dict[int, torch.Tensor] = {}
        at = 0
        for key in inputs:
            run = self._runs[key]
            part = out[at : at + run.rows]
            at += run.rows
            if run.guided:
                uncond, cond = part.chunk(2)
                part = uncond + run.plan.guidance_scale * (cond - uncond)
            per_run[key] = part
        return per_run

    def _advance(self, run: _Run, out: torch.Tensor) -> bool:
        t = run.timesteps[run.i]
        stepped = run.scheduler.step(out, t, run.x, **run.step_kwargs)
        run.x = stepped.prev_sample
        step, total = run.i + 1, len(run.timesteps)
        if not bool(torch.isfinite(run.x).all()):
            raise SamplingDiverged(f"sampling diverged (NaN or inf) at step {step} of {total}")
        run.i = step
        run.ctx.progress(step, total)
        run.previews.after(step, total, stepped, run.x)
        run.ctx.check_cancelled()
        return step == total

    def _finish(self, run: _Run) -> sampling.Generated:
        plan = run.plan
        return sampling.Generated(
            images=self._model.preview_images(run.x), seed=plan.seed,
            steps=len(run.timesteps), scheduler=plan.scheduler,
            width=plan.width, height=plan.height,
        )  # fmt: skip


def run_alone(model: TextModel, ctx: Context, kwargs: dict[str, Any]) -> sampling.Generated:
    """One run on the calling thread: a batch of one, to the end (raises its error)."""
    batch = PromptBatch(model, model.max_batch_images)
    batch.join(0, ctx, kwargs)
    outcome: Any = None
    while batch.active:
        for _key, left in batch.step():
            outcome = left
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome

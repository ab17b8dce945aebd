"""Train a digit diffusion model as diffusers components and save it as a pipeline.

    .venv/bin/python -m training.diffusion.train_pipeline --model ddpm [--max-minutes 60]
    .venv/bin/python -m training.diffusion.train_pipeline --model cls_cond_ddim
    .venv/bin/python -m training.diffusion.train_pipeline --model ldm

``ddpm``: an unconditional ``UNet2DModel`` (served by DDPM and DDIM);
``cls_cond_ddim``: the same with an 11-row class embedding (digits 0-9 and the "no
label" token 10, used with probability ``--label-drop`` so that classifier-free
guidance works); ``ldm``: an ``AutoencoderKL`` (16x16x1 -> 8x8x2) then a
``UNet2DModel`` on its scaled latents (v-prediction: the cosine schedule's last
alpha-bar is ~2e-9, and an eps-predicting latent model's first x0 estimate would
multiply its error by ~2e4; a v-predicting one needs no clamp).

Plain torch loop: AdamW with warm-up and cosine decay, gradient clipping at 1.0, EMA of
the weights (the EMA is what is saved). ``--max-minutes`` bounds the wall time: after
the 100 warm-up steps the run measures its speed and fixes the total step count (and
so the learning-rate schedule) to what fits; the manifest records a replay command
that pins it. The output is ``weights/diffusion/<model>/`` in diffusers' layout
(``save_pretrained``: ``model_index.json``, one folder per component with
``config.json`` and ``*.safetensors``) plus ``manifest.json`` (sha256 of every file,
the command, the loss curve). The pipeline is rewritten every ``--save-every-minutes``
so that an interrupted run still leaves usable weights.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mortred_twisted.models.diffusion.manifest import write_manifest
from training.diffusion.common import DATA_DESCRIPTION, IMAGE_SIZE, WEIGHTS_DIR, setup
from training.diffusion.common import digits_tensor as digits

NUM_CLASSES = 10
SCHEDULER = {
    "num_train_timesteps": 1000,
    "beta_schedule": "squaredcos_cap_v2",
    "variance_type": "fixed_small",
}


def pixel_unet(num_class_embeds: int | None) -> nn.Module:
    """UNet2DModel at 16x16x1: 32/64/64 channels, attention at 4x4 and in the middle."""
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=IMAGE_SIZE,
        in_channels=1,
        out_channels=1,
        layers_per_block=1,
        block_out_channels=(32, 64, 64),
        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=32,
        num_class_embeds=num_class_embeds,
    )


def latent_unet() -> nn.Module:
    """UNet2DModel at 8x8x2 (the autoencoder's latents): 32/64 channels, attention at 4x4."""
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=IMAGE_SIZE // 2,
        in_channels=2,
        out_channels=2,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
        attention_head_dim=32,
    )


def autoencoder() -> nn.Module:
    """AutoencoderKL 16x16x1 -> 8x8x2 (one downsampling), 32/64 channels."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=1,
        out_channels=1,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        latent_channels=2,
        norm_num_groups=8,
        sample_size=IMAGE_SIZE,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, choices=("ddpm", "cls_cond_ddim", "ldm"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=20000, help="upper bound on steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ema-decay", type=float, default=0.999)
    parser.add_argument("--label-drop", type=float, default=0.15)
    parser.add_argument("--max-minutes", type=float, default=60.0, help="0 = no limit")
    parser.add_argument("--ae-steps", type=int, default=3000, help="ldm: autoencoder steps")
    parser.add_argument("--ae-minutes", type=float, default=15.0, help="ldm: AE time limit")
    parser.add_argument("--kl-weight", type=float, default=1e-6)
    parser.add_argument("--stop-after", type=int, default=None, help="replay a cut run")
    parser.add_argument("--save-every-minutes", type=float, default=10.0)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="pipeline directory")
    return parser.parse_args(argv)


def lr_at(step: int, total: int, base: float, warmup: int = 100) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))


class Ema:
    """Exponential moving average of a module's parameters (with warm-up)."""

    def __init__(self, net: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = copy.deepcopy(net).eval()
        for p in self.shadow.parameters():
            p.requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, net: nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))
        for s, p in zip(self.shadow.parameters(), net.parameters(), strict=True):
            s.mul_(d).add_(p.detach(), alpha=1.0 - d)


class Budget:
    """Fixes the total step count after warm-up so that the run fits ``minutes``."""

    def __init__(self, args: argparse.Namespace, steps: int, minutes: float) -> None:
        self.total = steps
        self.minutes = minutes
        self.stop_after = args.stop_after
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def after_step(self, done: int) -> bool:
        """Call after ``done`` steps; True when the run must stop."""
        if done == 100 and self.minutes > 0 and self.stop_after is None:
            rate = done / max(self.elapsed(), 1e-6)
            fits = int(done + rate * (self.minutes * 60.0 - self.elapsed()) * 0.92)
            if fits < self.total:
                self.total = max(done + 1, fits)
                print(f"{rate:.2f} steps/s: total fixed at {self.total} steps", flush=True)
        if self.stop_after is not None and done >= self.stop_after:
            return True
        if self.minutes > 0 and self.elapsed() > self.minutes * 60.0:
            print(f"stopping: {self.minutes} minutes reached after {done} steps", flush=True)
            return True
        return done >= self.total


def training_record(args: argparse.Namespace, stage: str, budget: Budget, done: int, curve):
    cmd = " ".join([".venv/bin/python -m training.diffusion.train_pipeline", *sys.argv[1:]])
    replay = (
        f".venv/bin/python -m training.diffusion.train_pipeline --model {args.model} "
        f"--seed {args.seed} --batch {args.batch} --lr {args.lr} --steps {budget.total} "
        f"--stop-after {done} --max-minutes 0"
    )
    return {
        "stage": stage,
        "command": cmd,
        "replay": replay,
        "data": DATA_DESCRIPTION,
        "seed": args.seed,
        "steps": done,
        "scheduled_steps": budget.total,
        "batch": args.batch,
        "lr": args.lr,
        "ema_decay": args.ema_decay,
        "threads": args.threads,
        "seconds": round(budget.elapsed(), 1),
        "loss_curve": [[s, round(v, 5)] for s, v in curve],
    }


def train_denoiser(
    args: argparse.Namespace,
    device: torch.device,
    net: nn.Module,
    data: torch.Tensor,
    labels: torch.Tensor | None,
    scheduler: Any,
    save: Any,
) -> None:
    """Diffusion loss loop; ``save(ema_net, record)`` writes the pipeline."""
    gen = torch.Generator().manual_seed(args.seed)
    net.to(device).train()
    ema = Ema(net, args.ema_decay)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.0)
    budget = Budget(args, args.steps, args.max_minutes)
    v_pred = scheduler.config.prediction_type == "v_prediction"
    curve: list[tuple[int, float]] = []
    window: list[float] = []
    last_save = time.monotonic()
    done = 0
    while True:
        idx = torch.randint(0, data.shape[0], (args.batch,), generator=gen)
        x0 = data[idx]
        t = torch.randint(0, scheduler.config.num_train_timesteps, (args.batch,), generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        xt = scheduler.add_noise(x0, eps, t)
        target = scheduler.get_velocity(x0, eps, t) if v_pred else eps
        kwargs = {}
        if labels is not None:
            y = labels[idx].clone()
            y[torch.rand(args.batch, generator=gen) < args.label_drop] = NUM_CLASSES
            kwargs["class_labels"] = y.to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(done, budget.total, args.lr)
        pred = net(xt.to(device), t.to(device), **kwargs).sample
        loss = torch.mean((pred - target.to(device)) ** 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        ema.update(net)
        done += 1
        window.append(float(loss.detach()))
        stop = budget.after_step(done)
        if done % args.log_every == 0 or stop:
            curve.append((done, sum(window) / len(window)))
            window.clear()
            print(f"step {done:6d}  loss {curve[-1][1]:.5f}  {budget.elapsed():7.1f}s", flush=True)
        if stop or time.monotonic() - last_save > args.save_every_minutes * 60.0:
            save(ema.shadow, training_record(args, "denoiser", budget, done, curve))
            last_save = time.monotonic()
        if stop:
            return


def make_scheduler(prediction_type: str, clip: bool) -> Any:
    from diffusers import DDPMScheduler

    return DDPMScheduler(**SCHEDULER, prediction_type=prediction_type, clip_sample=clip)


def save_pipeline(out: Path, components: dict[str, Any], extra: dict[str, Any]) -> None:
    """``save_pretrained`` the components in diffusers' layout, then the manifest."""
    from diffusers import DDPMPipeline, LDMPipeline

    cls = LDMPipeline if "vqvae" in components else DDPMPipeline
    out.mkdir(parents=True, exist_ok=True)
    cls(**components).save_pretrained(out, safe_serialization=True)
    write_manifest(out, extra)
    print(f"saved pipeline {out}", flush=True)


def train_autoencoder(args: argparse.Namespace, device: torch.device, x: torch.Tensor):
    """Stage 1 of the LDM: MSE + kl_weight * KL (per element); returns (ae, record)."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    ae = autoencoder().to(device).train()
    opt = torch.optim.AdamW(ae.parameters(), lr=1e-3)
    budget = Budget(args, args.ae_steps, args.ae_minutes)
    budget.stop_after = None
    curve: list[tuple[int, float]] = []
    window: list[float] = []
    done = 0
    while True:
        for group in opt.param_groups:
            group["lr"] = lr_at(done, budget.total, 1e-3)
        xb = x[torch.randint(0, len(x), (args.batch,), generator=gen)].to(device)
        posterior = ae.encode(xb).latent_dist
        rec = ae.decode(posterior.sample(generator=None)).sample
        kl = posterior.kl().mean() / posterior.mean[0].numel()
        loss = torch.mean((rec - xb) ** 2) + args.kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ae.parameters(), 1.0)
        opt.step()
        done += 1
        window.append(float(loss.detach()))
        stop = budget.after_step(done)
        if done % args.log_every == 0 or stop:
            curve.append((done, sum(window) / len(window)))
            window.clear()
            print(
                f"ae step {done:6d}  loss {curve[-1][1]:.6f}  {budget.elapsed():7.1f}s", flush=True
            )
        if stop:
            record = training_record(args, "autoencoder", budget, done, curve)
            record.update(kl_weight=args.kl_weight, lr=1e-3, ema_decay=None)
            return ae.eval(), record


@torch.no_grad()
def recon_error(ae: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """Reconstruction error on ``x`` (in [-1, 1]) measured in [0, 1] pixel units."""
    rec = ae.decode(ae.encode(x).latent_dist.mean).sample.clamp(-1.0, 1.0)
    a, b = (x + 1.0) / 2.0, (rec + 1.0) / 2.0
    mse = float(((a - b) ** 2).mean())
    return {
        "mse": round(mse, 6),
        "mae": round(float((a - b).abs().mean()), 5),
        "psnr_db": round(10.0 * math.log10(1.0 / mse), 2),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = setup(args)
    out = args.out or WEIGHTS_DIR / args.model
    x_train, y_train = digits("train")
    if args.model in ("ddpm", "cls_cond_ddim"):
        cond = args.model == "cls_cond_ddim"
        net = pixel_unet(NUM_CLASSES + 1 if cond else None)
        scheduler = make_scheduler("epsilon", clip=True)
        print(f"{args.model}: UNet2DModel {sum(p.numel() for p in net.parameters())} params")

        def save(ema: nn.Module, record: dict[str, Any]) -> None:
            extra = {"training": {"denoiser": record}}
            if cond:
                extra["null_class_id"] = NUM_CLASSES
            save_pipeline(out, {"unet": ema, "scheduler": scheduler}, extra)

        train_denoiser(args, device, net, x_train, y_train if cond else None, scheduler, save)
        return
    ae, ae_record = train_autoencoder(args, device, x_train)
    with torch.no_grad():
        latents = ae.encode(x_train.to(device)).latent_dist.mean
    scale = round(float(1.0 / latents.std()), 6)
    ae.register_to_config(scaling_factor=scale)
    x_test, _ = digits("test")
    ae_record["figures"] = {
        "reconstruction_test": recon_error(ae, x_test.to(device)),
        "reconstruction_train": recon_error(ae, x_train.to(device)),
        "scaling_factor": scale,
    }
    print("autoencoder:", ae_record["figures"], flush=True)
    z = (latents * scale).cpu()
    print(f"latents {tuple(z.shape)} max |z| {float(z.abs().max()):.3f}", flush=True)
    net = latent_unet()
    scheduler = make_scheduler("v_prediction", clip=False)
    print(f"ldm: latent UNet2DModel {sum(p.numel() for p in net.parameters())} params")

    def save_ldm(ema: nn.Module, record: dict[str, Any]) -> None:
        record["data"] = "scaled AutoencoderKL latent means of: " + DATA_DESCRIPTION
        # One command replays both stages step for step.
        record["replay"] += f" --ae-steps {ae_record['steps']} --ae-minutes 0"
        ae_record["replay"] = record["replay"]
        extra = {"training": {"autoencoder": ae_record, "denoiser": record}}
        save_pipeline(out, {"vqvae": ae, "unet": ema, "scheduler": scheduler}, extra)

    train_denoiser(args, device, net, z, None, scheduler, save_ldm)


if __name__ == "__main__":
    main()

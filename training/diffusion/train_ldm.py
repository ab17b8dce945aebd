"""Train the latent diffusion model served by LDM: autoencoder, then latent UNet.

    .venv/bin/python -m training.diffusion.train_ldm [--ae-steps 2000] [--steps 3500]

Stage 1 trains a KL-regularised autoencoder (MSE + ``--kl-weight`` * KL) and measures
its reconstruction error on the held-out split; ``latent_scale`` is set to
1 / std of the training latents. Stage 2 trains a UNet on the scaled latents
(``--skip-ae`` reuses an existing ``ldm_autoencoder.pt``). Writes
``weights/diffusion/ldm_autoencoder.pt``, ``weights/diffusion/ldm_unet.pt`` and their
manifest entries, and prints loss curves and the figures.
"""

from __future__ import annotations

import argparse
import time

import torch

from mortred_twisted.models.diffusion import weights as weights_mod
from mortred_twisted.models.diffusion.autoencoder import (
    AutoencoderConfig,
    KLAutoencoder,
    kl_divergence,
)
from mortred_twisted.models.diffusion.schedule import NoiseSchedule
from mortred_twisted.models.diffusion.unet import UNet, UNetConfig
from training.diffusion import common

AE_ARCH = AutoencoderConfig(in_channels=1, base_channels=32, latent_dims=2, downscale=2)
UNET_ARCH = UNetConfig(in_channels=2, base_channels=32, channel_mults=(1, 2))
SCHEDULE = {"beta_schedule": "cosine", "timesteps": 1000, "beta_start": 1e-4, "beta_end": 0.02}


@torch.no_grad()
def recon_error(ae: KLAutoencoder, x: torch.Tensor) -> dict[str, float]:
    """Reconstruction error on ``x`` (in [-1, 1]) measured in [0, 1] pixel units."""
    ae.eval()
    mean, _ = ae.encode(x)
    rec = ae.decode(mean).clamp(-1.0, 1.0)
    a, b = (x + 1.0) / 2.0, (rec + 1.0) / 2.0
    mse = float(((a - b) ** 2).mean())
    mae = float((a - b).abs().mean())
    psnr = float(10.0 * torch.log10(torch.tensor(1.0 / mse)))
    return {"mse": round(mse, 6), "mae": round(mae, 5), "psnr_db": round(psnr, 2)}


def train_autoencoder(
    args: argparse.Namespace, device: torch.device, x: torch.Tensor
) -> tuple[KLAutoencoder, list[tuple[int, float]]]:
    gen = torch.Generator().manual_seed(args.seed + 1)
    ae = KLAutoencoder(AE_ARCH).to(device).train()
    opt = torch.optim.AdamW(ae.parameters(), lr=2e-3)
    curve, window = [], []
    start = time.monotonic()
    for step in range(args.ae_steps):
        for group in opt.param_groups:
            group["lr"] = common.lr_at(step, args.ae_steps, 2e-3)
        idx = torch.randint(0, len(x), (args.batch,), generator=gen)
        xb = x[idx].to(device)
        rec, mean, logvar = ae(xb)
        loss = torch.mean((rec - xb) ** 2) + args.kl_weight * kl_divergence(mean, logvar)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        window.append(float(loss.detach()))
        if (step + 1) % args.log_every == 0 or step + 1 == args.ae_steps:
            curve.append((step + 1, sum(window) / len(window)))
            window.clear()
            print(
                f"ae step {step + 1:6d}  loss {curve[-1][1]:.5f}  {time.monotonic() - start:7.1f}s",
                flush=True,
            )
    return ae.eval(), curve


def main() -> None:
    parser = common.base_parser(__doc__ or "")
    parser.add_argument("--ae-steps", type=int, default=2000)
    parser.add_argument("--kl-weight", type=float, default=1e-5)
    parser.add_argument("--skip-ae", action="store_true")
    parser.add_argument("--no-eval", action="store_true")
    args = parser.parse_args()
    device = common.setup(args)
    x_train, _ = common.digits_tensor("train")
    x_test, _ = common.digits_tensor("test")
    ae_path = common.WEIGHTS_DIR / "ldm_autoencoder.pt"
    if args.skip_ae:
        ae_net, record = weights_mod.load_network(
            ae_path,
            kind="autoencoder",
            device=device,
            build=lambda e: KLAutoencoder(AutoencoderConfig.from_dict(e["arch"])),
        )
        ae = ae_net  # type: ignore[assignment]
        latent_scale = float(record.entry["figures"]["latent_scale"])
    else:
        (ae, ae_curve), ae_seconds = common.timed(lambda: train_autoencoder(args, device, x_train))
        with torch.no_grad():
            latents = ae.encode(x_train.to(device))[0]
        latent_scale = float(1.0 / latents.std())
        figures = {
            "reconstruction_test": recon_error(ae, x_test.to(device)),
            "reconstruction_train": recon_error(ae, x_train.to(device)),
            "latent_scale": round(latent_scale, 6),
        }
        latent_scale = figures["latent_scale"]
        print("autoencoder figures:", figures)
        common.save_weights(
            ae.state_dict(),
            ae_path,
            {
                "kind": "autoencoder",
                "arch": AE_ARCH.to_dict(),
                "figures": figures,
                "training": {
                    "command": common.command_line(),
                    "data": common.DATA_DESCRIPTION,
                    "seed": args.seed,
                    "steps": args.ae_steps,
                    "batch": args.batch,
                    "kl_weight": args.kl_weight,
                    "seconds": round(ae_seconds, 1),
                    "loss_curve": [[s, round(v, 6)] for s, v in ae_curve],
                },
            },
        )
        print("ae loss curve:", common.format_curve(ae_curve))
    ae_sha = weights_mod.sha256_file(ae_path)
    with torch.no_grad():
        z = ae.encode(x_train.to(device))[0] * latent_scale
    print(
        f"latents {tuple(z.shape)} scaled std {float(z.std()):.3f}, "
        f"max |z| {float(z.abs().max()):.3f} (keep the LDM's latent_clip above it)"
    )
    schedule = NoiseSchedule.create(
        SCHEDULE["beta_schedule"],
        SCHEDULE["timesteps"],
        SCHEDULE["beta_start"],
        SCHEDULE["beta_end"],
    )
    net = UNet(UNET_ARCH)
    common.maybe_resume(net, args)
    (ema, curve), seconds = common.timed(
        lambda: common.train_eps(net, z.cpu(), None, schedule, args, device)
    )
    common.save_weights(
        ema.state_dict(),
        common.WEIGHTS_DIR / "ldm_unet.pt",
        {
            "kind": "unet",
            "arch": UNET_ARCH.to_dict(),
            "schedule": SCHEDULE,
            "latent": {
                "autoencoder": ae_path.name,
                "autoencoder_sha256": ae_sha,
                "latent_scale": latent_scale,
                "latent_dims": AE_ARCH.latent_dims,
                "downscale": AE_ARCH.downscale,
            },
            "training": {
                "command": common.command_line(),
                "replay": common.replay_command(args, curve[-1][0]),
                "data": "scaled autoencoder latent means of: " + common.DATA_DESCRIPTION,
                "seed": args.seed,
                "steps": curve[-1][0],
                "batch": args.batch,
                "lr": args.lr,
                "ema_decay": 0.999,
                "seconds": round(seconds, 1),
                "device": str(device),
                "loss_curve": [[s, round(v, 5)] for s, v in curve],
            },
        },
    )
    print("latent unet loss curve:", common.format_curve(curve))
    if not args.no_eval:
        from training.diffusion import evaluate

        evaluate.main(["--models", "LDM", "--samples", "200", "--threads", str(args.threads)])


if __name__ == "__main__":
    main()

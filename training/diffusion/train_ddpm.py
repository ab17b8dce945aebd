"""Train the unconditional UNet served by DDPM and DDIM (one command, seeded).

    .venv/bin/python -m training.diffusion.train_ddpm [--steps 3000] [--threads 1]

Writes ``weights/diffusion/ddpm_unet.pt`` (EMA weights) and its manifest entry, prints
the loss curve and, when the judge weights exist, the quality figures of 200 samples.
"""

from __future__ import annotations

from mortred_twisted.models.diffusion.schedule import NoiseSchedule
from mortred_twisted.models.diffusion.unet import UNet, UNetConfig
from training.diffusion import common

ARCH = UNetConfig(in_channels=1, base_channels=32, channel_mults=(1, 2, 2))
SCHEDULE = {"beta_schedule": "cosine", "timesteps": 1000, "beta_start": 1e-4, "beta_end": 0.02}


def main() -> None:
    parser = common.base_parser(__doc__ or "")
    parser.add_argument("--no-eval", action="store_true")
    args = parser.parse_args()
    out = args.out or common.WEIGHTS_DIR / "ddpm_unet.pt"
    device = common.setup(args)
    data, _ = common.digits_tensor("train")
    schedule = NoiseSchedule.create(
        SCHEDULE["beta_schedule"],
        SCHEDULE["timesteps"],
        SCHEDULE["beta_start"],
        SCHEDULE["beta_end"],
    )
    net = UNet(ARCH)
    common.maybe_resume(net, args)
    print(f"UNet {sum(p.numel() for p in net.parameters())} parameters; data {tuple(data.shape)}")
    (ema, curve), seconds = common.timed(
        lambda: common.train_eps(net, data, None, schedule, args, device)
    )
    common.save_weights(
        ema.state_dict(),
        out,
        {
            "kind": "unet",
            "arch": ARCH.to_dict(),
            "schedule": SCHEDULE,
            "training": {
                "command": common.command_line(),
                "replay": common.replay_command(args, curve[-1][0]),
                "data": common.DATA_DESCRIPTION,
                "seed": args.seed,
                "resumed_from": str(args.resume) if args.resume else None,
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
    print("loss curve:", common.format_curve(curve))
    if not args.no_eval:
        from training.diffusion import evaluate

        evaluate.main(["--models", "DDPM,DDIM", "--samples", "200", "--threads", str(args.threads)])


if __name__ == "__main__":
    main()

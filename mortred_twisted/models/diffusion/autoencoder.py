"""A small KL-regularised autoencoder (the first stage of the latent diffusion model).

``encode(x)`` maps images ``(B, C, H, W)`` in ``[-1, 1]`` to a diagonal Gaussian over
latents ``(B, latent_dims, H / downscale, W / downscale)``; ``decode(z)`` maps latents
back to images. The LDM samples *scaled* latents ``z * latent_scale`` (the scale makes
their standard deviation about 1; it is measured after training and stored in the
manifest) and decodes ``z_sampled / latent_scale``.

Thread contract: stateless at inference (no batch norm); shareable after ``eval()``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class AutoencoderConfig:
    in_channels: int = 1
    base_channels: int = 32
    latent_dims: int = 2
    downscale: int = 2  # a power of two
    groups: int = 8

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AutoencoderConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown autoencoder config keys: {sorted(unknown)}")
        cfg = cls(**data)
        if cfg.downscale < 1 or cfg.downscale & (cfg.downscale - 1):
            raise ValueError(f"downscale must be a power of two (got {cfg.downscale})")
        return cfg


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class KLAutoencoder(nn.Module):
    def __init__(self, config: AutoencoderConfig) -> None:
        super().__init__()
        self.config = config
        ch, g = config.base_channels, config.groups
        levels = config.downscale.bit_length() - 1
        enc: list[nn.Module] = [nn.Conv2d(config.in_channels, ch, 3, padding=1)]
        cur = ch
        for _ in range(levels):
            enc += [_Block(cur, cur * 2, g), nn.Conv2d(cur * 2, cur * 2, 3, stride=2, padding=1)]
            cur *= 2
        enc += [_Block(cur, cur, g), nn.GroupNorm(g, cur), nn.SiLU()]
        enc += [nn.Conv2d(cur, 2 * config.latent_dims, 3, padding=1)]
        self.encoder = nn.Sequential(*enc)
        dec: list[nn.Module] = [
            nn.Conv2d(config.latent_dims, cur, 3, padding=1),
            _Block(cur, cur, g),
        ]
        for _ in range(levels):
            dec += [nn.Upsample(scale_factor=2.0, mode="nearest"), _Block(cur, cur // 2, g)]
            cur //= 2
        dec += [nn.GroupNorm(g, cur), nn.SiLU(), nn.Conv2d(cur, config.in_channels, 3, padding=1)]
        self.decoder = nn.Sequential(*dec)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(mean, logvar)`` of the latent posterior (logvar clamped)."""
        mean, logvar = self.encoder(x).chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass: ``(reconstruction, mean, logvar)`` with a sampled latent."""
        mean, logvar = self.encode(x)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * logvar)
        return self.decode(z), mean, logvar


def kl_divergence(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, exp(logvar)) || N(0, I)) summed over latent dims, mean over batch."""
    kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar)
    return kl.flatten(1).sum(1).mean()

"""A small UNet for noise prediction, optionally class-conditional.

Architecture (all hyper-parameters live in :class:`UNetConfig`, stored next to the
weights in the manifest so that a loader can rebuild exactly the trained network):

* sinusoidal embedding of the (integer) timestep, then a 2-layer MLP;
* optional label embedding (``num_classes + 1`` rows: the last row is the "no label"
  token used by classifier-free guidance) added to the time embedding;
* per resolution level ``num_res_blocks`` residual blocks (GroupNorm, SiLU, 3x3 conv,
  time/label projection added between the two convolutions), a strided-conv
  downsample between levels, a mirror-image decoder with skip connections and
  nearest-neighbour upsampling;
* single-head self-attention at the lowest resolution (encoder end and middle).

Thread contract: a module instance holds no per-call state; after ``eval()`` it may be
called concurrently from several threads under ``torch.inference_mode()``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class UNetConfig:
    """Hyper-parameters of :class:`UNet` (JSON-serialisable via :meth:`to_dict`)."""

    in_channels: int = 1
    base_channels: int = 32
    channel_mults: tuple[int, ...] = (1, 2, 2)
    num_res_blocks: int = 1
    groups: int = 8
    num_classes: int = 0  # 0 = unconditional
    dropout: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["channel_mults"] = list(self.channel_mults)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UNetConfig:
        """Build from a manifest dict; unknown keys raise ``ValueError``."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown UNet config keys: {sorted(unknown)}")
        kwargs = dict(data)
        if "channel_mults" in kwargs:
            kwargs["channel_mults"] = tuple(int(m) for m in kwargs["channel_mults"])
        return cls(**kwargs)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of integer timesteps ``t`` (shape ``(B,)``) -> ``(B, dim)``."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    args = t.float()[:, None] * freqs[None, :]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb_dim: int, groups: int, dropout: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb_dim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.drop = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(emb)[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return h + self.skip(x)


class Attention(nn.Module):
    """Single-head self-attention over the spatial positions, residual."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.qkv = nn.Conv2d(channels, channels * 3, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return x + self.proj(out.transpose(1, 2).reshape(b, c, h, w))


class UNet(nn.Module):
    """Predicts the noise ``eps`` added to ``x_t`` at timestep ``t``.

    ``forward(x, t, y=None)``: ``x`` is ``(B, C, H, W)`` with ``H``, ``W`` divisible by
    ``2 ** (len(channel_mults) - 1)``; ``t`` integer ``(B,)``; ``y`` integer labels
    ``(B,)`` in ``0..num_classes`` (``num_classes`` = no label) for conditional nets.
    """

    def __init__(self, config: UNetConfig):
        super().__init__()
        self.config = config
        ch = config.base_channels
        emb_dim = ch * 4
        g, dr = config.groups, config.dropout
        self.time_mlp = nn.Sequential(
            nn.Linear(ch, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim)
        )
        self.label_emb = (
            nn.Embedding(config.num_classes + 1, emb_dim) if config.num_classes else None
        )
        self.stem = nn.Conv2d(config.in_channels, ch, 3, padding=1)
        chans = [ch * m for m in config.channel_mults]
        self.down = nn.ModuleList()
        self.downsample = nn.ModuleList()
        skips = [ch]
        cur = ch
        for level, cout in enumerate(chans):
            blocks = nn.ModuleList()
            for _ in range(config.num_res_blocks):
                blocks.append(ResBlock(cur, cout, emb_dim, g, dr))
                cur = cout
                skips.append(cur)
            self.down.append(blocks)
            if level < len(chans) - 1:
                self.downsample.append(nn.Conv2d(cur, cur, 3, stride=2, padding=1))
                skips.append(cur)
        self.mid1 = ResBlock(cur, cur, emb_dim, g, dr)
        self.mid_attn = Attention(cur, g)
        self.mid2 = ResBlock(cur, cur, emb_dim, g, dr)
        self.up = nn.ModuleList()
        for cout in reversed(chans):
            blocks = nn.ModuleList()
            for _ in range(config.num_res_blocks + 1):
                blocks.append(ResBlock(cur + skips.pop(), cout, emb_dim, g, dr))
                cur = cout
            self.up.append(blocks)
        self.low_attn = Attention(chans[-1], g)
        self.out_norm = nn.GroupNorm(g, cur)
        self.out_conv = nn.Conv2d(cur, config.in_channels, 3, padding=1)
        assert not skips

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None
    ) -> torch.Tensor:
        emb = self.time_mlp(timestep_embedding(t, self.config.base_channels))
        if self.label_emb is not None:
            if y is None:
                y = torch.full_like(t, self.config.num_classes)
            emb = emb + self.label_emb(y)
        h = self.stem(x)
        hs = [h]
        last = len(self.down) - 1
        for level, blocks in enumerate(self.down):
            for block in blocks:
                h = block(h, emb)
                hs.append(h)
            if level < last:
                h = self.downsample[level](h)
                hs.append(h)
        h = self.low_attn(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb)), emb)
        for i, blocks in enumerate(self.up):
            for block in blocks:
                h = block(torch.cat([h, hs.pop()], dim=1), emb)
            if i < last:
                h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        return self.out_conv(F.silu(self.out_norm(h)))

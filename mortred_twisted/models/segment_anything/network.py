"""A small promptable segmenter in the shape of SAM (Kirillov et al., 2023), plain torch.

* :class:`ImageEncoder` - run **once per image**: a convolutional encoder giving a
  ``dim`` x 16 x 16 embedding of a 64 px picture plus two high-resolution skip maps
  (32 and 64 px; the HQ-SAM idea, so that small shapes get crisp edges).
* :class:`PromptEncoder` - a point prompt as a random-Fourier positional encoding plus
  a learned "foreground point" embedding; also the dense positional encoding of the
  embedding grid.
* :class:`MaskDecoder` - SAM's two-way transformer between the output tokens
  (one IoU token, ``num_masks`` mask tokens) + prompt token and the image embedding,
  transposed-convolution upscaling of the (per-prompt) image embedding, hypernetwork
  MLPs turning each mask token into the weights of a dot product with the upscaled
  map, and an MLP head predicting each mask's IoU.

Every prompt yields ``num_masks`` mask logits at the input resolution and as many
IoU estimates. :meth:`PromptableSegmenter.predict_points` decodes a batch of points
against one precomputed embedding: the automatic mask generator calls it once per
prompt batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ConvBN(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, s: int = 1, d: int = 1) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, k, s, d * (k // 2), dilation=d, bias=False),
            nn.BatchNorm2d(cout),
            nn.GELU(),
        )


class ResBlock(nn.Module):
    def __init__(self, c: int, dilation: int) -> None:
        super().__init__()
        self.a = ConvBN(c, c, 3, 1, dilation)
        self.b = nn.Sequential(
            nn.Conv2d(c, c, 3, 1, dilation, dilation=dilation, bias=False), nn.BatchNorm2d(c)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.b(self.a(x)))


class ImageEncoder(nn.Module):
    """``(N, 3, S, S)`` in [0, 1] -> embedding ``(N, dim, S/4, S/4)``, skips at S/2, S."""

    def __init__(self, dim: int = 64, skip_channels: tuple[int, int] = (16, 8)) -> None:
        super().__init__()
        self.s0 = nn.Sequential(ConvBN(3, 16), ConvBN(16, 16))
        self.s1 = nn.Sequential(ConvBN(16, 32, s=2), ConvBN(32, 32))
        self.s2 = nn.Sequential(ConvBN(32, dim, s=2), *(ResBlock(dim, d) for d in (1, 2, 4, 8)))
        self.neck = nn.Conv2d(dim, dim, 1)
        self.skip_half = nn.Conv2d(32, skip_channels[0], 1)
        self.skip_full = nn.Conv2d(16, skip_channels[1], 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f0 = self.s0(x)
        f1 = self.s1(f0)
        emb = self.neck(self.s2(f1))
        return emb, self.skip_half(f1), self.skip_full(f0)


class PromptEncoder(nn.Module):
    """Point prompts (pixels of the model input) -> tokens; grid -> dense encoding."""

    def __init__(self, dim: int = 64, input_size: int = 64) -> None:
        super().__init__()
        self.input_size = input_size
        self.register_buffer("gaussian", torch.randn(2, dim // 2), persistent=True)
        self.point_embed = nn.Parameter(torch.randn(dim) * 0.02)

    def encode_coords(self, coords01: torch.Tensor) -> torch.Tensor:
        """Fourier features of ``(..., 2)`` coordinates in [0, 1] -> ``(..., dim)``."""
        proj = (2 * coords01 - 1) @ self.gaussian * (2 * math.pi)
        return torch.cat([proj.sin(), proj.cos()], -1)

    def points(self, xy: torch.Tensor) -> torch.Tensor:
        """``(P, 2)`` pixel coordinates -> ``(P, 1, dim)`` sparse prompt tokens."""
        return (self.encode_coords(xy / self.input_size) + self.point_embed)[:, None, :]

    def dense_pe(self, h: int, w: int) -> torch.Tensor:
        """``(h * w, dim)`` positional encoding of the embedding grid's cell centres."""
        ys = (torch.arange(h, dtype=torch.float32) + 0.5) / h
        xs = (torch.arange(w, dtype=torch.float32) + 0.5) / w
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).to(self.gaussian)
        return self.encode_coords(grid).reshape(h * w, -1)


class Attention(nn.Module):
    """Multi-head attention with an optional internal down-projection (as in SAM)."""

    def __init__(self, dim: int, heads: int, downsample: int = 1) -> None:
        super().__init__()
        inner = dim // downsample
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(dim, inner), nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.out = nn.Linear(inner, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        return x.reshape(b, n, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            self._split(self.q(q)), self._split(self.k(k)), self._split(self.v(v))
        )
        b, h, n, c = out.shape
        return self.out(out.transpose(1, 2).reshape(b, n, h * c))


class TwoWayBlock(nn.Module):
    """Tokens: self-attn, cross-attn to image, MLP; then image: cross-attn to tokens."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, skip_first_pe: bool) -> None:
        super().__init__()
        self.self_attn = Attention(dim, heads)
        self.t2i = Attention(dim, heads, downsample=2)
        self.i2t = Attention(dim, heads, downsample=2)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(4))
        self.skip_first_pe = skip_first_pe

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        query_pe: torch.Tensor,
        key_pe: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.skip_first_pe:
            queries = self.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)
        queries = self.norms[0](queries)
        queries = self.norms[1](queries + self.t2i(queries + query_pe, keys + key_pe, keys))
        queries = self.norms[2](queries + self.mlp(queries))
        keys = self.norms[3](keys + self.i2t(keys + key_pe, queries + query_pe, queries))
        return queries, keys


class MaskDecoder(nn.Module):
    """Tokens + image embedding -> ``num_masks`` mask logits and IoU estimates."""

    def __init__(
        self,
        dim: int = 64,
        num_masks: int = 3,
        depth: int = 2,
        heads: int = 4,
        skip_channels: tuple[int, int] = (16, 8),
    ) -> None:
        super().__init__()
        self.num_masks = num_masks
        self.iou_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.mask_tokens = nn.Parameter(torch.randn(1, num_masks, dim) * 0.02)
        self.blocks = nn.ModuleList(TwoWayBlock(dim, heads, 2 * dim, i == 0) for i in range(depth))
        self.final_attn = Attention(dim, heads, downsample=2)
        self.final_norm = nn.LayerNorm(dim)
        c_half, c_full = skip_channels
        self.up1 = nn.ConvTranspose2d(dim, c_half, 2, 2)
        self.up1_norm = nn.GroupNorm(1, c_half)
        self.up2 = nn.ConvTranspose2d(c_half, c_full, 2, 2)
        self.hyper = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, c_full))
            for _ in range(num_masks)
        )
        self.iou_head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, num_masks))

    def forward(
        self,
        emb: torch.Tensor,
        skip_half: torch.Tensor,
        skip_full: torch.Tensor,
        dense_pe: torch.Tensor,
        prompt_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``emb (P, dim, h, w)``, skips ``(P, c, 2h, 2w)`` / ``(P, c, 4h, 4w)`` (one row per
        prompt, usually expanded views), ``prompt_tokens (P, 1, dim)`` ->
        ``masks (P, num_masks, 4h, 4w)``, ``iou (P, num_masks)``."""
        p, dim, h, w = emb.shape
        tokens = torch.cat(
            [self.iou_token.expand(p, -1, -1), self.mask_tokens.expand(p, -1, -1), prompt_tokens], 1
        )
        queries, keys = tokens, emb.flatten(2).transpose(1, 2)
        key_pe = dense_pe[None].expand(p, -1, -1)
        for block in self.blocks:
            queries, keys = block(queries, keys, tokens, key_pe)
        queries = self.final_norm(queries + self.final_attn(queries + tokens, keys + key_pe, keys))
        src = keys.transpose(1, 2).reshape(p, dim, h, w)
        up = F.gelu(self.up1_norm(self.up1(src) + skip_half))  # (P, c_half, 2h, 2w)
        mask_tokens = queries[:, 1 : 1 + self.num_masks]
        weights = torch.stack([mlp(mask_tokens[:, i]) for i, mlp in enumerate(self.hyper)], 1)
        # masks = weights . (up2(up) + skip_full), with the linear stride-2 transposed
        # convolution folded into the per-prompt weights: no (P, c, 4h, 4w) tensor.
        folded = torch.einsum("pkc,dcij->pkdij", weights, self.up2.weight)
        low = torch.einsum("pkdij,pdyx->pkyixj", folded, up).reshape(
            p, self.num_masks, 4 * h, 4 * w
        )
        bias = (weights @ self.up2.bias)[..., None, None]
        if skip_full.shape[0] == 1:
            high = torch.einsum("pkc,chw->pkhw", weights, skip_full[0])
        else:
            high = torch.einsum("pkc,pchw->pkhw", weights, skip_full)
        return low + high + bias, self.iou_head(queries[:, 0])


class PromptableSegmenter(nn.Module):
    """Image encoder + prompt encoder + mask decoder (inputs are ``input_size`` px)."""

    def __init__(
        self,
        dim: int = 64,
        num_masks: int = 3,
        depth: int = 2,
        heads: int = 4,
        input_size: int = 64,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.num_masks = num_masks
        self.image_encoder = ImageEncoder(dim)
        self.prompt_encoder = PromptEncoder(dim, input_size)
        self.mask_decoder = MaskDecoder(dim, num_masks, depth, heads)

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the image encoder once: ``(N, 3, S, S)`` -> embedding and skips."""
        return self.image_encoder(images)

    def decode(
        self,
        features: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        image_index: torch.Tensor,
        points: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode ``points (P, 2)`` (pixels), each against image ``image_index[p]``."""
        emb, half, full = features
        h, w = emb.shape[-2:]
        full = full if full.shape[0] == 1 else full[image_index]
        return self.mask_decoder(
            emb[image_index],
            half[image_index],
            full,
            self.prompt_encoder.dense_pe(h, w),
            self.prompt_encoder.points(points),
        )

    def predict_points(
        self, features: tuple[torch.Tensor, torch.Tensor, torch.Tensor], points: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """All ``points (P, 2)`` against the single image whose ``features`` are given."""
        index = torch.zeros(points.shape[0], dtype=torch.long, device=points.device)
        return self.decode(features, index, points)

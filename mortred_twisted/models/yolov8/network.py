"""A small anchor-free YOLOv8-style detector in plain torch.

Layout as in YOLOv8 (Ultralytics, 2023), scaled down for 64 px scenes:

* backbone: Conv(s2) stem, then per stage Conv(s2) + C2f (cross-stage partial with two
  convolutions per bottleneck), SPPF on the deepest stage;
* neck: PAN (top-down upsample + concat + C2f, then bottom-up Conv(s2) + concat + C2f);
* head: decoupled per level, a box branch predicting the four side distances as a
  distribution over ``reg_max`` bins (DFL) and a class branch (sigmoid scores).

Because the objects here are 10-30 px on a 64 px picture, the three detection levels
sit at strides 4, 8 and 16 (YOLOv8 uses 8, 16, 32 on 640 px pictures).
``decode`` turns raw outputs into ``(boxes_xyxy, scores)`` in input pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Conv(nn.Sequential):
    """Conv2d + BatchNorm + SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 3, s: int = 1) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, k, s, k // 2, bias=False),
            nn.BatchNorm2d(cout),
            nn.SiLU(inplace=True),
        )


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool = True) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c, 3), Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP block of YOLOv8: split, n bottlenecks on one half, concat every output."""

    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        self.c = cout // 2
        self.cv1 = Conv(cin, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, cout, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling (fast): three chained 5x5 max-pools, concat, 1x1."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        hidden = cin // 2
        self.cv1 = Conv(cin, hidden, 1)
        self.cv2 = Conv(hidden * 4, cout, 1)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


class YoloV8(nn.Module):
    """Returns per-level raw maps ``(N, 4*reg_max + num_classes, H_l, W_l)``."""

    def __init__(
        self,
        num_classes: int = 3,
        widths: Sequence[int] = (16, 32, 64, 96),
        depth: int = 1,
        reg_max: int = 8,
        input_size: int = 64,
    ) -> None:
        super().__init__()
        c0, c1, c2, c3 = widths
        self.num_classes, self.reg_max, self.input_size = num_classes, reg_max, input_size
        self.strides = (4, 8, 16)
        self.stem = Conv(3, c0, 3, 2)  # /2
        self.s1 = nn.Sequential(Conv(c0, c1, 3, 2), C2f(c1, c1, depth))  # /4
        self.s2 = nn.Sequential(Conv(c1, c2, 3, 2), C2f(c2, c2, depth))  # /8
        self.s3 = nn.Sequential(Conv(c2, c3, 3, 2), C2f(c3, c3, depth), SPPF(c3, c3))  # /16
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.td2 = C2f(c3 + c2, c2, depth, shortcut=False)
        self.td1 = C2f(c2 + c1, c1, depth, shortcut=False)
        self.down1 = Conv(c1, c1, 3, 2)
        self.bu2 = C2f(c1 + c2, c2, depth, shortcut=False)
        self.down2 = Conv(c2, c2, 3, 2)
        self.bu3 = C2f(c2 + c3, c3, depth, shortcut=False)
        box_c = max(16, c1, 4 * reg_max)
        cls_c = max(c1, num_classes)
        self.box_heads = nn.ModuleList(
            nn.Sequential(
                Conv(c, box_c, 3), Conv(box_c, box_c, 3), nn.Conv2d(box_c, 4 * reg_max, 1)
            )
            for c in (c1, c2, c3)
        )
        self.cls_heads = nn.ModuleList(
            nn.Sequential(
                Conv(c, cls_c, 3), Conv(cls_c, cls_c, 3), nn.Conv2d(cls_c, num_classes, 1)
            )
            for c in (c1, c2, c3)
        )
        for head, stride in zip(self.cls_heads, self.strides, strict=True):
            # prior: about 5 objects per picture spread over the level's cells
            cells = (input_size / stride) ** 2
            nn.init.constant_(
                head[-1].bias, float(torch.log(torch.tensor(5 / num_classes / cells)))
            )
        for head in self.box_heads:
            nn.init.constant_(head[-1].bias, 1.0)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        p2 = self.s1(self.stem(x))
        p3 = self.s2(p2)
        p4 = self.s3(p3)
        n3 = self.td2(torch.cat([self.up(p4), p3], 1))
        o2 = self.td1(torch.cat([self.up(n3), p2], 1))
        o3 = self.bu2(torch.cat([self.down1(o2), n3], 1))
        o4 = self.bu3(torch.cat([self.down2(o3), p4], 1))
        return [
            torch.cat([bh(f), ch(f)], 1)
            for f, bh, ch in zip((o2, o3, o4), self.box_heads, self.cls_heads, strict=True)
        ]


def make_anchors(
    feats: Sequence[torch.Tensor], strides: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell centres ``(A, 2)`` in pixels and their strides ``(A, 1)``, level-major."""
    points, stride_t = [], []
    for f, s in zip(feats, strides, strict=True):
        h, w = f.shape[-2:]
        ys, xs = torch.meshgrid(
            torch.arange(h, dtype=torch.float32),
            torch.arange(w, dtype=torch.float32),
            indexing="ij",
        )
        points.append((torch.stack([xs, ys], -1).reshape(-1, 2) + 0.5) * s)
        stride_t.append(torch.full((h * w, 1), float(s)))
    return torch.cat(points), torch.cat(stride_t)


def flatten_outputs(
    feats: Sequence[torch.Tensor], reg_max: int, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw maps -> distance logits ``(N, A, 4, reg_max)`` and class logits ``(N, A, C)``."""
    n = feats[0].shape[0]
    flat = torch.cat([f.flatten(2) for f in feats], 2).transpose(1, 2)  # (N, A, 4R + C)
    dist, cls = flat.split([4 * reg_max, num_classes], dim=-1)
    return dist.reshape(n, -1, 4, reg_max), cls


def dfl_decode(dist_logits: torch.Tensor) -> torch.Tensor:
    """Expected bin index of each side distribution: ``(..., 4, R) -> (..., 4)``."""
    bins = torch.arange(dist_logits.shape[-1], dtype=dist_logits.dtype, device=dist_logits.device)
    return (dist_logits.softmax(-1) * bins).sum(-1)


def distances_to_boxes(
    ltrb: torch.Tensor, points: torch.Tensor, strides: torch.Tensor
) -> torch.Tensor:
    """Side distances in stride units around cell centres -> ``xyxy`` pixels."""
    d = ltrb * strides
    return torch.cat([points - d[..., :2], points + d[..., 2:]], -1)


def decode(model: YoloV8, feats: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes ``(N, A, 4)`` in input pixels and class probabilities ``(N, A, C)``."""
    points, strides = make_anchors(feats, model.strides)
    dist, cls = flatten_outputs(feats, model.reg_max, model.num_classes)
    boxes = distances_to_boxes(dfl_decode(dist), points.to(dist), strides.to(dist))
    return boxes, cls.sigmoid()

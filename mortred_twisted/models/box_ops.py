"""Box operations in plain torch (no torchvision): IoU, CIoU, greedy NMS, top-k.

Boxes are ``[x1, y1, x2, y2]`` float tensors. Shared by the YOLOV8 detector and the
SAM_AMG mask generator (box NMS over mask boxes).
"""

from __future__ import annotations

import math

import torch


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Areas of ``(..., 4)`` boxes (zero for degenerate boxes)."""
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(
        min=0
    )


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU ``(N, M)`` of ``(N, 4)`` and ``(M, 4)`` boxes (0 where both empty)."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=-1)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-9), torch.zeros_like(inter))


def ciou(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Element-wise complete IoU of matching ``(..., 4)`` boxes (Zheng et al., 2020)."""
    w1, h1 = a[..., 2] - a[..., 0], (a[..., 3] - a[..., 1]).clamp(min=eps)
    w2, h2 = b[..., 2] - b[..., 0], (b[..., 3] - b[..., 1]).clamp(min=eps)
    inter = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp(0) * (
        torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])
    ).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = torch.maximum(a[..., 2], b[..., 2]) - torch.minimum(a[..., 0], b[..., 0])
    ch = torch.maximum(a[..., 3], b[..., 3]) - torch.minimum(a[..., 1], b[..., 1])
    c2 = cw**2 + ch**2 + eps
    rho2 = (
        (b[..., 0] + b[..., 2] - a[..., 0] - a[..., 2]) ** 2
        + (b[..., 1] + b[..., 3] - a[..., 1] - a[..., 3]) ** 2
    ) / 4
    v = (4 / math.pi**2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy class-agnostic NMS; indices of kept boxes in decreasing score order.

    A box is suppressed when its IoU with an already kept, higher-scoring box is
    strictly greater than ``iou_threshold`` (torchvision's rule). Ties in score keep
    the lower index first (stable sort). Memory is ``O(N)``: the IoU of each kept box
    against the rest is computed when it is kept, never the ``N x N`` matrix (12,288
    SAM masks would need ~4 GB for it and its temporaries).
    """
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    order = torch.sort(scores, descending=True, stable=True).indices
    ordered = boxes[order]
    n = order.numel()
    suppressed = torch.zeros(n, dtype=torch.bool)
    keep: list[int] = []
    for i in range(n):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed[i + 1 :] |= box_iou(ordered[i : i + 1], ordered[i + 1 :])[0] > iou_threshold
    return order[torch.tensor(keep, dtype=torch.long)]

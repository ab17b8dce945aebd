"""YOLOv8 training loss: task-aligned assignment, BCE classes, CIoU + DFL boxes.

Task-aligned assigner (Feng et al., TOOD 2021, as in YOLOv8): for each ground-truth
box, among the anchor points inside it, take the ``topk`` with the largest alignment
``score^alpha * IoU^beta``; an anchor claimed by several boxes keeps the one it
overlaps most. Class targets are soft: the alignment, normalised per box so that its
best anchor gets that box's best IoU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mortred_twisted.models.box_ops import ciou
from mortred_twisted.models.yolov8.network import (
    YoloV8,
    dfl_decode,
    distances_to_boxes,
    flatten_outputs,
    make_anchors,
)


def pairwise_iou(gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """IoU ``(B, M, A)`` of gt ``(B, M, 4)`` against predictions ``(B, A, 4)``."""
    lt = torch.maximum(gt[:, :, None, :2], pred[:, None, :, :2])
    rb = torch.minimum(gt[:, :, None, 2:], pred[:, None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_g = (gt[..., 2:] - gt[..., :2]).clamp(min=0).prod(-1)
    area_p = (pred[..., 2:] - pred[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_g[:, :, None] + area_p[:, None, :] - inter + 1e-9)


@torch.no_grad()
def assign(
    scores: torch.Tensor,
    boxes: torch.Tensor,
    points: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_valid: torch.Tensor,
    topk: int = 10,
    alpha: float = 0.5,
    beta: float = 6.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return ``fg (B, A) bool``, ``target_boxes (B, A, 4)``, ``target_scores (B, A, C)``."""
    b, a, c = scores.shape
    m = gt_boxes.shape[1]
    if m == 0:
        return torch.zeros(b, a, dtype=torch.bool), torch.zeros(b, a, 4), torch.zeros(b, a, c)
    lt = points[None, None] - gt_boxes[:, :, None, :2]
    rb = gt_boxes[:, :, None, 2:] - points[None, None]
    inside = torch.cat([lt, rb], -1).amin(-1) > 1e-9  # (B, M, A)
    valid = inside & gt_valid[:, :, None]
    iou = pairwise_iou(gt_boxes, boxes).clamp(0) * valid
    label_idx = gt_labels.clamp(min=0)[:, :, None].expand(b, m, a)
    cls_score = scores.transpose(1, 2).gather(1, label_idx)  # (B, M, A)
    align = cls_score.pow(alpha) * iou.pow(beta) * valid
    k = min(topk, a)
    top = align.topk(k, dim=-1).indices
    mask_top = torch.zeros_like(align, dtype=torch.bool).scatter_(-1, top, True)
    mask_pos = mask_top & valid
    multi = mask_pos.sum(1, keepdim=True) > 1  # anchors claimed by several gts
    if multi.any():
        best = F.one_hot(iou.argmax(1), m).permute(0, 2, 1).bool()
        mask_pos = torch.where(multi, best & valid, mask_pos)
    fg = mask_pos.any(1)
    gt_idx = mask_pos.float().argmax(1)  # (B, A)
    target_boxes = gt_boxes.gather(1, gt_idx[..., None].expand(b, a, 4))
    target_labels = gt_labels.gather(1, gt_idx).clamp(min=0)
    align = align * mask_pos
    pos_align_max = align.amax(-1, keepdim=True)
    pos_iou_max = (iou * mask_pos).amax(-1, keepdim=True)
    norm = (align * pos_iou_max / (pos_align_max + 1e-9)).amax(1)  # (B, A)
    target_scores = F.one_hot(target_labels, c).float() * (norm * fg)[..., None]
    return fg, target_boxes, target_scores


def dfl_loss(dist: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Distribution focal loss ``(P, 4, R)`` vs continuous targets ``(P, 4)`` -> ``(P,)``."""
    reg_max = dist.shape[-1]
    target = target.clamp(0, reg_max - 1 - 0.01)
    left = target.long()
    wl = left + 1 - target
    logp = dist.log_softmax(-1)
    loss = -(
        logp.gather(-1, left[..., None]).squeeze(-1) * wl
        + logp.gather(-1, (left + 1)[..., None]).squeeze(-1) * (1 - wl)
    )
    return loss.mean(-1)


def yolo_loss(
    model: YoloV8,
    feats: list[torch.Tensor],
    gt_labels: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_valid: torch.Tensor,
    gains: tuple[float, float, float] = (7.5, 0.5, 1.5),
) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss (box CIoU, class BCE, DFL with YOLOv8's gains) and its parts."""
    points, strides = make_anchors(feats, model.strides)
    dist, cls_logits = flatten_outputs(feats, model.reg_max, model.num_classes)
    ltrb = dfl_decode(dist)
    boxes = distances_to_boxes(ltrb, points, strides)
    fg, t_boxes, t_scores = assign(
        cls_logits.detach().sigmoid(), boxes.detach(), points, gt_labels, gt_boxes, gt_valid
    )
    norm = t_scores.sum().clamp(min=1.0)
    loss_cls = F.binary_cross_entropy_with_logits(cls_logits, t_scores, reduction="sum") / norm
    if fg.any():
        weight = t_scores.sum(-1)[fg]
        loss_box = ((1.0 - ciou(boxes[fg], t_boxes[fg])) * weight).sum() / norm
        s = strides.expand(fg.shape[0], -1, -1)[fg]
        p = points.expand(fg.shape[0], -1, -1)[fg]
        t_ltrb = torch.cat([p - t_boxes[fg][:, :2], t_boxes[fg][:, 2:] - p], -1) / s
        loss_dfl = (dfl_loss(dist[fg], t_ltrb) * weight).sum() / norm
    else:
        loss_box = loss_dfl = boxes.sum() * 0.0
    total = gains[0] * loss_box + gains[1] * loss_cls + gains[2] * loss_dfl
    return total, {
        "box": round(loss_box.item(), 4),
        "cls": round(loss_cls.item(), 4),
        "dfl": round(loss_dfl.item(), 4),
    }

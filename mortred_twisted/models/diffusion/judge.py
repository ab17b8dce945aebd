"""The judge: a small CNN digit classifier used to score generated samples.

Input ``(B, 1, 16, 16)`` float in ``[-1, 1]`` (the generators' output range); output
logits ``(B, 10)``. Trained by ``training/diffusion/train_judge.py`` on the same
train split as the generators and measured on the held-out split. It is a measuring
instrument for the quality figures (and a candidate for embedded classifier weights),
not a served model by itself.
"""

from __future__ import annotations

import torch
from torch import nn

JUDGE_ARCH = {"channels": [32, 64], "hidden": 128, "num_classes": 10, "image_size": 16}


def conv_features(in_channels: int, c1: int, c2: int) -> nn.Sequential:
    """The judges' feature extractor: (conv-BN-ReLU ×2, max-pool) ×2, side / 4. Its
    layer order is part of the saved weights' keys (``features.<i>.…``)."""
    layers: list[nn.Module] = []
    for cin, cout in ((in_channels, c1), (c1, c2)):
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
        layers += [nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class DigitJudge(nn.Module):
    """conv-conv-pool x2, then a 2-layer head. Stateless at inference."""

    def __init__(
        self,
        channels: tuple[int, int] | list[int] = (32, 64),
        hidden: int = 128,
        num_classes: int = 10,
        image_size: int = 16,
    ) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = conv_features(1, c1, c2)
        side = image_size // 4
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(0.3),
            nn.Linear(c2 * side * side, hidden),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

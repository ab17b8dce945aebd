"""The MobileNetV2 network (Sandler et al., 2018) in plain torch.

Inverted residual blocks (1x1 expansion, 3x3 depthwise, linear 1x1 projection, a
residual when stride is 1 and widths match), a width multiplier that scales every
layer (rounded to multiples of 8) and a configurable input size. For the small
pictures served here the stem has stride 1 and ``strides`` can trim the down-sampling
of the standard table (the standard network down-samples 32x; a 32 px input then ends
on a 1x1 map, which still works but wastes the first blocks).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: The standard table: expansion t, output channels c, repeats n, first stride s.
STANDARD_SETTINGS: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to a multiple of ``divisor`` without losing more than 10 %."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


class ConvBNReLU6(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise (3x3, stride) -> project (1x1, linear) [+ input]."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = round(cin * expand)
        self.use_residual = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNReLU6(cin, hidden, kernel=1))
        layers += [
            ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


class MobileNetV2(nn.Module):
    """MobileNetV2 classifier returning logits of shape ``(N, num_classes)``.

    ``strides`` overrides the first stride of each row of :data:`STANDARD_SETTINGS`
    (same length); ``repeats_scale`` multiplies every repeat count (at least 1).
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        width_mult: float = 1.0,
        input_size: int = 224,
        stem_stride: int = 2,
        strides: Sequence[int] | None = None,
        repeats_scale: float = 1.0,
        last_channel: int = 1280,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.in_channels = in_channels
        settings = list(STANDARD_SETTINGS)
        if strides is not None:
            if len(strides) != len(settings):
                raise ValueError(f"strides needs {len(settings)} entries")
            settings = [(t, c, n, s) for (t, c, n, _), s in zip(settings, strides, strict=True)]
        cin = make_divisible(32 * width_mult)
        self.last_channel = make_divisible(last_channel * max(1.0, width_mult))
        layers: list[nn.Module] = [ConvBNReLU6(in_channels, cin, stride=stem_stride)]
        for t, c, n, s in settings:
            cout = make_divisible(c * width_mult)
            for i in range(max(1, round(n * repeats_scale))):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(ConvBNReLU6(cin, self.last_channel, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes)
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = x.mean(dim=(2, 3))
        return self.classifier(x)

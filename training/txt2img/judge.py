"""The text-to-image judge: a small CNN that reads a picture's four caption attributes.

Input ``(B, 3, 32, 32)`` float in ``[-1, 1]`` (the pipeline's range before its
post-processing); output one logits tensor per attribute of
``mortred_twisted.data.captions.ATTRIBUTES`` (shape 3, colour 6, position 5,
background 6). Trained by ``training/txt2img/train_judge.py`` on its own split
(``judge``), apart from the generator: it never sees a generated picture. It is a
measuring instrument for ``eval_txt2img``, not a served model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from mortred_twisted.data.captions import ATTRIBUTES
from mortred_twisted.models.diffusion.judge import conv_features
from mortred_twisted.models.diffusion.manifest import read_manifest, verify_files

JUDGE_ARCH: dict[str, object] = {"channels": [32, 64], "hidden": 128, "image_size": 32}
WEIGHTS_NAME = "judge.safetensors"
CONFIG_NAME = "config.json"


class AttributeJudge(nn.Module):
    """conv-conv-pool x2, a shared hidden layer, one linear head per attribute."""

    def __init__(
        self,
        channels: tuple[int, int] | list[int] = (32, 64),
        hidden: int = 128,
        image_size: int = 32,
    ) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = conv_features(3, c1, c2)
        side = image_size // 4
        self.trunk = nn.Sequential(
            nn.Flatten(), nn.Dropout(0.3), nn.Linear(c2 * side * side, hidden), nn.ReLU()
        )
        self.heads = nn.ModuleDict(
            {name: nn.Linear(hidden, len(values)) for name, values in ATTRIBUTES.items()}
        )

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(self.features(x))
        return {name: head(h) for name, head in self.heads.items()}

    @torch.no_grad()
    def predict(self, x: torch.Tensor, batch: int = 256) -> torch.Tensor:
        """``(N, 4)`` int64 predictions, columns in ``ATTRIBUTES`` order (eval mode)."""
        self.eval()
        out = []
        for chunk in x.split(batch):
            logits = self(chunk)
            out.append(torch.stack([logits[name].argmax(1) for name in ATTRIBUTES], 1))
        return torch.cat(out)


def load_judge(directory: Path) -> AttributeJudge:
    """The judge saved in ``directory``, its files checked against ``manifest.json``."""
    from safetensors.torch import load_file

    verify_files(directory, read_manifest(directory), [CONFIG_NAME, WEIGHTS_NAME])
    arch = json.loads((directory / CONFIG_NAME).read_text())
    net = AttributeJudge(**arch)
    net.load_state_dict(load_file(directory / WEIGHTS_NAME))
    return net.eval()

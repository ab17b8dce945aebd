"""The warm start of ``training/perception/train_sam.py`` (a finer-patch ``SamModel`` from
a coarser one) and its learning-rate shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from training.perception.train_sam import build, lr_factor, save, warm_start


def test_folded_patch_kernels_see_an_upsampled_picture(tmp_path: Path) -> None:
    """After a warm start from a 4 px-patch model, the 2 px-patch model's patch
    embedding of a picture equals the source's embedding of that picture upsampled 2x
    (nearest); every tensor is copied or resized, none left fresh."""
    torch.manual_seed(0)
    coarse = build(64, 4).eval()
    save(coarse, tmp_path / "coarse", {"size": {"longest_edge": 64}})
    fine = build(64, 2).eval()
    assert warm_start(fine, tmp_path / "coarse") == []
    picture = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ours = fine.vision_encoder.patch_embed.projection(picture)
        theirs = coarse.vision_encoder.patch_embed.projection(
            F.interpolate(picture, scale_factor=2, mode="nearest")
        )
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    decoder = "mask_decoder.upscale_conv1.weight"
    assert torch.equal(fine.state_dict()[decoder], coarse.state_dict()[decoder])
    for pe in (
        "shared_image_embedding.positional_embedding",
        "prompt_encoder.shared_embedding.positional_embedding",  # tied, saved once
    ):
        assert torch.equal(fine.state_dict()[pe], coarse.state_dict()[pe])


def test_lr_factor_warms_up_then_decays() -> None:
    """The schedule rises over the first 5 %, peaks at 1 and decays to ~0 at the end."""
    assert lr_factor(0.0) == pytest.approx(0.04)
    assert lr_factor(0.05) == pytest.approx(1.0, abs=2e-3)
    assert lr_factor(0.5) < lr_factor(0.2) < 1.0
    assert lr_factor(1.0) == pytest.approx(1e-3)

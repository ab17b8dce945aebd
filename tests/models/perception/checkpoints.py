"""Reduced-size, random-weight stand-ins of public transformers checkpoints.

Each builder writes a directory with the same model class, config keys and image
processor as the public checkpoint it names (``google/mobilenet_v2_1.0_224``,
``PekingU/rtdetr_r18vd``, ``facebook/sam-vit-base``), only narrower, shallower and at a
smaller input size, saved with ``save_pretrained`` and listed in a sha256 manifest
(``write_manifest``), as a user would after downloading the real one. Seeded: the same
call writes the same weights.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from mortred_twisted.models.diffusion.manifest import write_manifest

IMAGENET_LABELS = 1001  # mobilenet_v2_1.0_224: "background" + the 1,000 ImageNet classes
COCO_LABELS = 80


def _labels(n: int, prefix: str) -> dict[int, str]:
    return {i: f"{prefix}_{i}" for i in range(n)}


def mobilenet_v2_like(directory: Path) -> Path:
    """``MobileNetV2ForImageClassification`` + ``MobileNetV2ImageProcessor`` of
    mobilenet_v2_1.0_224's keys (resize shortest edge, centre crop, mean/std 0.5), width
    0.35 at 64 px, 1,001 labels."""
    from transformers import (
        MobileNetV2Config,
        MobileNetV2ForImageClassification,
        MobileNetV2ImageProcessorPil,
    )

    torch.manual_seed(0)
    labels = _labels(IMAGENET_LABELS, "imagenet")
    labels[0] = "background"
    config = MobileNetV2Config(
        num_channels=3,
        image_size=64,
        depth_multiplier=0.35,
        depth_divisible_by=8,
        min_depth=8,
        expand_ratio=6.0,
        output_stride=32,
        first_layer_is_expansion=True,
        finegrained_output=True,
        hidden_act="relu6",
        tf_padding=True,
        classifier_dropout_prob=0.2,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    MobileNetV2ForImageClassification(config).save_pretrained(str(directory))
    MobileNetV2ImageProcessorPil(
        size={"shortest_edge": 72},
        crop_size={"height": 64, "width": 64},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    ).save_pretrained(str(directory))
    write_manifest(directory)
    return directory


def rtdetr_r18_like(directory: Path) -> Path:
    """``RTDetrForObjectDetection`` (its own ResNet-vd backbone of basic blocks, no timm)
    + ``RTDetrImageProcessor`` of rtdetr_r18vd's keys, quarter width, one block per stage,
    one decoder layer, 128 px input, the 80 COCO label ids."""
    from transformers import (
        RTDetrConfig,
        RTDetrForObjectDetection,
        RTDetrImageProcessorPil,
        RTDetrResNetConfig,
    )

    torch.manual_seed(0)
    labels = _labels(COCO_LABELS, "coco")
    backbone = RTDetrResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        hidden_act="relu",
        downsample_in_first_stage=False,
        downsample_in_bottleneck=False,
        out_features=["stage2", "stage3", "stage4"],
    )
    config = RTDetrConfig(
        backbone_config=backbone,
        encoder_in_channels=[32, 64, 128],
        feat_strides=[8, 16, 32],
        encoder_hidden_dim=32,
        encoder_ffn_dim=64,
        encoder_attention_heads=2,
        hidden_expansion=0.5,
        d_model=32,
        decoder_in_channels=[32, 32, 32],
        decoder_ffn_dim=64,
        decoder_layers=1,
        decoder_attention_heads=2,
        num_queries=20,
        num_denoising=10,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        RTDetrForObjectDetection(config).save_pretrained(str(directory))
    RTDetrImageProcessorPil(size={"height": 128, "width": 128}).save_pretrained(str(directory))
    write_manifest(directory)
    return directory


def sam_vit_base_like(directory: Path) -> Path:
    """``SamModel`` + ``SamImageProcessor`` of sam-vit-base's keys (ViT encoder with
    windowed and global attention, 16 px patches, prompt encoder, two-way mask decoder),
    width 32 and two layers at a 256 px input (low-res masks 64 px)."""
    from transformers import SamConfig, SamImageProcessorPil, SamModel

    torch.manual_seed(0)
    dim = 32
    config = SamConfig(
        vision_config={
            "hidden_size": 48,
            "output_channels": dim,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 256,
            "patch_size": 16,
            "mlp_dim": 96,
            "window_size": 14,
            "global_attn_indexes": [1],
            "num_pos_feats": dim // 2,
        },
        prompt_encoder_config={"hidden_size": dim, "image_size": 256, "patch_size": 16},
        mask_decoder_config={
            "hidden_size": dim,
            "mlp_dim": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "iou_head_hidden_dim": dim,
        },
    )
    SamModel(config).save_pretrained(str(directory))
    SamImageProcessorPil(
        size={"longest_edge": 256}, pad_size={"height": 256, "width": 256}
    ).save_pretrained(str(directory))
    write_manifest(directory)
    return directory


BUILDERS = {
    "IMAGE_CLASSIFICATION": mobilenet_v2_like,
    "OBJECT_DETECTION": rtdetr_r18_like,
    "SAM_AMG": sam_vit_base_like,
}


def build(family: str, directory: Path) -> Path:
    """Write the stand-in checkpoint of ``family`` into ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    return BUILDERS[family](directory)

"""Tiny random-weight directories in public transformers layouts, built at test time.

Each builder writes what ``save_pretrained`` of the library's own classes writes for a
public checkpoint of that kind (``config.json``, ``model.safetensors``, the image
processor's ``preprocessor_config.json``, a tokenizer where the model has one), only
narrow and small, seeded (the same call writes the same weights). Nothing is
downloaded; no timm, no torchvision.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch


def _labels(n: int, prefix: str) -> tuple[dict[int, str], dict[str, int]]:
    id2label = {i: f"{prefix}_{i}" for i in range(n)}
    return id2label, {v: k for k, v in id2label.items()}


def vit_classifier(directory: Path) -> Path:
    """google/vit-base-patch16-224's layout: ViTForImageClassification + ViTImageProcessor,
    32 px input, 8 px patches, width 32, 10 labels."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    torch.manual_seed(0)
    id2label, label2id = _labels(10, "class")
    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        id2label=id2label,
        label2id=label2id,
    )
    ViTForImageClassification(config).save_pretrained(str(directory))
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(str(directory))
    return directory


def clip_vocab() -> dict[str, int]:
    """A byte-level BPE vocabulary without merges (every byte a token, and its end of
    word form) plus CLIP's two special tokens: enough to tell labels apart."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab: dict[str, int] = {}
    for char in bytes_to_unicode().values():
        vocab[char] = len(vocab)
    for char in list(vocab):
        vocab[char + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab


def clip_model(directory: Path) -> Path:
    """openai/clip-vit-base-patch32's layout: CLIPModel + CLIPImageProcessor + the
    CLIP tokenizer (a vocabulary made here), 32 px input, width 32."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

    torch.manual_seed(0)
    vocab = clip_vocab()
    config = CLIPConfig(
        text_config={
            "vocab_size": len(vocab),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 77,
            "bos_token_id": vocab["<|startoftext|>"],
            "eos_token_id": vocab["<|endoftext|>"],
            "pad_token_id": vocab["<|endoftext|>"],
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    CLIPModel(config).save_pretrained(str(directory))
    CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77).save_pretrained(str(directory))
    CLIPImageProcessorPil(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    ).save_pretrained(str(directory))
    return directory


def detr_detector(directory: Path) -> Path:
    """facebook/detr-resnet-50's layout without timm: DetrForObjectDetection on a
    transformers ResNet backbone (``use_timm_backbone=False``) + DetrImageProcessor,
    width 16/32, one encoder and decoder layer, 10 queries, 5 labels, 64 px."""
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessorPil, ResNetConfig

    torch.manual_seed(0)
    id2label, label2id = _labels(5, "thing")
    backbone = ResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 32],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage4"],
    )
    config = DetrConfig(
        use_timm_backbone=False,
        backbone_config=backbone,
        use_pretrained_backbone=False,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_queries=10,
        id2label=id2label,
        label2id=label2id,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        DetrForObjectDetection(config).save_pretrained(str(directory))
    DetrImageProcessorPil(size={"shortest_edge": 64, "longest_edge": 96}).save_pretrained(
        str(directory)
    )
    return directory


def segformer_segmenter(directory: Path) -> Path:
    """nvidia/segformer-b0-finetuned-ade-512-512's layout at 64 px: two stages, 6 labels."""
    from transformers import (
        SegformerConfig,
        SegformerForSemanticSegmentation,
        SegformerImageProcessorPil,
    )

    torch.manual_seed(0)
    id2label, label2id = _labels(6, "stuff")
    config = SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        id2label=id2label,
        label2id=label2id,
    )
    SegformerForSemanticSegmentation(config).save_pretrained(str(directory))
    SegformerImageProcessorPil(size={"height": 64, "width": 64}).save_pretrained(str(directory))
    return directory


def dpt_depth(directory: Path) -> Path:
    """Intel/dpt-hybrid-free layout (DPTForDepthEstimation, plain ViT) at 32 px, width 32."""
    from transformers import DPTConfig, DPTForDepthEstimation, DPTImageProcessorPil

    torch.manual_seed(0)
    config = DPTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 16, 32],
        fusion_hidden_size=16,
        head_in_index=-1,
        reassemble_factors=[4, 2, 1, 0.5],
    )
    DPTForDepthEstimation(config).save_pretrained(str(directory))
    DPTImageProcessorPil(size={"height": 32, "width": 32}, keep_aspect_ratio=False).save_pretrained(
        str(directory)
    )
    return directory


def _sam_config(width: int, num_pos_feats: int | None) -> object:
    from transformers import SamConfig

    vision = {
        "hidden_size": 32,
        "output_channels": width,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "mlp_dim": 64,
        "image_size": 1024,
        "patch_size": 16,
        "window_size": 14,
        "global_attn_indexes": [1],
    }
    if num_pos_feats is not None:
        vision["num_pos_feats"] = num_pos_feats
    return SamConfig(
        vision_config=vision,
        prompt_encoder_config={"hidden_size": width, "image_size": 1024, "patch_size": 16},
        mask_decoder_config={
            "hidden_size": width,
            "mlp_dim": 2 * width,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "iou_head_hidden_dim": width,
        },
    )


def sam_vit_base(directory: Path) -> Path:
    """facebook/sam-vit-base's layout at its own geometry (1024 px input, 16 px
    patches: a 64×64 embedding grid, 256 px low-resolution masks), width 16, two
    encoder layers, its processor's defaults."""
    from transformers import SamImageProcessorPil, SamModel

    torch.manual_seed(0)
    SamModel(_sam_config(16, 8)).save_pretrained(str(directory))
    SamImageProcessorPil().save_pretrained(str(directory))
    return directory


def sam_vit_base_default_pos_feats(directory: Path) -> Path:
    """The directory of the issue-28 report: sam-vit-base's layout at width 64 with
    sam-vit-base's ``num_pos_feats = 128`` left in (SamModel cannot run it)."""
    from transformers import SamImageProcessorPil, SamModel

    torch.manual_seed(0)
    SamModel(_sam_config(64, None)).save_pretrained(str(directory))
    SamImageProcessorPil().save_pretrained(str(directory))
    return directory


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "image-classification": vit_classifier,
    "zero-shot-image-classification": clip_model,
    "object-detection": detr_detector,
    "image-segmentation": segformer_segmenter,
    "depth-estimation": dpt_depth,
    "mask-generation": sam_vit_base,
}


def build(task: str, directory: Path) -> Path:
    """Write the tiny directory of ``task`` into ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    return BUILDERS[task](directory)


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def config_of(directory: Path) -> dict[str, object]:
    return json.loads((directory / "config.json").read_text())

"""``task = "zero-shot-image-classification"``: a CLIP-style directory (``CLIPModel``,
``SiglipModel``, … with its tokenizer and image processor).

Inputs: ``image``, ``labels`` (1..64 candidate labels, non-empty and distinct),
``hypothesis_template`` (the text each label is put into; must contain ``{}``;
default ``"a photo of a {}."``). Output: ``{"labels": [str], "scores": [float]}``
sorted by score; scores are the softmax of the model's image-text logits over the
given labels (they sum to 1). Batched: the pictures of a batch go through the vision
tower together and every distinct text of the batch through the text tower once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mortred_twisted.model_api.base import InvalidRequest, ModelLoadError
from mortred_twisted.models.transformers_tasks.common import (
    COMMON_OPTIONS,
    check_options,
    forward_groups,
    load_parts,
    run_items,
)
from mortred_twisted.sdk import Context, Image, Input, ServedModel

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
MAX_LABELS = 64


@dataclass
class ZeroShotClassification:
    """The given labels, most probable first."""

    labels: list[str]
    scores: list[float]


def load_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{directory}: cannot load the tokenizer: {exc}") from exc


def check_labels(labels: list[str] | None, template: str) -> list[str]:
    if not labels:
        raise InvalidRequest("params.labels", "give at least one label")
    cleaned = [label.strip() for label in labels]
    if any(not label for label in cleaned):
        raise InvalidRequest("params.labels", "labels must not be empty")
    if len(set(cleaned)) != len(cleaned):
        raise InvalidRequest("params.labels", "labels must be distinct")
    if "{}" not in template:
        raise InvalidRequest("params.hypothesis_template", "must contain {} (the label)")
    return cleaned


class ZeroShotClassifier(ServedModel):
    """Scores a picture against labels given with the request (CLIP-style)."""

    max_batch_size = 16

    def setup(self) -> None:
        check_options(self.options, COMMON_OPTIONS)
        self.parts = load_parts(
            self.options, self.root, "AutoModel", extra=[("the tokenizer", TOKENIZER_FILES)]
        )
        model = self.parts.model
        if not (hasattr(model, "get_image_features") and hasattr(model, "get_text_features")):
            raise ModelLoadError(
                f"{self.parts.directory}: {type(model).__name__} has no image and text "
                "towers (zero-shot classification needs a CLIP-style model)"
            )
        self.tokenizer = load_tokenizer(self.parts.directory)

    def predict(
        self,
        ctx: Context,
        image: Image = Input(description="the picture"),
        labels: list[str] = Input(description="candidate labels", max_items=MAX_LABELS),
        hypothesis_template: str = Input(
            "a photo of a {}.", max_length=200, description="text around each label ({})"
        ),
    ) -> ZeroShotClassification:
        item = {"image": image, "labels": labels, "hypothesis_template": hypothesis_template}
        out = self.predict_batch(ctx, [item])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def predict_batch(self, ctx: Any, items: list[dict[str, Any]]) -> list[Any]:
        checked: list[dict[str, Any]] = []
        for item in items:
            template = item.get("hypothesis_template") or "a photo of a {}."
            try:
                labels = check_labels(item.get("labels"), template)
                checked.append({**item, "labels": labels, "hypothesis_template": template})
            except InvalidRequest as exc:
                checked.append({**item, "error": exc})
        return run_items(checked, self._score)

    def _score(self, pictures: list[Any], items: list[dict[str, Any]]) -> list[Any]:
        import torch

        answers: list[Any] = [item.get("error") for item in items]
        good = [i for i, e in enumerate(answers) if e is None]
        if not good:
            return answers
        model = self.parts.model
        placed = forward_groups(
            self.parts,
            [pictures[i] for i in good],
            lambda b: _features(model.get_image_features(**b)),
        )
        texts = sorted(
            {
                items[i]["hypothesis_template"].replace("{}", label)
                for i in good
                for label in items[i]["labels"]
            }
        )
        tokens = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        tokens = {k: v.to(self.parts.device) for k, v in tokens.items() if torch.is_tensor(v)}
        with torch.inference_mode():
            text = _features(model.get_text_features(**tokens)).float()
        text = text / text.norm(dim=-1, keepdim=True)
        row_of = {t: r for r, t in enumerate(texts)}
        with torch.inference_mode():
            scale = model.logit_scale.exp().float() if hasattr(model, "logit_scale") else 1.0
        for i, (feats, row) in zip(good, placed, strict=True):
            vec = feats[row].float()
            vec = vec / vec.norm()
            template, labels = items[i]["hypothesis_template"], items[i]["labels"]
            rows = [row_of[template.replace("{}", label)] for label in labels]
            with torch.inference_mode():
                probs = (scale * text[rows] @ vec).softmax(-1).cpu()
            order = torch.argsort(probs, descending=True, stable=True).tolist()
            answers[i] = ZeroShotClassification(
                labels=[labels[j] for j in order],
                scores=[round(float(probs[j]), 6) for j in order],
            )
        return answers


def _features(out: Any) -> Any:
    """A tower's embedding (newer transformers return an output object)."""
    if hasattr(out, "pooler_output") and not hasattr(out, "shape"):
        return out.pooler_output
    return out

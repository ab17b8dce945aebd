"""scikit-learn's handwritten digits at a working resolution, with a fixed split.

Used by training scripts, quality evaluations and tests; never by the serving path
(scikit-learn is a training/test dependency only). Images are ``float32`` in
``[0, 1]`` (ink bright on a dark background), shape ``(N, size, size)``; labels are
``int64`` in ``0..9``. The split is a fixed stratified permutation drawn from
``SPLIT_SEED``: the same on every machine.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

SPLIT_SEED = 20261130
TEST_FRACTION = 0.2


@lru_cache(maxsize=8)
def _resized(size: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    raw = (bunch.images / 16.0).astype(np.float32)  # (1797, 8, 8) in [0, 1]
    out = np.empty((raw.shape[0], size, size), dtype=np.float32)
    for i, img in enumerate(raw):
        pil = Image.fromarray(img, mode="F").resize((size, size), Image.BILINEAR)
        out[i] = np.clip(np.asarray(pil, dtype=np.float32), 0.0, 1.0)
    return out, bunch.target.astype(np.int64)


@lru_cache(maxsize=1)
def _split_indices() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    labels = load_digits().target
    rng = np.random.default_rng(SPLIT_SEED)
    train, test = [], []
    for cls in range(10):
        idx = np.flatnonzero(labels == cls)
        rng.shuffle(idx)
        n_test = round(len(idx) * TEST_FRACTION)
        test.extend(idx[:n_test])
        train.extend(idx[n_test:])
    return np.sort(np.array(train)), np.sort(np.array(test))


def load_digit_split(size: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images, labels)`` of ``split`` (``"train"``, ``"test"`` or ``"all"``)."""
    images, labels = _resized(size)
    if split == "all":
        return images.copy(), labels.copy()
    train, test = _split_indices()
    idx = {"train": train, "test": test}.get(split)
    if idx is None:
        raise ValueError(f"unknown split {split!r}; use 'train', 'test' or 'all'")
    return images[idx], labels[idx]

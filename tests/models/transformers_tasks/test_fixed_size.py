"""``common.fixed_size``: when several pictures may go through the image processor in
one call (every picture gets one shape on its own), and when not (padding to the
batch, or a size that follows the picture)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mortred_twisted.models.transformers_tasks.common import fixed_size


@pytest.mark.parametrize(
    ("settings", "fixed"),
    [
        ({"do_resize": True, "size": {"height": 64, "width": 64}}, True),  # RT-DETR
        (  # MobileNetV2: shortest edge, then a fixed centre crop
            {"do_resize": True, "size": {"shortest_edge": 32}, "do_center_crop": True,
             "crop_size": {"height": 32, "width": 32}},
            True,
        ),
        ({"do_resize": True, "size": {"shortest_edge": 800, "longest_edge": 1333}}, False),
        ({"do_resize": True, "size": {"height": 64, "width": 64}, "do_pad": True}, False),
        ({"do_resize": True, "size": {"longest_edge": 64}, "do_pad": True}, False),  # SAM
        ({"do_resize": False, "size": {"height": 64, "width": 64}}, False),
        ({"do_center_crop": True, "crop_size": {"shortest_edge": 32}}, False),
        ({}, False),
    ],
)  # fmt: skip
def test_fixed_size(settings: dict[str, Any], fixed: bool) -> None:
    assert fixed_size(SimpleNamespace(**settings)) is fixed

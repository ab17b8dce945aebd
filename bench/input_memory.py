"""Working memory of one request, to size a model's ``max_images`` / ``max_pixels``.

Builds the model of a server TOML in a fresh process (the registry, verified
weights), then runs one request of ``--images`` pictures of ``--side`` x ``--side``
pixels (the first demo picture under ``demo_data/``, resized) and prints the peak
resident memory above the loaded model, per request and per pixel::

    .venv/bin/python bench/input_memory.py conf/server/segment_anything/sam_amg.toml \\
        --side 512 [--images 1] [--params '{"points_per_side": 16}']

Each measurement runs in its own process (``ru_maxrss`` only grows), so run the
command once per size. docs/configuration.md ("Input limits") says how the shipped
defaults were sized with it.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402

from mortred_twisted.config.server import load_server_config  # noqa: E402
from mortred_twisted.model_api.base import InferenceRequest, RunContext  # noqa: E402
from mortred_twisted.models.registry import create_model  # noqa: E402


def picture(side: int) -> bytes:
    """The first demo picture, resized to ``side`` x ``side``, as PNG bytes."""
    source = sorted((ROOT / "demo_data").rglob("*.png"))[0]
    buf = io.BytesIO()
    Image.open(source).convert("RGB").resize((side, side)).save(buf, format="PNG")
    return buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a server TOML (conf/server/...)")
    parser.add_argument("--side", type=int, default=512)
    parser.add_argument("--images", type=int, default=1)
    parser.add_argument("--params", default="{}", help="request params, JSON")
    args = parser.parse_args()
    config = load_server_config(ROOT / args.config)
    model = create_model(config.model_type, config.model_options, Path(config.root))
    images = (picture(args.side),) * args.images
    request = model.validate(InferenceRequest("bench", images, json.loads(args.params)))
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    model.run(request, RunContext())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    delta = (peak - loaded) * 1024
    pixels = args.side * args.side * args.images
    print(
        f"{config.model_type}: {args.images} x {args.side}x{args.side} px, "
        f"params {args.params}: +{delta / 2**20:.0f} MiB above the loaded model "
        f"({loaded / 1024:.0f} MiB), {delta / pixels:.0f} B per pixel"
    )


if __name__ == "__main__":
    main()

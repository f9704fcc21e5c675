"""``python -m streamrl.examples.longtail_copy``: build the long-tail policy and dataset if missing."""

from __future__ import annotations

from streamrl.examples.assets_cli import build_assets
from streamrl.examples.longtail_copy.assets import build_policy, write_dataset

if __name__ == "__main__":
    build_assets(
        "long-tail", build_policy, write_dataset, "runs/longtail-policy",
        "runs/longtail-data/train.jsonl",
    )  # fmt: skip

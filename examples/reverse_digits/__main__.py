"""``python -m streamrl.examples.reverse_digits``: build the demo policy and dataset if missing."""

from __future__ import annotations

from streamrl.examples.assets_cli import build_assets
from streamrl.examples.reverse_digits.assets import build_policy, write_dataset

if __name__ == "__main__":
    build_assets(
        "demo", build_policy, write_dataset, "runs/demo-policy", "runs/demo-data/train.jsonl"
    )

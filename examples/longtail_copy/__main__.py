"""``python -m streamrl.examples.longtail_copy``: build the long-tail policy and dataset if missing."""

from __future__ import annotations

import argparse

from streamrl.examples.longtail_copy.assets import build_policy, write_dataset


def main() -> None:
    parser = argparse.ArgumentParser(
        description="build the long-tail policy and dataset where they are missing"
    )
    parser.add_argument("--policy", default="runs/longtail-policy")
    parser.add_argument("--data", default="runs/longtail-data/train.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(build_policy(args.policy, seed=args.seed))
    print(write_dataset(args.data, seed=args.seed))


if __name__ == "__main__":
    main()

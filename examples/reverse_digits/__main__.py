"""``python -m streamrl.examples.reverse_digits``: build the demo policy and dataset if missing."""

from __future__ import annotations

import argparse

from streamrl.examples.reverse_digits.assets import build_policy, write_dataset


def main() -> None:
    parser = argparse.ArgumentParser(
        description="build the demo policy and dataset where they are missing"
    )
    parser.add_argument("--policy", default="runs/demo-policy")
    parser.add_argument("--data", default="runs/demo-data/train.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(build_policy(args.policy, seed=args.seed))
    print(write_dataset(args.data, seed=args.seed))


if __name__ == "__main__":
    main()

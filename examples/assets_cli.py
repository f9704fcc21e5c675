"""The command line every example task's ``__main__`` runs: build its policy and dataset where
they are missing."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def build_assets(
    task: str, build_policy: Callable, write_dataset: Callable, policy: str, data: str
) -> None:
    parser = argparse.ArgumentParser(
        description=f"build the {task} policy and dataset where they are missing"
    )
    parser.add_argument("--policy", default=policy)
    parser.add_argument("--data", default=data)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(build_policy(args.policy, seed=args.seed))
    print(write_dataset(args.data, seed=args.seed))

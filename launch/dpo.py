"""``streamrl dpo --config dpo_cpu [key=value ...]``: DPO (sigmoid or IPO) on the learner."""

from __future__ import annotations

import sys

from streamrl.launch.supervised import main as supervised_main


def main(argv: list[str] | None = None) -> int:
    from streamrl.learner.dpo import DPO

    return supervised_main(DPO, argv)


if __name__ == "__main__":
    sys.exit(main())

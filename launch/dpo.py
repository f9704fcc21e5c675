"""``streamrl dpo --config dpo_cpu [key=value ...]``: DPO (sigmoid or IPO) on the learner."""

from __future__ import annotations

import sys

from streamrl.launch.supervised import main as supervised_main


def _objective():
    from streamrl.learner.dpo import DPO

    return DPO


def main(argv: list[str] | None = None) -> int:
    return supervised_main("dpo", _objective, argv)


if __name__ == "__main__":
    sys.exit(main())

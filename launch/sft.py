"""``streamrl sft --config sft_cpu [key=value ...]``: supervised fine-tuning on the learner."""

from __future__ import annotations

import sys

from streamrl.launch.supervised import main as supervised_main


def _objective():
    from streamrl.learner.sft import SFT

    return SFT


def main(argv: list[str] | None = None) -> int:
    return supervised_main("sft", _objective, argv)


if __name__ == "__main__":
    sys.exit(main())

"""The tail every benchmark command shares: the command line it quotes and the section it writes."""

from __future__ import annotations

import sys
from pathlib import Path


def command_line(module: str, argv: list[str] | None) -> str:
    """``python -m <module> <args>`` as typed, an argument with a space in quotes."""
    args = argv if argv is not None else sys.argv[1:]
    return " ".join([f"python -m {module}", *(f'"{a}"' if " " in a else a for a in args)])


def publish(section: Path, text: str) -> None:
    """Write the Markdown section (the page is assembled from these files) and show it."""
    section.parent.mkdir(parents=True, exist_ok=True)
    section.write_text(text)
    print(text)


def gpu_name() -> str:
    """The CUDA device's name, or "no CUDA device": what a result measured on a GPU says it ran on."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"

"""`make bench`: run every component benchmark in one process and write docs/benchmarks.md.

    python -m bench [--quick] [--only broker,learner,...]

Each ``bench/<part>.py`` exposes ``run(quick: bool) -> str`` returning a
Markdown section. Targets are reported as measured ratios against a baseline
taken in the same run (these machines are shared and noisy), never asserted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
from pathlib import Path

import torch

PARTS = [
    "broker",
    "learner",
    "learner_cost",
    "sft",
    "weightsync",
    "shm_checksum",
    "actors",
    "dashboards",
    "reference_loop",
    "system",
    "projection",
    "chaos",
]
# Sections of the page written by other commands, placed after the part they follow: `make
# bench-vllm` (the vLLM venv) writes engines, `python -m bench.variants` (an hour or more of runs)
# variants, `python -m bench.staleness` (half an hour) staleness, `python -m bench.pinned` (a
# 16-core host) pinned, `python -m bench.longtail` (hours of runs) longtail, `python -m
# bench.multiturn` (10 min a seed) multiturn, mutation holds `make mutate`'s reading, by hand,
# `python -m bench.cpu_placement` and `python -m bench.startup` (whole demo launches) cpu_placement
# and startup, and `python -m bench.gpu` (a lent GPU host) gpu; learner_mfu says, by hand, what
# the step rows' tokens/s and MFU count. Any other docs/bench/*.md goes at the end: the page
# drops no section.
PAGE = [
    *PARTS[: PARTS.index("learner") + 1],
    "learner_mfu",
    *PARTS[PARTS.index("learner") + 1 : PARTS.index("actors") + 1],
    "engines",
    *PARTS[PARTS.index("actors") + 1 : PARTS.index("system") + 1],
    "variants",
    "staleness",
    "pinned",
    "longtail",
    "multiturn",
    *PARTS[PARTS.index("system") + 1 :],
    "mutation",
    "cpu_placement",
    "gpu",
    "startup",
]
OUT = Path("docs/benchmarks.md")
PART_DIR = Path("docs/bench")


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    PART_DIR.mkdir(parents=True, exist_ok=True)
    # the presets the parts launch load what is at their paths (streamrl example makes them)
    from streamrl.examples.assets_cli import example_targets, make

    for name in ("demo", "longtail"):
        make(example_targets(name, None, None))
    for part in args.only.split(","):
        module = importlib.import_module(f"bench.{part}")
        started = time.monotonic()
        print(f"== {part}", flush=True)
        section = module.run(quick=args.quick)
        (PART_DIR / f"{part}.md").write_text(section.rstrip() + "\n")
        print(section, flush=True)
        print(f"== {part} took {time.monotonic() - started:.0f} s", flush=True)
    write_page()
    print(f"wrote {OUT}")
    return 0


def write_page() -> None:
    """docs/benchmarks.md = header + every section in docs/bench/<part>.md, in PAGE order."""
    files = sorted(PART_DIR.glob("*.md"), key=lambda f: ((PAGE + [f.stem]).index(f.stem), f.stem))
    sections = [f.read_text() for f in files]
    header = (
        "# Benchmarks\n\n"
        f"Produced by `make bench` (`python -m bench`); page assembled {time.strftime('%Y-%m-%d')} on {machine()}.\n"
        "The vLLM engines section comes from `make bench-vllm` and the mutation score from `make mutate`.\n"
        "Each section states its own date and command; ratios are measured within one run.\n"
        "Targets are goals to read against, not assertions.\n\n"
    )
    OUT.write_text(header + "\n".join(sections))


if __name__ == "__main__":
    sys.exit(main())

"""Variants of the demo preset against the one-process reference loop, seed by seed, back to back.

    python -m bench.variants --seeds 0,1,2 --cap-s 330 \\
        "reference on the learner=algo.reference_on=learner" "preset=" \\
        "pi_prox behaviour=algo.proximal=behaviour"

Each VARIANT is ``label=override[,override...]`` (nothing after ``=``: the preset itself). Per
seed, every variant runs as the real system of ``make run`` (``bench.system.run_streamrl``:
learner + 2 actors on the seed's warmed policy, built beforehand; stopped at the preset's target
or at the cap), then the reference loop at the preset's point (``bench.system.run_loop_outcome``).
Every finished run is saved under runs/bench-system/outcomes; ``--reuse`` reads those instead of
running again. Writes docs/bench/variants.md: time from launch to the target per seed and
variant, with samples/s, and each variant's median time over the reference loop's.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from pathlib import Path

from bench import system
from bench.cli import command_line, publish

SECTION = Path("docs/bench/variants.md")
ACTORS = 2


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"label=a.b=1,c.d=x"`` -> ``("label", ["a.b=1", "c.d=x"])``; ``"label="`` is the preset."""
    label, sep, overrides = text.partition("=")
    if not sep or not label.strip():
        raise argparse.ArgumentTypeError(f"expected label=override[,override...], got {text!r}")
    return label.strip(), [o.strip() for o in overrides.split(",") if o.strip()]


def _cell(outcome: system.Outcome) -> str:
    ttt = outcome.time_to_target_s
    if ttt is None:
        reward, exact = outcome.reached
        return f"not in {outcome.cap_s:.0f} s ({reward:.2f} / {exact:.2f})"
    return f"{ttt:.0f} s, {outcome.samples_per_s:.0f} samples/s"


def _median_ratio(outcomes: list[system.Outcome], reference: list[system.Outcome]) -> str:
    num, den = system.median_ttt(outcomes), system.median_ttt(reference)
    if math.isinf(num) or math.isinf(den):
        return "n/a (missed the target on more than half the seeds)"
    return f"{num / den:.2f}×"


def table(results: dict[str, list[system.Outcome]], reference: list[system.Outcome]) -> list[str]:
    """Per seed, each column's time to the target; last row, each column's median over the loop's."""
    labels = list(results)
    seeds = [o.seed for o in reference]
    header = "| seed | " + " | ".join(labels) + " | reference loop |"
    rows = [
        f"| {seed} | "
        + " | ".join(_cell(results[label][i]) for label in labels)
        + f" | {_cell(reference[i])} |"
        for i, seed in enumerate(seeds)
    ]
    ratios = (
        "| median / reference loop | "
        + " | ".join(_median_ratio(results[label], reference) for label in labels)
        + " | 1.00× |"
    )
    return [header, "|---|" + "---|" * (len(labels) + 1), *rows, ratios]


TIME_TO_TARGET = (
    "Time from launch to the target (20-step means of reward ≥ 0.95 and exact match ≥ 0.85); "
    "a run that missed it shows the reward / exact match of its last 20 steps. samples/s: "
    "completions trained per second after the first step."
)


def section(
    results: dict[str, list[system.Outcome]], reference: list[system.Outcome], command: str
) -> str:
    return "\n".join(
        [
            "## Variants of the demo preset vs the reference loop",
            "",
            f"{datetime.date.today()} · {system.machine()} · `{command}`",
            "",
            f"{TIME_TO_TARGET} Each seed's runs back to back.",
            "",
            *table(results, reference),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", type=parse_variant, metavar="VARIANT")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--cap-s", type=float, default=330.0, help="time cap of one run (seconds)")
    parser.add_argument("--reuse", action="store_true", help="read saved runs instead")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[system.Outcome]] = {label: [] for label, _ in args.variants}
    reference: list[system.Outcome] = []
    for seed in seeds:
        for label, overrides in args.variants:
            outcome = system.run_streamrl(
                label, seed, overrides, ACTORS, args.cap_s, True, args.reuse
            )
            results[label].append(outcome)
        reference.append(
            system.run_loop_outcome(
                system.REFERENCE, seed, system.preset_point(), args.cap_s, args.reuse
            )
        )
    publish(SECTION, section(results, reference, command_line("bench.variants", argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

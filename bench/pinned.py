"""streamrl against the reference loop on a many-core host, every run on cores of its own.

    python -m bench.pinned --seeds 0,1,2,3 --cap-s 300
    python -m bench.pinned --seeds 0,1 --actors 4 --cores-per-run 6 learner.ranks=2

Per seed, all at the same time: the system of ``make run`` (learner + ``--actors`` actors on the
seed's warmed policy, config overrides after the options, ``bench.system.run_streamrl``) on
``--cores-per-run`` cores of its own, and the
reference loop at the preset's point (``bench.system.run_loop_outcome``) on one core of its own.
CUDA is hidden from both, so both run on the CPU. It needs seeds × (cores per run + 1) cores: 16
for four seeds. This is what a 2-core machine cannot measure: whether the system beats the loop
once the learner, the actors and the loop never share a core. Writes docs/bench/pinned.md: time
to the target per seed, and the learner's median step and wait for data (a learner that never
waits is the bottleneck).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
from functools import partial
from pathlib import Path

from bench import system
from bench.cli import command_line, publish
from bench.variants import TIME_TO_TARGET, table

SECTION = Path("docs/bench/pinned.md")
STREAMRL = "streamrl"
LOOP = "loop"


def core_plan(
    seeds: list[int], cores: list[int], per_run: int
) -> list[tuple[int, list[int], list[int]]]:
    """(seed, streamrl's cores, the loop's core) per seed: the systems' blocks first, then one
    core per loop, so no two runs share a core."""
    need = len(seeds) * (per_run + 1)
    if need > len(cores):
        raise ValueError(
            f"{len(seeds)} seed(s) at {per_run} + 1 cores each need {need} cores; "
            f"this process may use {len(cores)}"
        )
    loops = cores[len(seeds) * per_run :]
    return [
        (seed, cores[i * per_run : (i + 1) * per_run], [loops[i]]) for i, seed in enumerate(seeds)
    ]


def outcome_path(kind: str, seed: int, cap_s: float) -> Path:
    return system.ROOT / "outcomes" / f"pinned-{kind}-s{seed}-cap{cap_s:g}.json"


def run_child(kind: str, seed: int, cap_s: float, actors: int, overrides: list[str]) -> None:
    if kind == STREAMRL:
        outcome = system.run_streamrl("pinned", seed, overrides, actors, cap_s, True)
    else:
        outcome = system.run_loop_outcome(system.REFERENCE, seed, system.preset_point(), cap_s)
    system.save_outcome(outcome, outcome_path(kind, seed, cap_s))


def learner_line(outcomes: list[system.Outcome]) -> str:
    """The learner's median step and wait for data over each run's steps."""
    cells = []
    for o in outcomes:
        steps = o.extra.get("steps", [])
        if not steps:
            cells.append(f"seed {o.seed}: no steps")
            continue
        step = statistics.median(s["step_s"] for s in steps)
        wait = statistics.median(s["wait_s"] for s in steps)
        cells.append(f"seed {o.seed}: step {step:.3f} s, wait {wait:.3f} s")
    return "Learner, medians over its steps: " + "; ".join(cells) + "."


def section(
    results: list[system.Outcome],
    reference: list[system.Outcome],
    per_run: int,
    actors: int,
    command: str,
) -> str:
    return "\n".join(
        [
            "## streamrl vs the reference loop, every run on cores of its own",
            "",
            f"{datetime.date.today()} · {system.machine()} · `{command}`",
            "",
            f"{TIME_TO_TARGET} All runs at once: streamrl (learner + {actors} actors) on "
            f"{per_run} cores of its own per seed, the loop on one core of its own per seed; "
            "CUDA hidden.",
            "",
            *table({f"streamrl ({per_run} cores)": results}, reference),
            "",
            learner_line(results),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds")
    parser.add_argument("--cap-s", type=float, default=300.0, help="time cap of one run (seconds)")
    parser.add_argument("--actors", type=int, default=2, help="actor processes of one streamrl run")
    parser.add_argument("--cores-per-run", type=int, default=3, help="cores of one streamrl run")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args.child[0], int(args.child[1]), args.cap_s, args.actors, args.overrides)
        return 0
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        plan = core_plan(seeds, sorted(os.sched_getaffinity(0)), args.cores_per_run)
    except ValueError as exc:
        parser.error(str(exc))
    for seed in seeds:
        # the warmed policies are built before the clock starts, one at a time
        system.seed_inputs(seed)
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    procs = []
    for seed, streamrl_cores, loop_cores in plan:
        for kind, cores in ((STREAMRL, streamrl_cores), (LOOP, loop_cores)):
            argv_child = [
                *("--child", kind, str(seed), "--cap-s", f"{args.cap_s:g}"),
                *("--actors", str(args.actors), *args.overrides),
            ]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.pinned", *argv_child],
                    env=env,
                    preexec_fn=partial(os.sched_setaffinity, 0, cores),
                )
            )
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
        return 1
    results = [system.load_outcome(outcome_path(STREAMRL, s, args.cap_s)) for s in seeds]
    reference = [system.load_outcome(outcome_path(LOOP, s, args.cap_s)) for s in seeds]
    publish(
        SECTION,
        section(
            results,
            reference,
            args.cores_per_run,
            args.actors,
            command_line("bench.pinned", argv),
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
